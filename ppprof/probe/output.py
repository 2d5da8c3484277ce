"""samples.csv of a profile run: one row per timed request, every stage's latency and the bottleneck stage; appended
and flushed to disk as each probe completes, so that an interrupted or failed run keeps what it measured."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from ppprof.io import atomic_write, open_append
from ppprof.probe.synth import Probe
from ppprof.runfiles import stage_column


def samples_frame(probes: list[Probe], stage_ms: list[list[list[float]]], e2e_ms: list[list[float]]) -> pd.DataFrame:
    """stage_ms[probe][stage][request] and e2e_ms[probe][request] -> one row per timed request."""
    rows = []
    for p, probe in enumerate(probes):
        num_stages = len(stage_ms[p])
        for i, pr in enumerate(probe.requests):
            lat = [stage_ms[p][s][i] for s in range(num_stages)]
            row = {"probe": probe.index, "kind": probe.kind, "request": pr.rid, "prefix_len": pr.prefix_len,
                   "chunk_size": pr.chunk_size}
            row.update({stage_column(s): round(v, 4) for s, v in enumerate(lat)})
            row["latency_ms"] = round(e2e_ms[p][i], 4)
            row["slowest_stage"] = max(range(num_stages), key=lat.__getitem__)
            row["design_step"] = probe.design_step
            rows.append(row)
    return pd.DataFrame(rows)


def write_samples(path: Path, frame: pd.DataFrame) -> Path:
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def append_samples(path: Path, frame: pd.DataFrame) -> None:
    """Append one probe's rows to samples.csv (the header with the first) in one write, flushed to the disk; an
    OSError names the file and the cause (disk full, permission)."""
    text = frame.to_csv(index=False, header=not path.exists() or path.stat().st_size == 0)
    try:
        with open_append(path) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise OSError(e.errno, e.strerror or str(e), str(path)) from None


def complete_probes(path: Path, probes: list[Probe]) -> int:
    """How many probes, from the first, samples.csv holds whole (every request of the probe, in order): where an
    interrupted run resumes. Rows past them (a probe cut short) are dropped from the file, atomically."""
    if not path.is_file() or path.stat().st_size == 0:
        return 0
    frame = pd.read_csv(path)
    done, end = 0, 0
    for probe in probes:
        rows = frame.iloc[end:end + len(probe.requests)]
        if (len(rows) < len(probe.requests) or list(rows["probe"]) != [probe.index] * len(probe.requests)
                or list(rows["request"]) != [r.rid for r in probe.requests]):
            break
        done, end = done + 1, end + len(probe.requests)
    if end < len(frame):
        write_samples(path, frame.iloc[:end])
    return done

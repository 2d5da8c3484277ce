"""samples.csv of a profile run: one row per timed request, every stage's latency and the bottleneck stage; appended
and flushed to disk as each probe completes, so that an interrupted or failed run keeps what it measured. The file is a
checkpoint: rank 0 holds the rows it appends (`SamplesLog`) and hands them to the adaptive design and the fit; only
`--resume`, `ppprof fit` and `ppprof calibrate` read it back."""

from __future__ import annotations

import hashlib
import io
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from ppprof.fit.samples import Samples, checked_samples
from ppprof.io import atomic_write, open_append
from ppprof.probe.synth import Probe
from ppprof.runfiles import stage_column


def samples_frame(probes: list[Probe], stage_ms: list[list[list[float]]], e2e_ms: list[list[float]]) -> pd.DataFrame:
    """stage_ms[probe][stage][request] and e2e_ms[probe][request] -> one row per timed request."""
    rows = []
    for p, probe in enumerate(probes):
        pp_size = len(stage_ms[p])
        for i, pr in enumerate(probe.requests):
            lat = [stage_ms[p][s][i] for s in range(pp_size)]
            row = {
                "probe": probe.index,
                "kind": probe.kind,
                "request": pr.rid,
                "prefix_len": pr.prefix_len,
                "chunk_size": pr.chunk_size,
            }
            row.update({stage_column(s): round(v, 4) for s, v in enumerate(lat)})
            row["latency_ms"] = round(e2e_ms[p][i], 4)
            row["slowest_stage"] = max(range(pp_size), key=lat.__getitem__)
            row["design_step"] = probe.design_step
            rows.append(row)
    return pd.DataFrame(rows)


def write_samples(path: Path, frame: pd.DataFrame) -> Path:
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def append_samples(path: Path, frame: pd.DataFrame) -> str:
    """Append one probe's rows to samples.csv (the header with the first) in one write, flushed to the disk, and
    return the text written; an OSError names the file and the cause (disk full, permission)."""
    text = frame.to_csv(index=False, header=not path.exists() or path.stat().st_size == 0)
    try:
        with open_append(path) as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        raise OSError(e.errno, e.strerror or str(e), str(path)) from None
    return text


@dataclass(slots=True)
class SamplesLog:
    """Rank 0's samples.csv of a run, written probe by probe and held in memory: the rows appended (`frames`, a
    resumed run's earlier rows first) and the digest of every byte the file holds, so that the adaptive design and
    the fit read the rows from here and the file is never read back within the run."""

    path: Path
    frames: list[pd.DataFrame] = field(default_factory=list)
    digest: hashlib._Hash = field(default_factory=hashlib.sha256)

    @classmethod
    def resumed(cls, path: Path) -> SamplesLog:
        """The log of a resumed run: samples.csv's whole probes (complete_probes has cut it to them), read once."""
        log = cls(path)
        raw = path.read_bytes() if path.is_file() else b""
        if raw.strip():
            log.frames.append(pd.read_csv(io.BytesIO(raw)))
        log.digest.update(raw)
        return log

    def append(self, frame: pd.DataFrame) -> None:
        """One probe's rows: appended to the file (append_samples) and kept."""
        self.digest.update(append_samples(self.path, frame).encode())
        self.frames.append(frame)

    def frame(self) -> pd.DataFrame:
        """Every row so far, in file order."""
        return pd.concat(self.frames, ignore_index=True) if self.frames else pd.DataFrame()

    def samples(self) -> Samples:
        """The rows as the fit reads them (the checks and the digest of read_samples, on the rows held)."""
        return checked_samples(self.frame(), self.path, self.digest.hexdigest())


log = logging.getLogger("ppprof")


def whole_rows(path: Path) -> tuple[pd.DataFrame, int]:
    """samples.csv's rows up to the first that was cut (a kill while it was written: the file does not end in a
    newline, or a row lacks a field), and how many rows were cut off."""
    raw = path.read_bytes()
    kept = raw if raw.endswith(b"\n") else raw[: raw.rfind(b"\n") + 1]
    frame = pd.read_csv(io.BytesIO(kept)) if kept.strip() else pd.DataFrame()
    missing = frame.isna().any(axis=1).to_numpy()
    if not missing.any():
        return frame, int(kept != raw)
    end = int(missing.argmax())  # read again without the cut rows, so that each column keeps its own type
    return pd.read_csv(io.BytesIO(kept), nrows=end), len(frame) - end + (kept != raw)


def complete_probes(path: Path, probes: list[Probe]) -> int:
    """How many probes, from the first, samples.csv holds whole (every request of the probe, in order): where an
    interrupted run resumes. Rows past them (a probe cut short, a row cut mid-write) are dropped from the file,
    atomically, and a cut row is said in the log."""
    if not path.is_file() or path.stat().st_size == 0:
        return 0
    frame, num_cut = whole_rows(path)
    if num_cut:
        log.warning(
            "%s ended in a row cut while it was written (%d row%s without all fields): dropped before resuming",
            path,
            num_cut,
            "s" * (num_cut != 1),
        )
    if frame.empty:
        atomic_write(path, lambda tmp: tmp.write_text(""))
        return 0
    done, end = 0, 0
    for probe in probes:
        rows = frame.iloc[end : end + len(probe.requests)]
        if (
            len(rows) < len(probe.requests)
            or list(rows["probe"]) != [probe.index] * len(probe.requests)
            or list(rows["request"]) != [r.rid for r in probe.requests]
        ):
            break
        done, end = done + 1, end + len(probe.requests)
    if end < len(frame) or num_cut:
        write_samples(path, frame.iloc[:end])
    return done

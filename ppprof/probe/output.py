"""samples.csv of a profile run: one row per timed request, every stage's latency and the bottleneck stage."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ppprof.io import atomic_write
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
            row["bottleneck_stage"] = max(range(num_stages), key=lat.__getitem__)
            row["design_step"] = probe.design_step
            rows.append(row)
    return pd.DataFrame(rows)


def write_samples(path: Path, frame: pd.DataFrame) -> Path:
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))

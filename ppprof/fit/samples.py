"""Timed samples: reading `ppprof profile`'s samples.csv (+ run.json beside it) or any CSV with the three core columns.

Where per-stage columns `stage{i}_latency_ms` exist, the latency fitted is the bottleneck stage's: the stage
whose column has the largest total. `make_samples` synthesises them from known coefficients (tests, demos).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ppprof.io import atomic_write_json, atomic_write_text
from ppprof.policy.rule import LatencyModel
from ppprof.runfiles import RUN_FILE, RUN_SCHEMA_VERSION, SAMPLES_FILE, STAGE_COLUMN, stage_column

REQUIRED_COLUMNS = ("prefix_len", "chunk_len", "latency_ms")


@dataclass(slots=True)
class Samples:
    """One row per timed request, in file order."""

    prefix_len: np.ndarray  # (n,) int64
    chunk_len: np.ndarray  # (n,) int64
    latency_ms: np.ndarray  # (n,) float64, of the bottleneck stage where stage columns exist
    kind: np.ndarray | None  # (n,) str ("sweep" / "prefix") where the column exists
    stage_idx: int | None  # bottleneck stage, None without stage columns
    stage_totals_ms: list[float] | None
    path: Path
    sha256: str

    def __len__(self) -> int:
        return len(self.latency_ms)

    def subset(self, keep: np.ndarray) -> "Samples":
        return Samples(self.prefix_len[keep], self.chunk_len[keep], self.latency_ms[keep],
                       None if self.kind is None else self.kind[keep], self.stage_idx, self.stage_totals_ms,
                       self.path, self.sha256)


def read_samples(path: str | Path) -> Samples:
    """Read and check a samples CSV; raise ValueError naming the file, column and row on bad input."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"samples file {path} does not exist: pass the samples.csv written by `ppprof profile`")
    try:
        raw = path.read_bytes()
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
        raise ValueError(f"samples file {path} is not a readable CSV ({str(e).splitlines()[0]})") from None
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(f"samples file {path} lacks column(s) {', '.join(missing)}: it needs "
                         f"{', '.join(REQUIRED_COLUMNS)}")
    if len(frame) == 0:
        raise ValueError(f"samples file {path} has no rows: profile first")
    stage_cols = sorted((int(m.group(1)), c) for c in frame.columns if (m := STAGE_COLUMN.match(str(c))))
    numeric = {}
    for col in list(REQUIRED_COLUMNS) + [c for _, c in stage_cols]:
        values = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=float)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise ValueError(f"samples file {path} column {col} row {bad[0] + 1} is {frame[col].iloc[bad[0]]!r}: "
                             f"use a finite number")
        numeric[col] = values
    for col, low in (("prefix_len", 0), ("chunk_len", 1)):
        v = numeric[col]
        bad = np.flatnonzero((v != np.round(v)) | (v < low))
        if bad.size:
            raise ValueError(f"samples file {path} column {col} row {bad[0] + 1} is {v[bad[0]]!r}: "
                             f"use an integer >= {low}")
    stage_idx, totals = None, None
    latency = numeric["latency_ms"]
    if stage_cols:
        totals = [float(numeric[c].sum()) for _, c in stage_cols]
        pick = int(np.argmax(totals))
        stage_idx = stage_cols[pick][0]
        latency = numeric[stage_cols[pick][1]]
    bad = np.flatnonzero(latency <= 0)
    if bad.size:
        raise ValueError(f"samples file {path} row {bad[0] + 1} has latency {latency[bad[0]]!r} ms: "
                         f"latencies must be positive")
    kind = frame["kind"].astype(str).to_numpy() if "kind" in frame.columns else None
    return Samples(numeric["prefix_len"].astype(np.int64), numeric["chunk_len"].astype(np.int64), latency, kind,
                   stage_idx, totals, path, hashlib.sha256(raw).hexdigest())


def read_run(samples_path: str | Path) -> dict | None:
    """run.json beside the samples, or None where there is none."""
    path = Path(samples_path).parent / RUN_FILE
    if not path.is_file():
        return None
    try:
        run = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"run file {path} is not readable JSON ({e}): fix or remove it") from None
    if not isinstance(run, dict) or run.get("schema_version") != RUN_SCHEMA_VERSION:
        version = run.get("schema_version") if isinstance(run, dict) else None
        raise ValueError(f"run file {path} has schema_version {version!r}: this ppprof reads {RUN_SCHEMA_VERSION}")
    if not isinstance(run.get("config"), dict):
        raise ValueError(f"run file {path} lacks its 'config' object: regenerate it with `ppprof profile`")
    return run


def provenance(run: dict | None, samples: Samples) -> dict:
    """Where a policy's numbers come from; None for what a plain CSV cannot tell."""
    run = run or {}
    config = run.get("config") or {}
    return {
        "model": config.get("model"),
        "hardware": run.get("hardware"),
        "backend": run.get("backend"),
        "world_size": run.get("world_size"),
        "layer_partition": run.get("layer_partition"),
        "torch_version": run.get("torch_version"),
        "git_revision": run.get("git_revision"),
        "samples": str(samples.path),
        "samples_sha256": samples.sha256,
        "bottleneck_stage": samples.stage_idx,
    }


def sweep_sizes(base_chunk_size: int, num_requests: int = 128) -> list[int]:
    """SGLang's profile sizes: falling linearly from 1.25 B by (1.25 B // num_requests)."""
    top = int(1.25 * base_chunk_size)
    return [top - i * (top // num_requests) for i in range(num_requests)]


def make_samples(model: LatencyModel, *, base_chunk_size: int, prefixes=(), chunk_sizes=(), repeats: int = 4,
                 noise: float = 0.02, num_outliers: int = 0, num_stages: int = 2, bottleneck_stage: int = 0,
                 seed: int = 0) -> pd.DataFrame:
    """One sweep probe (prefix 0, SGLang's sizes) and, for each prefix, `repeats` requests of each chunk size.

    Latency = model.chunk_latency_ms(prefix_len, chunk_len) x (1 + noise N(0,1)) (for the quadratic, a prefixed row
    costs c + f(L + x) - f(L), a prefix-free one f(x)); `num_outliers` rows are multiplied by 3. The bottleneck
    stage carries that latency, the other stages 60% of it.
    """
    rng = np.random.default_rng(seed)
    rows = [(0, "sweep", i, 0, x) for i, x in enumerate(sweep_sizes(base_chunk_size))]
    for probe, prefix in enumerate(prefixes, start=1):
        request = 0
        for x in chunk_sizes:
            for _ in range(repeats):
                rows.append((probe, "prefix", request, prefix, x))
                request += 1
    frame = pd.DataFrame(rows, columns=["probe", "kind", "request", "prefix_len", "chunk_len"])
    latency = model.chunk_latency_ms(frame.prefix_len, frame.chunk_len) * (1 + noise * rng.standard_normal(len(frame)))
    if num_outliers:
        hit = rng.choice(np.arange(1, len(frame)), size=num_outliers, replace=False)
        latency[hit] *= 3.0
    for stage in range(num_stages):
        frame[stage_column(stage)] = latency * (1.0 if stage == bottleneck_stage else 0.6)
    frame["latency_ms"] = latency * (1.0 + 0.6 * (num_stages - 1))
    frame["bottleneck_stage"] = bottleneck_stage
    return frame


def write_run_dir(run_dir: str | Path, frame: pd.DataFrame, *, base_chunk_size: int, page_size: int = 64,
                  context_len: int = 131072, num_layers: int = 4, world_size: int = 2) -> Path:
    """Write samples.csv and a run.json like `ppprof profile` does; return the samples path."""
    run_dir = Path(run_dir)
    samples = atomic_write_text(run_dir / SAMPLES_FILE, frame.to_csv(index=False))
    atomic_write_json(run_dir / RUN_FILE, {
        "schema_version": RUN_SCHEMA_VERSION,
        "config": {"model": "synthetic", "base_chunk_size": base_chunk_size, "page_size": page_size,
                   "context_len": context_len, "requests_per_probe": 128, "num_layers": num_layers, "seed": 0},
        "hardware": {"device": "cpu", "device_name": "synthetic"},
        "torch_version": "synthetic", "backend": "gloo", "world_size": world_size,
        "layer_partition": [num_layers // world_size] * world_size, "git_revision": None,
        "profile_wall_s": 0.0, "forward_tokens": int(frame.prefix_len.sum() + frame.chunk_len.sum()),
    })
    return samples

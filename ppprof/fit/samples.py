"""Timed samples: reading `ppprof profile`'s samples.csv (+ run.json beside it) or any CSV with the three core columns.

Where per-stage columns `stage{i}_latency_ms` exist, the latency fitted is the bottleneck stage's: the stage
whose column has the largest total (`bottleneck_stage`). Synthetic samples: ppprof.fit.synthetic.
"""

from __future__ import annotations

import csv
import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ppprof.bounds import MAX_TOKENS
from ppprof.io import special_kind
from ppprof.runfiles import STAGE_COLUMN, RunFolder

REQUIRED_COLUMNS = ("prefix_len", "chunk_size", "latency_ms")
COLUMN_ALIASES = {"chunk_len": "chunk_size"}  # the name in samples written by ppprof 0.1 and other tools


@dataclass(frozen=True, slots=True)
class Samples:
    """One row per timed request, in file order (read from a file, or held by the profile that appends it)."""

    prefix_len: np.ndarray  # (n,) int64
    chunk_size: np.ndarray  # (n,) int64
    chunk_latency_ms: (
        np.ndarray
    )  # (n,) float64: the bottleneck stage's column where stage columns exist, else latency_ms
    kind: np.ndarray | None  # (n,) str ("sweep" / "prefix") where the column exists
    bottleneck_stage: int | None  # the stage with the largest total latency, None without stage columns
    stage_totals_ms: list[float] | None
    path: Path
    sha256: str
    probe: np.ndarray | None = None  # (n,) int: the probe of each row where the column exists (ppprof profile's)

    def __len__(self) -> int:
        return len(self.chunk_latency_ms)

    def subset(self, keep: np.ndarray) -> Samples:
        """The rows selected by `keep` (a mask or indices), with the same file facts."""
        return Samples(
            self.prefix_len[keep],
            self.chunk_size[keep],
            self.chunk_latency_ms[keep],
            None if self.kind is None else self.kind[keep],
            self.bottleneck_stage,
            self.stage_totals_ms,
            self.path,
            self.sha256,
            None if self.probe is None else self.probe[keep],
        )


def read_samples(path: str | Path) -> Samples:
    """Read and check a samples CSV; raise ValueError naming the file, column and row on bad input.

    Aliases (COLUMN_ALIASES): a `chunk_len` column (samples written by ppprof 0.1 and other tools) is read as
    `chunk_size`; where both exist, `chunk_size` wins.
    """
    path = Path(path)
    raw, frame = read_frame(path)
    return checked_samples(frame, path, hashlib.sha256(raw).hexdigest())


def checked_samples(frame: pd.DataFrame, path: Path, sha256: str) -> Samples:
    """The Samples of `frame`'s rows (samples.csv's columns, every required one present), checked as read_samples
    checks a file: ValueError naming `path`, the column and the row. `sha256`: the digest of the file's bytes (a
    profile's rank 0 hashes what it appends, and hands the rows it holds to the fit: no file read back)."""
    stage_cols = sorted((int(m.group(1)), c) for c in frame.columns if (m := STAGE_COLUMN.match(str(c))))
    numeric = numeric_columns(path, frame, list(REQUIRED_COLUMNS) + [c for _, c in stage_cols])
    for col, low in (("prefix_len", 0), ("chunk_size", 1)):
        v = numeric[col]
        bad = np.flatnonzero((v != np.round(v)) | (v < low) | (v > MAX_TOKENS))  # before any cast to int64
        if bad.size:
            raise ValueError(
                f"samples file {path} column {col} row {bad[0] + 1} is {float(v[bad[0]])!r}: "
                f"use an integer in {low}..{MAX_TOKENS}"
            )
    for col in ["latency_ms"] + [c for _, c in stage_cols]:
        check_latencies(path, col, numeric[col], numeric["chunk_size"])
    bottleneck_stage, totals, latency = None, None, numeric["latency_ms"]
    if stage_cols:
        totals = [float(numeric[c].sum()) for _, c in stage_cols]
        pick = int(np.argmax(totals))
        bottleneck_stage, latency = stage_cols[pick][0], numeric[stage_cols[pick][1]]
    for col in ["latency_ms"] + [c for _, c in stage_cols]:
        bad = np.flatnonzero(numeric[col] <= 0)
        if bad.size:
            raise ValueError(
                f"samples file {path} column {col} row {bad[0] + 1} has latency "
                f"{float(numeric[col][bad[0]])!r} ms: latencies must be positive"
            )
    kind = frame["kind"].astype(str).to_numpy() if "kind" in frame.columns else None
    probe = pd.to_numeric(frame["probe"], errors="coerce").to_numpy() if "probe" in frame.columns else None
    return Samples(
        numeric["prefix_len"].astype(np.int64),
        numeric["chunk_size"].astype(np.int64),
        latency,
        kind,
        bottleneck_stage,
        totals,
        path,
        sha256,
        probe,
    )


ABSURD_RATIO = 1000.0
"""A latency this many times above (or below) the median of the rows at nearby chunk sizes is not a measurement."""
MIN_NEIGHBOURS = 3


def check_latencies(path: Path, col: str, latency: np.ndarray, chunk_size: np.ndarray) -> None:
    """ValueError naming the first positive latency of `col` that is ABSURD_RATIO times above or below the median
    latency of the rows at nearby chunk sizes (the same power-of-two band of chunk_size and the bands either side;
    MIN_NEIGHBOURS rows at least, the row itself included, so that one absurd row cannot move the median): one such
    row (1e300 ms) would otherwise pick the bottleneck stage and drag the fit."""
    ok = latency > 0  # a non-positive latency is reported as such, after this check
    if ok.sum() < MIN_NEIGHBOURS:
        return
    band = np.floor(np.log2(np.maximum(chunk_size, 1))).astype(np.int64)
    for b in np.unique(band[ok]):
        near = ok & (np.abs(band - b) <= 1)
        if near.sum() < MIN_NEIGHBOURS:
            continue
        median = float(np.median(latency[near]))
        rows = np.flatnonzero(
            ok & (band == b) & ((latency > ABSURD_RATIO * median) | (latency * ABSURD_RATIO < median))
        )
        if rows.size:
            r = int(rows[0])
            lo, hi = int(chunk_size[near].min()), int(chunk_size[near].max())
            raise ValueError(
                f"samples file {path} column {col} row {r + 1} has latency {float(latency[r])!r} ms, "
                f"{latency[r] / median:.3g}x the median {median:.4g} ms of the {int(near.sum())} rows "
                f"at chunk sizes {lo}-{hi}: not a measurement; remove or re-measure that row"
            )


def read_frame(path: Path) -> tuple[bytes, pd.DataFrame]:
    """The file's bytes and its rows, aliased columns renamed, with every required column and at least one row."""
    if not path.exists():
        raise ValueError(f"samples file {path} does not exist: pass the samples.csv written by `ppprof profile`")
    if not path.is_file():
        raise ValueError(
            f"samples file {path} is {special_kind(path.stat().st_mode)}, not a file: pass the samples.csv "
            "written by `ppprof profile`"
        )
    try:
        raw = path.read_bytes()
        frame = pd.read_csv(io.BytesIO(raw))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
        raise ValueError(f"samples file {path} is not a readable CSV ({str(e).splitlines()[0]})") from None
    header = next(csv.reader([raw.split(b"\n", 1)[0].decode("utf-8", errors="replace")]), [])
    repeated = sorted({c.strip() for c in header if [h.strip() for h in header].count(c.strip()) > 1})
    if repeated:  # pandas would read the second as `name.1`, silently
        raise ValueError(f"samples file {path} has column(s) {', '.join(repeated)} more than once: keep one of each")
    frame = frame.rename(
        columns={
            alias: name
            for alias, name in COLUMN_ALIASES.items()
            if alias in frame.columns and name not in frame.columns
        }
    )
    if not raw.endswith(b"\n") and len(frame) and frame.iloc[-1].isna().any():
        raise ValueError(
            f"samples file {path} ends mid-row (row {len(frame)} lacks fields: a run stopped while it "
            f"wrote it): finish the run with `ppprof profile --resume {path.parent}`, or delete that "
            "last line"
        )
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise ValueError(
            f"samples file {path} lacks column(s) {', '.join(missing)}: it needs {', '.join(REQUIRED_COLUMNS)}"
        )
    if len(frame) == 0:
        raise ValueError(f"samples file {path} has no rows: profile first")
    return raw, frame


def numeric_columns(
    path: Path, frame: pd.DataFrame, columns: list[str], what: str = "samples file"
) -> dict[str, np.ndarray]:
    """Each column as float64; ValueError naming `what`, the file and the first row that is not a finite number."""
    numeric = {}
    for col in columns:
        values = pd.to_numeric(frame[col], errors="coerce").to_numpy(dtype=float)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            value = frame[col].iloc[bad[0]]
            value = value.item() if hasattr(value, "item") else value  # 'nan', not np.float64(nan)
            raise ValueError(f"{what} {path} column {col} row {bad[0] + 1} is {value!r}: use a finite number")
        numeric[col] = values
    return numeric


def read_run(samples_path: str | Path) -> dict | None:
    """run.json beside the samples, or None where there is none."""
    return RunFolder.of(samples_path).read_run()


def provenance(run: dict | None, samples: Samples) -> dict:
    """Where a policy's numbers come from; None for what a plain CSV cannot tell."""
    run = run or {}
    config = run.get("config") or {}
    return {
        "model": config.get("model"),
        "hardware": run.get("hardware"),
        "dist_backend": run.get("dist_backend"),
        "attention_kernel": run.get("attention_kernel"),
        "mamba_kernel": run.get("mamba_kernel"),
        "torch_threads": run.get("torch_threads"),
        "pp_size": run.get("pp_size", run.get("world_size")),  # the stages (an older run.json: its world_size)
        "tp_size": run.get("tp_size", 1),
        "layer_partition": run.get("layer_partition"),
        "model_shape": model_shape(run.get("model")),
        "torch_version": run.get("torch_version"),
        "git_revision": run.get("git_revision"),
        "samples": str(samples.path),
        "samples_sha256": samples.sha256,
        "bottleneck_stage": samples.bottleneck_stage,
    }


def model_shape(model: dict | None) -> dict | None:
    """The shapes a server checks a policy against (ppprof.sglang.match): run.json's model spec reduced to its HF
    model_type (ppprof's family) and the sizes of its profiled layers; a size the model lacks (the heads of an
    attention-free model) is None. None without a spec (a plain CSV)."""
    if not isinstance(model, dict) or not isinstance(model.get("layers"), list):
        return None

    def size(key):
        value = model.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None

    return {
        "model_type": model.get("family"),
        "hidden_size": size("hidden_size"),
        "num_hidden_layers": len(model["layers"]),
        "num_attention_heads": size("num_attention_heads"),
        "num_key_value_heads": size("num_key_value_heads"),
        "head_dim": size("head_dim"),
    }

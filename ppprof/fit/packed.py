"""How a latency model prices packed forwards: packed.csv's rows (beside the samples, written by the profile's packed
phase, ppprof.probe.packed), each forward predicted by the additive form on the fitted model, and the one term the
form needs where it misses by a consistent amount: a cost d for each piece beyond the first, or a scale s of the
pieces' variable latencies,

    packed(L_1..n, x_1..n) = c + s sum_i (t(L_i, x_i) - c) + d (n - 1)      (the additive form: s = 1, d = 0)

The rows never enter the fit, so every one is held out. Pure numpy and pandas: no torch."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ppprof.bounds import MAX_TOKENS
from ppprof.fit.samples import numeric_columns
from ppprof.policy.rule import LatencyModel
from ppprof.runfiles import STAGE_COLUMN

LIST_COLUMNS = ("prefix_lens", "chunk_sizes")
"""packed.csv's columns of one forward's pieces, space-separated, in packing order."""
SIGNIFICANCE = 2.0
"""A term is a consistent miss where it is this many standard errors from no term and lowers the median error."""
TERMS = ("extra_piece_ms", "variable_scale")
"""The terms the additive form may need, one at a time: d, ms for each piece beyond the first (what each piece costs
beyond its share, as kernel launches a piece would), and s, the scale of the pieces' variable latencies (what
packing saves or costs in proportion to the work, as larger matrix products over the packed tokens would)."""
NO_TERM = {"extra_piece_ms": 0.0, "variable_scale": 1.0}
"""The terms' values where the additive form holds."""
METHOD = (
    "each packed forward (packed.csv) predicted on the fitted model at the bottleneck stage as "
    "c + s sum_i (t(L_i, x_i) - c) + d (n - 1); the additive form (s 1, d 0) scored, then d and s each fitted "
    f"alone by least squares on relative error; the one with the lower median error kept where it is "
    f"{SIGNIFICANCE:g} standard errors from no term and lowers the median error; the rows are not in the fit: every "
    "one is held out"
)


@dataclass(frozen=True, slots=True)
class PackedRows:
    """packed.csv: each forward's pieces (prefix_len, chunk_size arrays) and each stage's latency of it (ms)."""

    prefix_lens: tuple[np.ndarray, ...]
    chunk_sizes: tuple[np.ndarray, ...]
    stage_ms: dict[int, np.ndarray]
    path: Path

    @property
    def pieces(self) -> np.ndarray:
        return np.array([len(x) for x in self.chunk_sizes])

    def latency_ms(self, stage: int | None) -> tuple[int, np.ndarray]:
        """(stage, its latencies): `stage` where its column exists, else the stage of the largest total."""
        if stage not in self.stage_ms:
            stage = max(self.stage_ms, key=lambda s: float(self.stage_ms[s].sum()))
        return stage, self.stage_ms[stage]


def read_packed(path: str | Path) -> PackedRows:
    """Read and check packed.csv; ValueError (one line) naming the file, column and row on bad input."""
    path = Path(path)
    try:
        frame = pd.read_csv(io.BytesIO(path.read_bytes()), dtype={c: str for c in LIST_COLUMNS})
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as e:
        raise ValueError(f"packed file {path} is not a readable CSV ({str(e).splitlines()[0]})") from None
    stages = sorted((int(m.group(1)), c) for c in frame.columns if (m := STAGE_COLUMN.match(str(c))))
    missing = [c for c in LIST_COLUMNS if c not in frame.columns] + ([] if stages else ["stage0_latency_ms"])
    if missing or frame.empty:
        raise ValueError(
            f"packed file {path} lacks {'column(s) ' + ', '.join(missing) if missing else 'rows'}: "
            "write it with `ppprof profile` (its packed forwards)"
        )
    lists = {c: [token_list(path, c, i, v) for i, v in enumerate(frame[c])] for c in LIST_COLUMNS}
    for i, (p, x) in enumerate(zip(*lists.values())):
        if len(p) != len(x) or not len(x) or x.min() < 1:
            raise ValueError(
                f"packed file {path} row {i + 1}: {len(p)} prefix lengths for {len(x)} chunk sizes: "
                "give one of each a piece, every chunk at least 1 token"
            )
    numeric = numeric_columns(path, frame, [c for _, c in stages], "packed file")
    for _, c in stages:
        bad = np.flatnonzero(numeric[c] <= 0)
        if bad.size:
            raise ValueError(f"packed file {path} column {c} row {bad[0] + 1}: latencies must be positive")
    return PackedRows(
        tuple(lists["prefix_lens"]), tuple(lists["chunk_sizes"]), {s: numeric[c] for s, c in stages}, path
    )


def token_list(path: Path, column: str, row: int, value) -> np.ndarray:
    """One field of token counts ("0 512 2048") as an int64 array; ValueError naming it otherwise."""
    try:
        out = np.array([int(v) for v in str(value).split()], dtype=np.int64)
    except ValueError:
        out = None
    if out is None or not len(out) or out.min() < 0 or out.max() > MAX_TOKENS:
        raise ValueError(
            f"packed file {path} column {column} row {row + 1} is {value!r}: give space-separated integers "
            f"in 0..{MAX_TOKENS}"
        )
    return out


def additive_ms(model: LatencyModel, rows: PackedRows) -> np.ndarray:
    """Each packed forward on `model`'s additive form: c + sum_i (t(L_i, x_i) - c)."""
    return np.array(
        [
            model.c + float(np.sum(model.chunk_latency_ms(L, x) - model.c))
            for L, x in zip(rows.prefix_lens, rows.chunk_sizes)
        ]
    )


def term_fit(predicted: np.ndarray, measured: np.ndarray, feature: np.ndarray) -> tuple[float, float]:
    """(theta, its standard error): the one term theta * feature added to the predictions that minimises
    sum(((predicted + theta f) - y) / y)^2, i.e. theta = sum(f r / y^2) / sum(f^2 / y^2) with r = y - predicted.
    (nan, nan) where the feature is 0 on every row."""
    f, y = feature.astype(float), measured
    weight = float(np.sum((f / y) ** 2))
    if weight == 0.0:
        return float("nan"), float("nan")
    theta = float(np.sum(f * (y - predicted) / y**2)) / weight
    resid = (predicted + theta * f - y) / y
    dof = max(len(y) - 1, 1)
    return theta, float(np.sqrt(float(resid @ resid) / dof / weight))


def errors(predicted: np.ndarray, measured: np.ndarray) -> dict:
    """The absolute relative errors' mean (MAPE), median and worst."""
    ape = np.abs(predicted / measured - 1.0)
    return {"mape": float(np.mean(ape)), "median_ape": float(np.median(ape)), "worst_ape": float(np.max(ape))}


def candidates(model: LatencyModel, rows: PackedRows, measured: np.ndarray) -> dict:
    """Each term of TERMS fitted alone to what the additive form misses: its value (d in ms; s, 1 + theta), standard
    error and errors; a term the rows cannot tell (no forward of two pieces) left out."""
    predicted = additive_ms(model, rows)
    features = {"extra_piece_ms": rows.pieces - 1.0, "variable_scale": predicted - model.c}
    out = {}
    for name in TERMS:
        theta, stderr = term_fit(predicted, measured, features[name])
        if np.isfinite(theta):
            value = NO_TERM[name] + theta
            out[name] = {"value": value, "stderr": stderr, **errors(predicted + theta * features[name], measured)}
    return out


def packed_forwards(model: LatencyModel, rows: PackedRows, stage: int | None) -> dict:
    """The policy's packed_forwards: how the additive form on `model` predicts the rows of `stage` (the bottleneck;
    where packed.csv lacks it, its own), each term fitted to its misses (candidates), and the terms a packed
    forward's price takes: the one kept (`term`), or none (d 0, s 1); `why` says which."""
    stage, measured = rows.latency_ms(stage)
    additive = errors(additive_ms(model, rows), measured)
    fitted = candidates(model, rows, measured)
    out = {
        "forwards": len(measured),
        "pieces": [int(rows.pieces.min()), int(rows.pieces.max())],
        "stage": int(stage),
        "additive": additive,
        "candidates": fitted,
        "term": None,
        **NO_TERM,
        "source": str(rows.path),
        "method": METHOD,
    }
    kept = {
        name: c
        for name, c in fitted.items()
        if abs(c["value"] - NO_TERM[name]) >= SIGNIFICANCE * c["stderr"]
        and c["median_ape"] < additive["median_ape"]
        and (name != "variable_scale" or c["value"] > 0)
    }
    if not kept:
        return out | {"why": "no term is a consistent miss: the additive form holds as well as any"}
    name = min(kept, key=lambda k: kept[k]["median_ape"])
    value, stderr = kept[name]["value"], kept[name]["stderr"]
    return out | {"term": name, name: value, "why": f"{name} {value:.4g} +- {stderr:.2g}: the lower median error"}

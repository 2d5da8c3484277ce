"""How a latency model prices packed forwards: packed.csv's rows (beside the samples, written by the profile's packed
phase, ppprof.probe.packed), each forward predicted by the additive form on the fitted model (and on the probes' own
latencies, to tell the form's miss from the model's), and the one term the form needs where it misses by a
consistent amount, a cost d for each piece beyond the first:

    packed(L_1..n, x_1..n) = c + sum_i (t(L_i, x_i) - c) + d (n - 1)      (the additive form: d = 0)

The rows never enter the fit, so every one is held out. Pure numpy and pandas: no torch."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ppprof.bounds import MAX_TOKENS
from ppprof.fit.samples import Samples, numeric_columns
from ppprof.policy.rule import LatencyModel
from ppprof.runfiles import STAGE_COLUMN

LIST_COLUMNS = ("prefix_lens", "chunk_sizes")
"""packed.csv's columns of one forward's pieces, space-separated, in packing order."""
SIGNIFICANCE = 2.0
"""d is a consistent miss where it is this many standard errors from 0 and lowers the median error."""
METHOD = (
    "each packed forward (packed.csv) predicted on the fitted model at the bottleneck stage as "
    "c + sum_i (t(L_i, x_i) - c) (and on the probes' median latency of each piece's cell, additive_on_probes); "
    "d, a cost for each piece beyond the first, fitted by least squares on relative error to what the additive form "
    f"misses, kept where it is positive, {SIGNIFICANCE:g} standard errors from 0 and lowers the median error; the "
    "rows are not in the fit: every one is held out"
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
    return checked_packed(frame, path)


def checked_packed(frame: pd.DataFrame, path: Path) -> PackedRows:
    """The PackedRows of packed.csv's rows (`frame`, its list columns as text), checked as read_packed checks the
    file: ValueError naming `path`, the column and the row. A profile hands the rows it writes to its fit."""
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
        counts = [int(v) for v in str(value).split()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 0 or max(counts) > MAX_TOKENS:
        raise ValueError(
            f"packed file {path} column {column} row {row + 1} is {value!r}: give space-separated integers "
            f"in 0..{MAX_TOKENS}"
        )
    return np.array(counts, dtype=np.int64)


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


def probes_additive_ms(c: float, rows: PackedRows, samples: Samples) -> np.ndarray | None:
    """Each packed forward's additive form on the probes' own latencies, c + sum_i (m(L_i, x_i) - c) with m the
    median of the samples of the piece's cell (prefix_len, chunk_size) and c the model's fixed cost: the additive
    form apart from the model's own error. None where a piece's cell has no sample."""
    median: dict[tuple[int, int], float] = {}
    frame = pd.DataFrame({"L": samples.prefix_len, "x": samples.chunk_size, "ms": samples.chunk_latency_ms})
    for (L, x), ms in frame.groupby(["L", "x"])["ms"]:
        median[(int(L), int(x))] = float(ms.median())
    out = []
    for lens, sizes in zip(rows.prefix_lens, rows.chunk_sizes):
        cells = [median.get((int(L), int(x))) for L, x in zip(lens, sizes)]
        if None in cells:
            return None
        out.append(c + sum(m - c for m in cells))
    return np.array(out)


def packed_forwards(model: LatencyModel, rows: PackedRows, stage: int | None, samples: Samples | None = None) -> dict:
    """The policy's packed_forwards: how the additive form on `model` predicts the rows of `stage` (the bottleneck;
    where packed.csv lacks it, its own) and, with the `samples` of that stage, on the probes' own latencies of the
    pieces' cells (`additive_on_probes`, where every piece's cell was probed); d fitted to the form's misses
    (`extra_piece`), and extra_piece_ms, the d a packed forward's price takes: d where it is a consistent cost, else
    0; `why` says which.

    A negative d is never taken: it would price a batch below the same batch without a short piece."""
    stage, measured = rows.latency_ms(stage)
    predicted = additive_ms(model, rows)
    additive = errors(predicted, measured)
    same_stage = samples is not None and samples.bottleneck_stage in (None, stage)
    on_probes = probes_additive_ms(model.c, rows, samples) if same_stage else None
    out = {
        "forwards": len(measured),
        "pieces": [int(rows.pieces.min()), int(rows.pieces.max())],
        "stage": int(stage),
        "additive": additive,
        **({} if on_probes is None else {"additive_on_probes": errors(on_probes, measured)}),
        "extra_piece_ms": 0.0,
        "source": str(rows.path),
        "method": METHOD,
    }
    extra = rows.pieces - 1.0
    d, stderr = term_fit(predicted, measured, extra)
    if not np.isfinite(d):
        return out | {"why": "no forward has two pieces"}
    fitted = {"ms": d, "stderr_ms": stderr, **errors(predicted + d * extra, measured)}
    out["extra_piece"] = fitted
    if abs(d) < SIGNIFICANCE * stderr or fitted["median_ape"] >= additive["median_ape"]:
        return out | {"why": f"d {d:.3g} +- {stderr:.2g} ms is no consistent miss: the additive form holds"}
    if d <= 0:
        return out | {"why": f"d {d:.3g} +- {stderr:.2g} ms is negative: packed forwards ran below the additive form"}
    return out | {"extra_piece_ms": d, "why": f"d {d:.3g} +- {stderr:.2g} ms a piece beyond the first"}

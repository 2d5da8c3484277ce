"""The calibration: how the bottleneck stage's forwards in the profile's own pipelined runs (run.json
pipeline_overhead.runs[].stage_ms) compare with the latency model fitted on its lockstep probes.

A lockstep probe times each stage after it has waited through the others' forwards; in a running pipeline the
bottleneck stage's chunks follow each other. On CPU the probes run colder, and the gap moves from one run to the next
(the gap 0 to -4% on one day, -8 to -15% on another), which the fit's c and b carry into every prediction. What
goes cold is the work on the stage's weights, the linear part c + b x; the attention over the prefix (g L and the a,
h terms) reads K/V that the probe's set-up has just written. The calibration maps the fitted latency onto the
pipelined one,

    t_pipelined(L, x) = linear_scale * (c + b x) + (t(L, x) - c - b x) + shift_ms,

fitted by least squares on relative error over the median of each (chunk size, prefix) cell of the runs; the planning
model is then that plus the per-chunk overhead (LatencyModel.planning). Scaling the whole of t instead predicted the
committed tiny-dense bench's 32768-token arms 7-11% low: its attention ran as the probes said. Pure numpy: no
torch."""

from __future__ import annotations

import math

import numpy as np

from ppprof.policy.rule import NO_CALIBRATION, LatencyModel

METHOD = (
    "linear_scale * (c + b x) + (t(L, x) - c - b x) + shift_ms fitted (least squares on relative error) to "
    "the bottleneck stage's forwards in "
    "the profile's pipelined runs (run.json pipeline_overhead.runs[].stage_ms), the median of each cell "
    "(chunk size, prefix) over the repeats, each run's first chunk left out"
)
SCALE_RANGE = (0.5, 2.0)
"""A linear scale outside this range is not a shift of the whole stage but a broken run or a model that does not hold: not
applied."""
MIN_CHUNK_SIZES = 2
"""Distinct chunk sizes the cells need for the scale and the shift to be told apart."""


def none(why: str) -> dict:
    """No calibration (linear scale 1, shift 0), and why."""
    return NO_CALIBRATION | {"why": why}


def cells(runs: list[dict], stage: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prefix_len, chunk_size, median ms) of each (chunk size, prefix) cell of `stage` over the runs that recorded
    their stage times (a run's chunks: chunk_sizes, else num_chunks of chunk_size); a run's first chunk is left out
    (it starts cold after the barrier, once a prompt: not as the chunks that follow run)."""
    by_cell: dict[tuple[int, int], list[float]] = {}
    for r in runs:
        times = r.get("stage_ms") if isinstance(r, dict) else None
        if not isinstance(times, list) or stage >= len(times) or not isinstance(times[stage], list):
            continue
        sizes = r.get("chunk_sizes") or [int(r["chunk_size"])] * len(times[stage])
        starts = np.cumsum([0] + list(sizes[:-1]))
        for k, (x, L, ms) in enumerate(zip(sizes, starts, times[stage])):
            if k > 0 and isinstance(ms, (int, float)) and math.isfinite(ms) and ms > 0:
                by_cell.setdefault((int(x), int(L)), []).append(float(ms))
    keys = sorted(by_cell)
    prefix = np.array([L for _, L in keys], dtype=float)
    size = np.array([x for x, _ in keys], dtype=float)
    ms = np.array([float(np.median(by_cell[key])) for key in keys], dtype=float)
    return prefix, size, ms


def calibration_of(run: dict | None, model: LatencyModel | None, stage: int | None) -> dict:
    """The policy's calibration: linear_scale and shift_ms with their standard errors, the cells and the fit's
    relative residual, from the profile's pipelined runs; linear scale 1 and shift 0 (source none, and why) where the
    runs did not record their stage times, the cells cannot tell scale from shift, or the fit leaves the planning
    model unsound."""
    if model is None:
        return none("no latency model")
    stage = 0 if stage is None else int(stage)
    runs = (((run or {}).get("pipeline_overhead") or {}).get("runs")) or []
    prefix, size, ms = cells(runs, stage)
    if len(np.unique(size)) < MIN_CHUNK_SIZES:
        return none("the profile's pipelined runs recorded no stage times at two chunk sizes or more")
    fitted = np.asarray(model.chunk_latency_ms(prefix, size), dtype=float)
    if not np.all(fitted > 0):
        return none("the latency model is not positive at every cell of the pipelined runs")
    linear = model.c + model.b * size
    # Relative least squares: minimize sum((s lin + (t - lin) + shift - y) / t)^2, i.e. regress (y - t + lin) / t
    # on [lin / t, 1 / t].
    design = np.column_stack([linear / fitted, 1.0 / fitted])
    target = (ms - fitted + linear) / fitted
    coef, *_ = np.linalg.lstsq(design, target, rcond=None)
    scale, shift = float(coef[0]), float(coef[1])
    resid = target - design @ coef
    dof = max(len(target) - 2, 1)
    cov = float(resid @ resid) / dof * np.linalg.pinv(design.T @ design)
    stderr = np.sqrt(np.clip(np.diag(cov), 0.0, None))
    out = {
        "linear_scale": scale,
        "shift_ms": shift,
        "linear_scale_stderr": float(stderr[0]),
        "shift_stderr_ms": float(stderr[1]),
        "cells": int(len(ms)),
        "chunk_sizes": sorted(int(x) for x in np.unique(size)),
        "max_prefix_len": int(prefix.max()),
        "rel_residual": float(np.sqrt(np.mean(resid**2))),
        "stage": stage,
        "method": METHOD,
    }
    if not SCALE_RANGE[0] <= scale <= SCALE_RANGE[1]:
        return none(f"the fitted linear scale {scale:.3g} is outside {SCALE_RANGE[0]}-{SCALE_RANGE[1]}") | {
            "rejected": out
        }
    one = float(model.planning(out, 0.0).chunk_latency_ms(0, 1))
    if one <= 0:
        return none(f"the calibrated latency of a 1-token chunk, {one:.3g} ms, is not positive") | {"rejected": out}
    return out | {"source": "measured"}

"""The samples' drift between two profiles: per (prefix_len, chunk_size) cell measured in both, the ratio of the
candidate's median latency to the baseline's (bottleneck stage of each), summarised per prefix length for
`ppprof compare`, and the pace: how much slower (or faster) the candidate's machine ran as a whole."""

from __future__ import annotations

import numpy as np

from ppprof.fit.samples import Samples

MAX_CELLS_KEPT = 400  # cells listed in the report (the summary covers all of them)
MIN_PACE_PREFIXES = 3
"""Prefix lengths measured in both profiles that a pace needs: with two, their median is their mean, and a drift at
one would be half taken for the machine's."""


def cell_medians(samples: Samples) -> dict[tuple[int, int], float]:
    """{(prefix_len, chunk_size): median latency} over the rows of each cell."""
    keys = np.stack([samples.prefix_len, samples.chunk_size], axis=1)
    cells, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    return {
        (int(L), int(x)): float(np.median(samples.chunk_latency_ms[inverse == i])) for i, (L, x) in enumerate(cells)
    }


def samples_drift(base: Samples, cand: Samples) -> dict:
    """Median latency ratio (candidate / baseline) of every cell both profiles measured; their median over all cells and
    over the cells of each prefix length (`by_prefix`; the one furthest from the pace, else from 1, `worst_prefix`, is
    what a tolerance judges: the prefix-free sweep has most of the cells, and a drift at long prefixes would hide in an
    overall median), the cell that moved most, and the pace (key `pace`): the median of the prefix lengths' median
    ratios, each prefix length one vote. A machine that runs every forward k times slower moves every prefix length by
    k, so the pace is k; a drift at a few prefix lengths (or in the sweep's many cells) moves those and leaves the pace.
    None with fewer than MIN_PACE_PREFIXES common prefix lengths."""
    b, c = cell_medians(base), cell_medians(cand)
    common = sorted(set(b) & set(c))
    out = {
        "bottleneck_stage": [base.bottleneck_stage, cand.bottleneck_stage],
        "num_cells": len(common),
        "num_cells_baseline": len(b),
        "num_cells_candidate": len(c),
        "median_ratio": None,
        "worst_cell": None,
        "by_prefix": [],
        "worst_prefix": None,
        "pace": None,
        "cells": [],
        "note": None,
    }
    if not common:
        out["note"] = "no (prefix_len, chunk_size) cell measured in both profiles: samples not compared"
        return out
    ratios = np.array([c[k] / b[k] for k in common])
    worst = int(np.argmax(np.abs(np.log(ratios))))
    out["median_ratio"] = float(np.median(ratios))
    out["worst_cell"] = {
        "prefix_len": common[worst][0],
        "chunk_size": common[worst][1],
        "baseline_ms": b[common[worst]],
        "candidate_ms": c[common[worst]],
        "ratio": float(ratios[worst]),
    }
    out["quantiles"] = {q: float(v) for q, v in zip(("p10", "p50", "p90"), np.quantile(ratios, [0.1, 0.5, 0.9]))}
    prefixes = np.array([k[0] for k in common])
    out["by_prefix"] = [
        {
            "prefix_len": int(L),
            "num_cells": int((prefixes == L).sum()),
            "median_ratio": float(np.median(ratios[prefixes == L])),
        }
        for L in np.unique(prefixes)
    ]
    if len(out["by_prefix"]) >= MIN_PACE_PREFIXES:
        out["pace"] = float(np.median([r["median_ratio"] for r in out["by_prefix"]]))
    pace = out["pace"] or 1.0
    out["worst_prefix"] = max(out["by_prefix"], key=lambda r: abs(np.log(r["median_ratio"] / pace)))
    out["cells"] = [
        {"prefix_len": k[0], "chunk_size": k[1], "baseline_ms": b[k], "candidate_ms": c[k], "ratio": float(r)}
        for k, r in list(zip(common, ratios))[:MAX_CELLS_KEPT]
    ]
    return out

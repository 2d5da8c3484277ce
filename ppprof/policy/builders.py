"""The two builders of the rules a policy carries, on the planning model:

- the prompt-aware rule (the server knows the prompt's length): per band of prompt lengths, one bound M and a merge
  length m: the next chunk is the rule's x, or the whole rest when the rest is at most x + m (a tiny tail joins the
  chunk before it). Bands are built so that every aligned prompt length of the domain plans within the tolerance of
  the DP's lower bound (ppprof.policy.optimum).
- the history-only rule (the server passes only the prefix length): one (M, X) for a workload of prompt lengths,
  the least weighted mean TTFT over a grid of bounds and caps; the caps alone (M infinite) are the fixed chunks, so
  it is never above the best fixed chunk on that workload.

Pure numpy; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppprof.policy.bounded import Walks, rule_bounds, rule_table, rule_ttft, rule_ttfts, walk_rules
from ppprof.policy.optimum import Domain, bound_grid, optimum_at
from ppprof.policy.rule import LatencyModel
from ppprof.policy.tables import PromptRule

RULE_BOUNDS = 240
"""Bounds M tried for the prompt-aware rule's bands (log-spaced over the chunk latencies of the domain)."""
HISTORY_BOUNDS = 96
"""Bounds M tried for the history-only rule (with every cap)."""
MERGE_UNITS = (0, 1, 2, 4, 8)
"""Merge lengths tried, in units."""
PROMPT_TOLERANCE = 0.008
"""Build tolerance of the prompt-aware rule against the DP's lower bound at every aligned prompt length (the promise
is 1%; the margin covers lengths between the aligned ones)."""
WALK_BATCH = 1024
"""The history rule's candidates walked at a time: their walks stay a few MB (all at once: ~1 GB, 3x slower)."""


# -- the prompt-aware rule ------------------------------------------------------------------------------------------


def pieces(dom: Domain, per_unit: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) prompt length of each piece [k s + 1, (k + 1) s], s = unit / `per_unit`, over the domain.
    A bounded rule's plan gains a chunk (or stops merging its tail) one token past a multiple of the unit, so
    within a piece only its last chunk grows, and its TTFT with it: a piece is checked at its two ends."""
    step = max(1, dom.unit // per_unit)
    first = np.arange(1, dom.max_prompt_len + 1, step, dtype=np.int64)
    return first, np.minimum(first + step - 1, dom.max_prompt_len)


def runs_from(bad: np.ndarray, k: int) -> np.ndarray:
    """run[...]: how many consecutive entries from index k on along the last axis are not `bad`: the distance from k
    to the first bad entry at or after it (to the end of the axis where none is). argmax on booleans stops at the
    first True of each row, so a row costs its run, not the axis (a running minimum over the whole axis, at every k,
    cost 0.4 s a rule on a 131072-token domain)."""
    rest = bad[..., k:]
    first = rest.argmax(axis=-1)
    return np.where(np.take_along_axis(rest, first[..., None], axis=-1)[..., 0], first, rest.shape[-1])


@dataclass(slots=True)
class Candidates:
    """The bounded rules (with merge lengths) a prompt-aware rule chooses from, scored on the pieces of the domain:
    ratio[g, r, k] is the worst of rule r with merges[g] at the two ends of piece k against the DP's lower bound."""

    bounds: np.ndarray
    merges: list[int]
    walks: Walks
    ratio: np.ndarray


def score_candidates(model: LatencyModel, dom: Domain, pp_size: int) -> tuple[Candidates, np.ndarray]:
    """Every candidate's ratio on every piece, and the pieces' first lengths."""
    first, last = pieces(dom)
    lengths = np.concatenate([first, last])
    lower, _ = optimum_at(model, dom, bound_grid(model, dom), lengths, pp_size)
    bounds = rule_bounds(model, dom, RULE_BOUNDS)
    walks = walk_rules(
        model, bounds, np.full(len(bounds), dom.largest_chunk, dtype=np.int64), dom.unit, dom.max_prompt_len
    )
    merges = [u * dom.unit for u in MERGE_UNITS]
    ratio = np.empty((len(merges), len(bounds), len(first)))  # every entry written below
    for r in range(len(bounds)):
        for g, ttfts in enumerate(rule_ttfts(model, walks, r, lengths, merges, pp_size, dom.largest_chunk)):
            both = ttfts / lower
            ratio[g, r] = np.maximum(both[: len(first)], both[len(first) :])
    return Candidates(bounds, merges, walks, ratio), first


def cover(ratio: np.ndarray, tolerance: float) -> list[tuple[int, int, int]]:
    """Bands (first piece, merge index, rule index): from each band's first piece, the candidate within the tolerance
    over the most pieces (where none is, the best candidate for that piece alone)."""
    bad = ratio > 1.0 + tolerance
    bands, k = [], 0
    while k < ratio.shape[-1]:
        run = runs_from(bad, k)
        g, r = np.unravel_index(int(run.argmax()), run.shape)
        if run[g, r] == 0:
            g, r = np.unravel_index(int(ratio[:, :, k].argmin()), run.shape)
        bands.append((k, int(g), int(r)))
        k += max(1, int(run[g, r]))
    return bands


def build_prompt_rule(
    model: LatencyModel, dom: Domain, pp_size: int, tolerance: float = PROMPT_TOLERANCE
) -> tuple[PromptRule, dict]:
    """The prompt-aware rule: bands of prompt lengths, each the bounded rule (and merge length) whose plans stay
    within `tolerance` of the DP's lower bound over the most pieces of the domain from the band's start. Returns the
    rule and how close it came: {"max_ratio": the worst ratio on the pieces' ends, "bands": how many}."""
    cand, first = score_candidates(model, dom, pp_size)
    bands = cover(cand.ratio, tolerance)
    columns = [], [], [], [], []  # prompt_len, bound_ms, merge_len, prefix_len, chunk_size: one entry a band
    worst, tables = 0.0, {}  # a rule's table once, however many bands it serves
    for n, (k, g, r) in enumerate(bands):
        end = bands[n + 1][0] if n + 1 < len(bands) else len(first)
        worst = max(worst, float(cand.ratio[g, r, k:end].max()))
        if r not in tables:
            tables[r] = rule_table(model, float(cand.bounds[r]), dom.largest_chunk, dom.unit, dom.max_prompt_len)
        starts, sizes = tables[r]
        band = int(first[k]), float(cand.bounds[r]), cand.merges[g], list(starts), list(sizes)
        for column, value in zip(columns, band):
            column.append(value)
    return PromptRule(*columns, dom.largest_chunk), {"max_ratio": worst, "bands": len(bands)}


# -- the history-only rule and the fixed chunks ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistoryRule:
    """The history-only rule (bound_ms, chunk_cap; bound_ms inf: fixed chunks of chunk_cap) with its weighted mean
    predicted TTFT on the workload it was chosen for, and the best fixed chunk's on the same workload."""

    bound_ms: float
    chunk_cap: int
    mean_ttft_ms: float
    fixed_chunk: int
    fixed_mean_ttft_ms: float


def workload_ttft(
    model: LatencyModel, walks: Walks, lengths: np.ndarray, weights: np.ndarray, pp_size: int
) -> np.ndarray:
    """Weighted mean TTFT of every walked rule's plans of the workload's prompt lengths."""
    order = np.argsort(lengths)
    lengths, weights = lengths[order], weights[order]
    return np.array([rule_ttft(model, walks, r, lengths, 0, pp_size) @ weights for r in range(walks.starts.shape[1])])


def build_history_rule(model: LatencyModel, dom: Domain, pp_size: int, lengths, weights) -> HistoryRule:
    """The bounded rule, over HISTORY_BOUNDS bounds (and none) and every cap, with the least weighted mean TTFT on
    the workload; with no bound the rule is fixed chunks of its cap, so the choice is never above the best fixed
    chunk's."""
    lengths = np.asarray(lengths, dtype=np.int64)
    weights = np.asarray(weights, dtype=float)
    caps = dom.sizes()
    levels = rule_bounds(model, dom, HISTORY_BOUNDS)
    bounds = np.repeat(levels, len(caps))
    cap_of = np.tile(caps, len(levels))
    # The rules in batches: every rule's walk at once would hold 4 arrays of (steps x rules), ~1 GB at a long context
    mean = np.concatenate(
        [
            workload_ttft(
                model,
                walk_rules(model, bounds[i : i + WALK_BATCH], cap_of[i : i + WALK_BATCH], dom.unit, int(lengths.max())),
                lengths,
                weights,
                pp_size,
            )
            for i in range(0, len(bounds), WALK_BATCH)
        ]
    )
    fixed = np.flatnonzero(~np.isfinite(bounds))
    f = int(fixed[np.argmin(mean[fixed])])
    r = int(np.argmin(mean))
    if mean[r] >= mean[f]:
        r = f
    return HistoryRule(float(bounds[r]), int(cap_of[r]), float(mean[r]), int(cap_of[f]), float(mean[f]))

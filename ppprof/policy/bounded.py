"""Bounded rules in bulk: a bounded rule with bound M (ms) and cap X (tokens) gives, after L cached tokens, the largest
aligned chunk x <= X whose latency t(L, x) (the planning model) is at most M, and at least one alignment unit. Here:
its chunk at many prefixes at once, many rules walked from prefix 0 at once, their plans' TTFT, the bounds tried and
one rule's breakpoint table. Pure numpy; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppprof.policy.contract import LatencyModel, bounded_chunk
from ppprof.policy.optimum import Domain, latency_range, ttft

__all__ = [
    "Walks",
    "bounded_chunk",
    "bounded_sizes",
    "rule_bounds",
    "rule_table",
    "rule_ttft",
    "rule_ttfts",
    "walk_rules",
]


def bounded_sizes(
    model: LatencyModel, bounds: np.ndarray, caps: np.ndarray, prefix_len: np.ndarray, unit: int
) -> np.ndarray:
    """The bounded rule's chunk after prefix_len[k] for each (bounds[k], caps[k]): the largest multiple of the
    unit <= cap whose latency is <= the bound, at least one unit. The root of
    (a + h L) x^2 + (2 a L + b) x + (c + g L - M) = 0, aligned down, then checked against the model itself."""
    L = prefix_len.astype(float)
    qa = model.a + model.h * L
    qb = 2.0 * model.a * L + model.b
    qc = model.c + model.g * L - bounds
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        disc = qb * qb - 4.0 * qa * qc
        # qa > 0: the larger root; qa < 0 (a pairs model's h < 0 at a long prefix: concave in x): the smaller, the
        # first crossing of the bound, none (no cap from the bound) where the latency never reaches it; qa == 0: linear.
        root = np.where(
            qa != 0,
            (-qb + np.sqrt(np.maximum(disc, 0.0))) / (2.0 * np.where(qa != 0, qa, 1.0)),
            np.where(qb > 0, -qc / np.where(qb > 0, qb, 1.0), np.inf),
        )
        root = np.where((qa < 0) & (disc < 0), np.inf, root)
    root = np.where(np.isfinite(bounds), root, np.inf)
    x = np.floor(np.minimum(root, caps) / unit) * unit
    x = np.clip(x, unit, caps).astype(np.int64)
    # Float rounding at the boundary: one unit down where the aligned root still costs more than the bound.
    over = (x > unit) & (model.chunk_latency_ms(L, x) > bounds)
    return np.where(over, x - unit, x)


@dataclass(slots=True)
class Walks:
    """The chunk boundaries of many bounded rules walked from prefix 0 to `end`: starts[k, r] is rule r's k-th chunk
    start (end once past it); sums[k, r] and maxes[k, r] the sum and largest latency of its first k chunks."""

    starts: np.ndarray
    sums: np.ndarray
    maxes: np.ndarray
    sizes: np.ndarray


def walk_rules(model: LatencyModel, bounds: np.ndarray, caps: np.ndarray, unit: int, end: int) -> Walks:
    """Every rule (bounds[r], caps[r]) walked at once, chunk by chunk, until each has passed `end`."""
    # Every chunk is at least one unit: at most ceil(end / unit) chunks, rows written in place. Only the rules not
    # yet past `end` are walked on: a rule of large chunks ends in a few steps, so with every cap (the history rule's
    # thousands of rules) that is a twentieth of walking all of them every step.
    steps, n = -(-end // unit), len(bounds)
    starts, sums, maxes = (np.zeros((steps + 1, n), dtype=np.int64), np.zeros((steps + 1, n)), np.zeros((steps + 1, n)))
    sizes = np.zeros((steps, n), dtype=np.int64)
    L, s, m = np.zeros(n, dtype=np.int64), np.zeros(n), np.zeros(n)
    live, k = np.flatnonzero(L < end), 0
    while live.size:
        at = L[live]
        x = bounded_sizes(model, bounds[live], caps[live], at, unit)
        t = model.chunk_latency_ms(at, x)
        s[live] += t
        m[live] = np.maximum(m[live], t)
        L[live] = at + x
        k += 1
        starts[k], sums[k], maxes[k] = L, s, m
        sizes[k - 1, live] = x
        live = live[L[live] < end]
    return Walks(starts[: k + 1], sums[: k + 1], maxes[: k + 1], sizes[:k])


def rule_ttft(
    model: LatencyModel, walks: Walks, r: int, lengths: np.ndarray, merge: int, pp_size: int, largest: int | None = None
) -> np.ndarray:
    """TTFT of rule r's plan of each prompt length (sorted): chunks up to the last start below the length, then the
    rest; with `merge` > 0, a rest of at most `merge` tokens joins the chunk before it where that stays within
    `largest`."""
    return rule_ttfts(model, walks, r, lengths, (merge,), pp_size, largest)[0]


def rule_ttfts(
    model: LatencyModel, walks: Walks, r: int, lengths: np.ndarray, merges, pp_size: int, largest: int | None = None
) -> list[np.ndarray]:
    """rule_ttft of each merge length in `merges`: the last chunk's start found once for all of them."""
    starts = walks.starts[:, r]
    last = np.searchsorted(starts, lengths, side="left") - 1  # the last chunk starts at starts[last] < length
    rest = lengths - starts[last]
    before = lengths - starts[np.maximum(last - 1, 0)]
    out = []
    for merge in merges:
        j = last
        if merge:
            j = np.where((last >= 1) & (rest <= merge) & (before <= largest), last - 1, last)
        L = starts[j]
        t = model.chunk_latency_ms(L, lengths - L)
        out.append(ttft(walks.sums[j, r] + t, np.maximum(walks.maxes[j, r], t), pp_size))
    return out


def rule_bounds(model: LatencyModel, dom: Domain, count: int) -> np.ndarray:
    """`count` bounds log-spaced over the domain's chunk latencies, the latency of every first chunk size (the bound
    that lets the first chunk be that size and every later one as large as it may), and no bound (inf) last."""
    lo, hi = latency_range(model, dom)
    first = model.chunk_latency_ms(0, dom.sizes()) * (1.0 + 1e-12)
    return np.concatenate([np.unique(np.concatenate([np.geomspace(lo, hi, count), first])), [np.inf]])


def rule_table(model: LatencyModel, bound: float, cap: int, unit: int, end: int) -> tuple[list[int], list[int]]:
    """Breakpoints (prefix_len starts, chunk sizes) of the bounded rule (bound, cap), exact on prefixes 0 .. end - 1
    (evaluated at every one): size(L) = sizes[i] for the last i with starts[i] <= L."""
    L = np.arange(end, dtype=np.int64)
    size = bounded_sizes(model, np.full(end, bound), np.full(end, cap), L, unit)
    change = np.flatnonzero(np.diff(size)) + 1
    starts = np.concatenate([[0], change])
    return [int(v) for v in starts], [int(v) for v in size[starts]]

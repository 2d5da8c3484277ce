"""The optimum the policy's rules are built and checked against: TeraPipe's DP for every prompt length at once, on
the domain where plans may go.

The DP's optimal plan with largest chunk latency M* is a bounded rule's plan with M = M* (the fewest chunks within
M*; ppprof.policy.bounded), up to the placement of its last chunk, so the rules come within a tolerance of it
(ppprof.policy.builders). Predicted TTFT on P stages: sum t + (P - 1) max t (ppprof.policy.planners). Pure numpy; no
torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ppprof.policy.rule import LatencyModel

BOUND_STEP = 1.004
"""Ratio between neighbouring bounds of the all-lengths DP: its lower and upper bounds on the optimum differ by about
(P - 1) x 0.4% of the largest chunk latency (the rules are built and checked against the lower one)."""
EXTRAPOLATED_CHUNKS = 4
"""With --extrapolate a plan's largest chunk is this many base chunks (or the largest profiled, if larger)."""
MAX_WINDOW_UNITS = 128
"""The most units in one chunk of the DP (the largest chunk / the unit)."""
MAX_POSITIONS = 2048
"""The most positions of the DP (the longest prompt / the unit)."""


@dataclass(frozen=True, slots=True)
class Domain:
    """Where plans may go: chunks are multiples of `unit` up to `largest_chunk`; prompts up to `max_prompt_len`."""

    unit: int
    largest_chunk: int
    max_prompt_len: int

    def sizes(self) -> np.ndarray:
        """The chunk sizes a rule may give: unit .. largest_chunk."""
        return np.arange(self.unit, self.largest_chunk + 1, self.unit, dtype=np.int64)


def make_domain(alignment: int, largest_chunk: int, max_prompt_len: int) -> Domain:
    """The domain of the rules and the DP: the unit is the alignment, coarsened (by a whole factor) to at most
    MAX_WINDOW_UNITS units a chunk and MAX_POSITIONS positions a prompt; the largest chunk a whole number of units."""
    factor = max(
        1,
        math.ceil(largest_chunk / (alignment * MAX_WINDOW_UNITS)),
        math.ceil(max_prompt_len / (alignment * MAX_POSITIONS)),
    )
    unit = alignment * factor
    return Domain(unit, max(unit, largest_chunk // unit * unit), max_prompt_len)


def ttft(sums, maxes, pp_size: int):
    return sums + (pp_size - 1) * maxes


# -- the DP for every prompt length --------------------------------------------------------------------------------


def latency_range(model: LatencyModel, dom: Domain) -> tuple[float, float]:
    """The cheapest chunk of the domain (one unit, no prefix) and the dearest (the largest after the longest prompt)."""
    return (
        float(model.chunk_latency_ms(0, dom.unit)),
        float(model.chunk_latency_ms(dom.max_prompt_len, dom.largest_chunk)),
    )


def bound_grid(model: LatencyModel, dom: Domain, step: float = BOUND_STEP) -> np.ndarray:
    """Log-spaced bounds over latency_range, ratio `step` apart."""
    lo, hi = latency_range(model, dom)
    n = max(2, int(math.ceil(math.log(hi / lo) / math.log(step))) + 1)
    return lo * step ** np.arange(n)


def all_min_sums(model: LatencyModel, dom: Domain, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """S[j, m]: the least sum of chunk latencies of a prompt of pos[j] tokens with every chunk aligned (but the last,
    where the prompt is not), at most largest_chunk and of latency <= bounds[m]; inf where no plan fits. Every prefix
    of a plan is a plan of a shorter prompt, so one pass over positions gives every aligned length."""
    align = dom.unit
    pos = np.arange(0, dom.max_prompt_len + 1, align, dtype=np.int64)
    window = dom.largest_chunk // align
    total = np.full((len(pos), len(bounds)), np.inf)
    total[0] = 0.0
    for j in range(1, len(pos)):
        lo = max(0, j - window)
        start = pos[lo:j].astype(float)
        cost = model.chunk_latency_ms(start, pos[j] - start)[:, None]
        cand = np.where(cost <= bounds[None, :], total[lo:j] + cost, np.inf)
        total[j] = cand.min(axis=0)
    return pos, total


def optimum_bounds(sums: np.ndarray, bounds: np.ndarray, pp_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) bounds of the least TTFT from S(M) on the bound grid: an optimal plan with largest latency
    M* in (M_i, M_i+1] has sum >= S(M_i+1), so TTFT* >= S(M_i+1) + (P - 1) M_i; and S(M_i) + (P - 1) M_i is met by a
    plan. The lowest bound is the cheapest chunk, below every plan's largest."""
    P1 = pp_size - 1
    upper = (sums + P1 * bounds[None, :]).min(axis=1)
    lower = np.minimum((sums[:, 1:] + P1 * bounds[None, :-1]).min(axis=1), sums[:, 0] + P1 * bounds[0])
    return lower, upper


def optimum_table(model: LatencyModel, dom: Domain, pp_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prompt lengths, lower, upper): the DP optimum's bounds at every aligned prompt length of the domain."""
    bounds = bound_grid(model, dom)
    pos, sums = all_min_sums(model, dom, bounds)
    lower, upper = optimum_bounds(sums[1:], bounds, pp_size)
    return pos[1:], lower, upper


def optimum_at(
    model: LatencyModel, dom: Domain, bounds: np.ndarray, lengths: np.ndarray, pp_size: int, block: int = 4096
) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) bounds of the least TTFT at any prompt lengths (aligned or not) from all_min_sums under
    `bounds`: the last chunk runs from an aligned position below the length, at most largest_chunk before it.
    `block` lengths at a time keep the arrays small.

    The bounds of optimum_bounds, taken over the last chunk's start k and the bound m in the other order: a last chunk
    of cost c from pos[i] fits the bounds from f = the first bound >= c on, so the upper bound is the least over k of
    c + min over m >= f of (S[i, m] + (P - 1) M_m), a suffix minimum of each row of S computed once; the lower bound
    likewise. Each start costs a gather per length, not a pass over every bound."""
    pos, sums = all_min_sums(model, dom, bounds)
    window = dom.largest_chunk // dom.unit
    P1 = pp_size - 1
    never = np.full((len(pos), 1), np.inf)  # the suffix past the last bound: a chunk dearer than every bound

    def suffix_min(terms: np.ndarray) -> np.ndarray:
        return np.concatenate([np.minimum.accumulate(terms[:, ::-1], axis=1)[:, ::-1], never], axis=1)

    upper_after = suffix_min(sums + P1 * bounds[None, :])
    below = np.full_like(sums, np.inf)  # S[i, m] + (P - 1) M_(m-1): the sum under one bound, the bound below it
    below[:, 1:] = sums[:, 1:] + P1 * bounds[None, :-1]
    lower_after = suffix_min(below)
    lowest = sums[:, 0] + P1 * bounds[0]  # every chunk within the cheapest bound
    lower, upper = np.empty(len(lengths)), np.empty(len(lengths))
    for b in range(0, len(lengths), block):
        n = lengths[b : b + block]
        hi = np.searchsorted(pos, n, side="left")  # the last chunk starts at pos[hi - 1 - k], k = 0 .. window - 1
        low, up = np.full(len(n), np.inf), np.full(len(n), np.inf)
        for k in range(window):
            i = np.maximum(hi - 1 - k, 0)
            valid = (hi - 1 - k >= 0) & (n - pos[i] <= dom.largest_chunk)
            start = pos[i].astype(float)
            cost = np.where(valid, model.chunk_latency_ms(start, n - start), np.inf)
            # bounds are sorted: the chunk fits the bounds from the first one >= its cost on
            fits = np.searchsorted(bounds, cost, side="left")
            np.minimum(up, cost + upper_after[i, fits], out=up)
            np.minimum(low, cost + lower_after[i, fits], out=low)
            np.minimum(low, np.where(fits == 0, cost + lowest[i], np.inf), out=low)
        lower[b : b + block], upper[b : b + block] = low, up
    return lower, upper

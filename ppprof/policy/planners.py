"""Chunk planners for one prompt, with predicted TTFT on the policy's planning model (the fitted chunk latency plus
the per-chunk pipeline overhead):

- policy: the policy's prompt-aware rule (its prompt_table); policy-history: its history-only table;
- greedy: SGLang's equal-latency rule (target, smoothing, B // 4 floor, first chunk B) on the fitted model;
- fixed: chunks of B; fixed-best: the fixed chunk size with the least TTFT for this prompt;
- optimal: TeraPipe's DP, never worse than any of the others.

Predicted TTFT on P stages for chunk latencies t_1..t_n (every stage as slow as the bottleneck stage):
    TTFT = sum_i t_i + (P - 1) * max_i t_i
Pure numpy; no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ppprof.bounds import MAX_STAGES
from ppprof.checks import is_int
from ppprof.policy.optimum import EXTRAPOLATED_CHUNKS
from ppprof.policy.rule import LatencyModel
from ppprof.policy.runtime import Policy

STRATEGIES = ("policy", "policy-history", "greedy", "fixed", "fixed-best", "optimal")
MAX_GRID_POINTS = 32768  # DP positions; a coarser multiple of the alignment is used beyond this
MAX_WINDOW = 256  # DP predecessors per position (largest chunk / grid step)
MAX_DP_CELLS = 1 << 22  # positions x bounds of one DP pass (8 bytes a cell)
MAX_DP_WORK = 1 << 26  # positions x window x bounds of one DP pass (about 0.2 s)
BOUNDS_PER_ROUND = 48  # bounds per DP pass once the distinct chunk costs are too many to run at once
MAX_ROUNDS = 3  # further passes of the branch and bound (keeps a 1M-token prompt under ~2 s)
BOUND_RTOL = 1e-9  # a chunk "fits" a bound up to float rounding
PRUNE_RTOL = 1e-12


@dataclass(slots=True)
class Plan:
    """One strategy's chunk sizes for a prompt, with their predicted latencies and TTFT."""

    strategy: str
    chunk_sizes: list[int]
    latencies_ms: list[float] = field(default_factory=list)
    ttft_ms: float = math.nan
    search: dict | None = None  # optimal only: grid_tokens, bounds_evaluated, exact, gap_ms

    def to_dict(self) -> dict:
        d = {
            "strategy": self.strategy,
            "num_chunks": len(self.chunk_sizes),
            "chunk_sizes": self.chunk_sizes,
            "latencies_ms": self.latencies_ms,
            "ttft_ms": self.ttft_ms,
        }
        if self.search is not None:
            d["search"] = self.search
        return d


def ttft_ms(latencies_ms, pp_size: int) -> float:
    """Predicted TTFT = sum t + (P - 1) max t (0 for no chunks)."""
    t = np.asarray(latencies_ms, dtype=float)
    return float(t.sum() + (pp_size - 1) * t.max()) if t.size else 0.0


def chunk_latencies_ms(model: LatencyModel, chunk_sizes: list[int]) -> np.ndarray:
    """Latency of each chunk of a plan, each after the prefix the chunks before it filled."""
    sizes = np.asarray(chunk_sizes, dtype=float)
    starts = np.concatenate([[0.0], np.cumsum(sizes)[:-1]])
    return model.chunk_latency_ms(starts, sizes)


def predicted(model: LatencyModel, strategy: str, chunk_sizes: list[int], pp_size: int) -> Plan:
    """A Plan of `chunk_sizes` with the model's latencies and TTFT."""
    lat = chunk_latencies_ms(model, chunk_sizes)
    return Plan(strategy, [int(s) for s in chunk_sizes], [float(v) for v in lat], ttft_ms(lat, pp_size))


def fixed_chunks(chunk_size: int, prompt_len: int) -> list[int]:
    """`chunk_size` tokens a chunk, the last one taking the rest."""
    full, rest = divmod(prompt_len, chunk_size)
    return [chunk_size] * full + ([rest] if rest else [])


def chunk_costs(model: LatencyModel, pos: np.ndarray, max_chunk: int) -> np.ndarray:
    """cost[j, k] (n, window): latency of the chunk [pos[j - 1 - k], pos[j]), so k = 0 is the shortest chunk ending at
    position j; inf where the chunk is longer than max_chunk or would start before 0."""
    n = len(pos)
    lo_idx = np.searchsorted(pos, pos - max_chunk, side="left")
    window = int(max(1, (np.arange(n) - lo_idx).max()))
    idx = np.arange(n)[:, None] - 1 - np.arange(window)[None, :]
    valid = idx >= lo_idx[:, None]
    start = pos[np.clip(idx, 0, None)].astype(float)
    cost = model.chunk_latency_ms(start, pos[:, None] - start)  # the planner's own formula, not a rearrangement
    return np.where(valid, cost, np.inf)


def min_sums(cost: np.ndarray, bounds: np.ndarray, with_arg: bool = False):
    """The DP for every bound M at once, over positions j = 1..n-1 (the recurrence, written once):

        S[0] = 0,   S[j] = min over i in [j - window, j) with cost(i, j) <= M of S[i] + cost(i, j)

    Returns S[n-1] per bound (inf: no plan keeps every chunk within M) and, with `with_arg`, the chosen start i of
    the chunk ending at each position (n, len(bounds)), for backtracking.
    """
    n, window = cost.shape
    m = len(bounds)
    limit = bounds * (1.0 + BOUND_RTOL)
    total = np.full((n, m), np.inf)
    total[0] = 0.0
    arg = np.zeros((n, m), dtype=np.int32) if with_arg else None
    cols = np.arange(m)
    rev = cost[:, ::-1]  # rev[j, window - 1 - k] = cost[j, k]: rows in the order of the starts j - window .. j - 1
    for j in range(1, n):
        lo = max(0, j - window)
        c = rev[j, window - (j - lo) :][:, None]  # (j - lo, 1)
        cand = np.where(c <= limit, total[lo:j] + c, np.inf)  # (j - lo, m)
        if with_arg:
            k = cand.argmin(axis=0)
            arg[j] = lo + k
            total[j] = cand[k, cols]
        else:
            cand.min(axis=0, out=total[j])
    return total[-1], arg


def backtrack(pos: np.ndarray, start: np.ndarray) -> list[int]:
    """Chunk sizes from `start` (n,), the chosen start of the chunk ending at each position."""
    chunks, j = [], len(pos) - 1
    while j > 0:
        i = int(start[j])
        chunks.append(int(pos[j] - pos[i]))
        j = i
    return chunks[::-1]


def grid_positions(prompt_len: int, alignment: int, max_chunk: int, seeds: list[list[int]]) -> tuple[np.ndarray, int]:
    """Sorted chunk boundaries the DP may use: multiples of the grid step, the seeds' boundaries and prompt_len; and
    the grid step (the alignment, coarsened to at most MAX_GRID_POINTS positions and MAX_WINDOW steps per chunk)."""
    grid = alignment * max(
        1, math.ceil(prompt_len / (alignment * MAX_GRID_POINTS)), math.ceil(max_chunk / (alignment * MAX_WINDOW))
    )
    points = [np.arange(0, prompt_len, grid, dtype=np.int64), np.array([prompt_len], dtype=np.int64)]
    for seed in seeds:
        points.append(np.cumsum(seed, dtype=np.int64))
    return np.unique(np.concatenate(points)), grid


def search_bounds(cost: np.ndarray, costs: np.ndarray, P1: int) -> tuple[float, int, list[tuple[float, int, int]]]:
    """Steps 3 and 4 of optimal_chunks over the sorted distinct costs C: returns (the bound M whose min-sum plan had
    the least TTFT upper bound, how many bounds were evaluated, the intervals left open)."""
    n, window = cost.shape
    sums = np.full(len(costs), np.nan)  # S(C[i]) where evaluated
    best = {"ub": np.inf, "bound": None}
    evaluated = 0

    def run(indices: np.ndarray) -> None:
        nonlocal evaluated
        bounds = costs[indices]
        total, _ = min_sums(cost, bounds)
        sums[indices] = total
        evaluated += len(indices)
        ub = total + P1 * bounds  # >= the actual TTFT of each bound's plan
        k = int(np.argmin(ub))
        if ub[k] < best["ub"]:
            best["ub"], best["bound"] = float(ub[k]), float(bounds[k])

    at_once = max(1, min(MAX_DP_CELLS // n, MAX_DP_WORK // (n * window)))
    open_gaps = []
    if len(costs) <= at_once:
        run(np.arange(len(costs)))
    else:
        step = min(BOUNDS_PER_ROUND, at_once)
        run(np.unique(np.linspace(0, len(costs) - 1, step).round().astype(np.int64)))
        for _ in range(MAX_ROUNDS):
            open_gaps = unresolved(sums, costs, P1, best["ub"])
            if not open_gaps:
                break
            run(split(open_gaps, step))
        open_gaps = unresolved(sums, costs, P1, best["ub"])
    if not np.isfinite(best["ub"]):
        raise ValueError("optimal planner found no feasible plan: check the policy's latency model")
    return best["bound"], evaluated, open_gaps


def optimal_chunks(
    model: LatencyModel, prompt_len: int, pp_size: int, alignment: int, max_chunk: int, seeds: list[list[int]]
) -> tuple[list[int], dict]:
    """TeraPipe's DP: for a bound M on the largest chunk latency, the plan minimising the sum of latencies; over
    bounds, the plan with the least TTFT. Returns (chunk sizes, search facts). Never worse than any plan in `seeds`.

    1. Positions: multiples of the grid step (the alignment, coarsened to at most MAX_GRID_POINTS positions and
       MAX_WINDOW steps per chunk), the seeds' boundaries, and prompt_len. Chunks are at most max_chunk tokens.
    2. Let C be the distinct finite chunk costs on that grid and S(M) the DP's least sum with every chunk <= M.
       If the best plan has largest latency M*, then M* is in C and the min-sum plan for M* has sum <= the best
       sum and max <= M*: its TTFT is optimal. So the optimum is min over M in C of S(M) + (P - 1) M, and every
       plan is scored by its actual TTFT = sum + (P - 1) * its actual max.
    3. Few enough costs (one pass over all of C within MAX_DP_CELLS and MAX_DP_WORK): every M in C is run at
       once; the plan is exact on the grid.
    4. Otherwise branch and bound over C sorted: a first pass at BOUNDS_PER_ROUND quantiles of C (spanning the least
       to the largest cost); S is non-increasing, so for M strictly between evaluated bounds M_lo < M_hi,
       S(M) + (P - 1) M >= S(M_hi) + (P - 1) next(M_lo) - intervals whose bound cannot beat the best are pruned,
       the rest are split by further passes. When no interval is left the plan is exact on the grid; after
       MAX_ROUNDS passes it stops, and `gap_ms` bounds how far its TTFT may be above the grid's optimum.
    The grid itself is exact for prompts up to MAX_GRID_POINTS alignment units (and chunks up to MAX_WINDOW units).
    """
    max_chunk = max([max_chunk] + [max(s) for s in seeds])
    pos, grid = grid_positions(prompt_len, alignment, max_chunk, seeds)
    cost = chunk_costs(model, pos, max_chunk)
    costs = np.unique(cost[np.isfinite(cost)])  # C, sorted
    bound, evaluated, open_gaps = search_bounds(cost, costs, pp_size - 1)
    _, arg = min_sums(cost, np.array([bound]), with_arg=True)
    candidates = [backtrack(pos, arg[:, 0])] + [list(s) for s in seeds]
    scores = [ttft_ms(chunk_latencies_ms(model, c), pp_size) for c in candidates]
    pick = int(np.argmin(scores))
    lower = min([lb for lb, _, _ in open_gaps], default=np.inf)
    search = {
        "grid_tokens": int(grid),
        "num_chunk_costs": int(len(costs)),
        "bounds_evaluated": int(evaluated),
        "exact_on_grid": not open_gaps,
        "gap_ms": max(0.0, scores[pick] - lower) if open_gaps else 0.0,
    }
    return candidates[pick], search


def unresolved(sums: np.ndarray, costs: np.ndarray, P1: int, best_ub: float) -> list[tuple[float, int, int]]:
    """(lower bound, lo, hi) for each run of unevaluated costs between evaluated indices lo < hi whose lower bound
    S(costs[hi]) + (P - 1) costs[lo + 1] could still beat best_ub (S is non-increasing in the bound)."""
    done = np.flatnonzero(~np.isnan(sums))
    lo, hi = done[:-1], done[1:]
    gap = hi - lo > 1
    lo, hi = lo[gap], hi[gap]
    lb = sums[hi] + P1 * costs[lo + 1]
    keep = lb < best_ub - PRUNE_RTOL * abs(best_ub)
    order = np.argsort(lb[keep])
    return [(float(b), int(l), int(h)) for b, l, h in zip(lb[keep][order], lo[keep][order], hi[keep][order])]


def split(open_gaps: list[tuple[float, int, int]], budget: int) -> np.ndarray:
    """Up to `budget` unevaluated indices, spread evenly inside the most promising gaps first."""
    share = max(1, math.ceil(budget / len(open_gaps)))
    picked, left = [], budget
    for _, lo, hi in open_gaps:
        inner = hi - lo - 1
        take = min(inner, share, left)
        if take <= 0:
            break
        picked.append(lo + 1 + np.unique(np.linspace(0, inner - 1, take).round().astype(np.int64)))
        left -= len(picked[-1])
    return np.unique(np.concatenate(picked))


def default_pp_size(policy: Policy) -> int:
    """The pipeline stages the policy's rules were chosen for."""
    return policy.pp_size


def plan_domain(policy: Policy, prompt_len: int, extrapolate: bool) -> int:
    """The largest chunk a plan of this prompt may use: the policy's (the profiled domain's), or with `extrapolate`
    also EXTRAPOLATED_CHUNKS x B. ValueError (one line) for a prompt beyond the policy's domain without `extrapolate`."""
    max_prompt_len = policy.data["prompt_table"]["max_prompt_len"]
    if prompt_len > max_prompt_len and not extrapolate:
        raise ValueError(
            f"--prompt-len {prompt_len} is beyond the policy's domain (prompts up to "
            f"{max_prompt_len} tokens, whose prefixes the profile measured): give --extrapolate "
            "to plan it on the latency model anyway, or profile with --prefix-lens reaching it"
        )
    largest = policy.prompt_rule.largest_chunk
    return max(largest, EXTRAPOLATED_CHUNKS * policy.base_chunk_size) if extrapolate else largest


def best_fixed(model: LatencyModel, prompt_len: int, pp_size: int, alignment: int, largest: int) -> list[int]:
    """The fixed chunks (a multiple of the alignment up to `largest`) with the least predicted TTFT for this prompt."""
    sizes = range(alignment, max(alignment, largest) + 1, alignment)
    plans = [fixed_chunks(x, prompt_len) for x in sizes]
    return min(plans, key=lambda p: ttft_ms(chunk_latencies_ms(model, p), pp_size))


def plan_prompt(
    policy: Policy, prompt_len: int, pp_size: int, strategies=STRATEGIES, extrapolate: bool = False
) -> list[Plan]:
    """Plans of `prompt_len` tokens for each strategy, with latencies and TTFT predicted by the policy's planning
    model (fitted latency + overhead)."""
    if not is_int(prompt_len) or prompt_len < 1:
        raise ValueError(f"--prompt-len {prompt_len!r} is invalid: use a positive number of tokens")
    if not is_int(pp_size) or not 1 <= pp_size <= MAX_STAGES:
        raise ValueError(f"--pp {pp_size!r} is invalid: use a number of pipeline stages in 1..{MAX_STAGES}")
    policy.check_prompt_len(prompt_len)  # before any chunk list: a prompt past the context would not end
    if policy.latency_model is None:
        raise ValueError(f"policy has no latency model ({policy.status}: {policy.reason}): refit with more samples")
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"--strategy {unknown[0]} is unknown: use one of {', '.join(STRATEGIES)} or all")
    largest = plan_domain(policy, prompt_len, extrapolate)
    model, align = policy.planning_model, policy.settings.alignment
    chunks = {
        "policy": policy.plan(prompt_len),
        "policy-history": policy.plan_history(prompt_len),
        "greedy": policy.sglang_plan(prompt_len),
        "fixed": fixed_chunks(policy.base_chunk_size, prompt_len),
        "fixed-best": best_fixed(model, prompt_len, pp_size, align, largest),
    }
    plans = []
    for strategy in strategies:
        search = None
        if strategy == "optimal":
            seeds = list(chunks.values())
            top = max([largest] + [max(c) for c in seeds])
            chunks["optimal"], search = optimal_chunks(model, prompt_len, pp_size, align, top, seeds)
        plan = predicted(model, strategy, chunks[strategy], pp_size)
        plan.search = search
        plans.append(plan)
    return plans

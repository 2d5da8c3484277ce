"""Chunk planners for one prompt: fixed, greedy (the policy's rule) and optimal (TeraPipe's DP), with predicted TTFT.

Predicted TTFT on P stages for chunk latencies t_1..t_n (every stage as slow as the bottleneck stage):
    TTFT = sum_i t_i + (P - 1) * max_i t_i
Pure numpy; no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ppprof.policy.rule import LatencyModel
from ppprof.policy.schema import Policy

STRATEGIES = ("fixed", "greedy", "optimal")
MAX_GRID_POINTS = 32768  # DP positions; a coarser multiple of the alignment is used beyond this
MAX_WINDOW = 256  # DP predecessors per position (largest chunk / grid step)
NUM_COARSE_BOUNDS = 24
NUM_FINE_BOUNDS = 16
BOUND_RTOL = 1e-9  # a chunk "fits" a bound up to float rounding of the separable cost


@dataclass(slots=True)
class Plan:
    strategy: str
    chunk_sizes: list[int]
    latencies_ms: list[float] = field(default_factory=list)
    ttft_ms: float = math.nan

    def to_dict(self) -> dict:
        return {"strategy": self.strategy, "num_chunks": len(self.chunk_sizes), "chunk_sizes": self.chunk_sizes,
                "latencies_ms": self.latencies_ms, "ttft_ms": self.ttft_ms}


def ttft_ms(latencies_ms, num_stages: int) -> float:
    t = np.asarray(latencies_ms, dtype=float)
    return float(t.sum() + (num_stages - 1) * t.max()) if t.size else 0.0


def chunk_latencies_ms(model: LatencyModel, chunk_sizes: list[int]) -> np.ndarray:
    sizes = np.asarray(chunk_sizes, dtype=float)
    starts = np.concatenate([[0.0], np.cumsum(sizes)[:-1]])
    return model.chunk_latency_ms(starts, sizes)


def predicted(model: LatencyModel, strategy: str, chunk_sizes: list[int], num_stages: int) -> Plan:
    lat = chunk_latencies_ms(model, chunk_sizes)
    return Plan(strategy, [int(s) for s in chunk_sizes], [float(v) for v in lat], ttft_ms(lat, num_stages))


def fixed_chunks(chunk_size: int, prompt_len: int) -> list[int]:
    full, rest = divmod(prompt_len, chunk_size)
    return [chunk_size] * full + ([rest] if rest else [])


def optimal_chunks(model: LatencyModel, prompt_len: int, num_stages: int, alignment: int, max_chunk: int,
                   seeds: list[list[int]]) -> list[int]:
    """TeraPipe's DP: for each bound M on the largest chunk latency, minimise the sum of latencies; keep the best
    sum + (P - 1) M. Never worse than any plan in `seeds` (their boundaries join the grid and their largest
    latencies join the candidate bounds).

    1. Positions: multiples of the grid step (the alignment, coarsened to at most MAX_GRID_POINTS positions and
       MAX_WINDOW steps per chunk), the seeds' boundaries, and prompt_len.
    2. The latency of chunk [L, E) separates: t = c + g L + b (E - L) + a (E^2 - L^2) = phi(E) + psi(L),
       phi(E) = a E^2 + b E, psi(L) = c + (g - b) L - a L^2.
    3. Recurrence, for all bounds at once (vectorised over M):
           S[0] = 0,  S[j] = min over i in window(j), phi(E_j) + psi(L_i) <= M, of S[i] + phi(E_j) + psi(L_i).
    4. Coarse bounds between the finest plan's largest latency and the seeds', then a finer pass around the best.
    """
    grid = alignment * max(1, math.ceil(prompt_len / (alignment * MAX_GRID_POINTS)),
                           math.ceil(max_chunk / (alignment * MAX_WINDOW)))
    points = [np.arange(0, prompt_len, grid, dtype=np.int64), np.array([prompt_len], dtype=np.int64)]
    for seed in seeds:
        points.append(np.cumsum(seed, dtype=np.int64))
    pos = np.unique(np.concatenate(points))
    pos_f = pos.astype(float)
    phi = model.a * pos_f * pos_f + model.b * pos_f
    psi = model.c + (model.g - model.b) * pos_f - model.a * pos_f * pos_f
    n = len(pos)
    lo_idx = np.searchsorted(pos, pos - max(max_chunk, max(max(s) for s in seeds)), side="left")
    window = int(max(1, (np.arange(n) - lo_idx).max()))
    # idx[j, k] = j - 1 - k: candidate starts of a chunk ending at position j (k = 0 is the shortest chunk).
    idx = np.arange(n)[:, None] - 1 - np.arange(window)[None, :]
    valid = idx >= lo_idx[:, None]
    idx = np.clip(idx, 0, None)
    cost = phi[:, None] + psi[idx]  # (n, window)
    cost = np.where(valid, cost, np.inf)

    seed_max = [float(chunk_latencies_ms(model, s).max()) for s in seeds]
    finest = float(np.max(phi[1:] + psi[:-1]))  # every position a boundary: smallest feasible largest latency
    hi = max(seed_max + [finest])
    coarse = np.unique(np.concatenate([np.geomspace(finest, hi, NUM_COARSE_BOUNDS), seed_max, [finest]]))
    best_bound, best_value, best_plan = _solve(cost, idx, pos, coarse, num_stages)
    k = int(np.searchsorted(coarse, best_bound))
    lower, upper = coarse[max(k - 1, 0)], coarse[min(k + 1, len(coarse) - 1)]
    if upper > lower:
        fine = np.linspace(lower, upper, NUM_FINE_BOUNDS)
        bound, value, plan = _solve(cost, idx, pos, fine, num_stages)
        if value < best_value:
            best_plan = plan
    candidates = [best_plan] + [list(s) for s in seeds]
    scores = [ttft_ms(chunk_latencies_ms(model, c), num_stages) for c in candidates]
    return candidates[int(np.argmin(scores))]


def _solve(cost: np.ndarray, idx: np.ndarray, pos: np.ndarray, bounds: np.ndarray, num_stages: int):
    """Run the recurrence for every bound in `bounds`; return (bound, sum + (P-1) bound, chunk sizes) of the best."""
    n, window = cost.shape
    m = len(bounds)
    limit = bounds * (1.0 + BOUND_RTOL)
    total = np.full((n, m), np.inf)
    total[0] = 0.0
    arg = np.zeros((n, m), dtype=np.int32)
    cols = np.arange(m)
    for j in range(1, n):
        c = cost[j][:, None]  # (window, 1)
        cand = np.where(c <= limit, total[idx[j]] + c, np.inf)  # (window, m)
        k = cand.argmin(axis=0)
        arg[j] = k
        total[j] = cand[k, cols]
    value = total[-1] + (num_stages - 1) * bounds
    best = int(np.argmin(value))
    if not np.isfinite(value[best]):
        raise ValueError("optimal planner found no feasible plan: check the policy's latency model")
    chunks, j = [], n - 1
    while j > 0:
        i = int(idx[j, arg[j, best]])
        chunks.append(int(pos[j] - pos[i]))
        j = i
    return float(bounds[best]), float(value[best]), chunks[::-1]


def plan_prompt(policy: Policy, prompt_len: int, num_stages: int, strategies=STRATEGIES) -> list[Plan]:
    """Plans of `prompt_len` tokens for each strategy, with latencies and TTFT predicted by the policy's model."""
    if isinstance(prompt_len, bool) or not isinstance(prompt_len, int) or prompt_len < 1:
        raise ValueError(f"--prompt-len {prompt_len!r} is invalid: use a positive number of tokens")
    if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
        raise ValueError(f"--pp {num_stages!r} is invalid: use a positive number of pipeline stages")
    if policy.model is None:
        raise ValueError(f"policy has no latency model ({policy.status}: {policy.reason}): refit with more samples")
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"--strategy {unknown[0]} is unknown: use one of {', '.join(STRATEGIES)} or all")
    settings = policy.settings
    fixed = fixed_chunks(settings.base_chunk_size, prompt_len)
    greedy = policy.plan(prompt_len)
    plans = []
    for strategy in strategies:
        if strategy == "fixed":
            chunks = fixed
        elif strategy == "greedy":
            chunks = greedy
        else:
            chunks = optimal_chunks(policy.model, prompt_len, num_stages, settings.alignment,
                                    settings.max_chunk_size, [fixed, greedy])
        plans.append(predicted(policy.model, strategy, chunks, num_stages))
    return plans

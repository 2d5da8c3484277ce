import itertools

import numpy as np
import pytest

from ppprof.policy import LatencyModel, from_dict
from ppprof.policy.planners import (_solve, chunk_latencies_ms, fixed_chunks, optimal_chunks, plan_prompt,
                                    ttft_ms)
from ppprof.policy.commands import schedule

from .policy_helpers import policy_dict


def test_ttft_formula_and_timeline_agree():
    lat = [3.0, 5.0, 2.0, 4.0]
    assert ttft_ms(lat, 3) == 14.0 + 2 * 5.0
    start = schedule(lat, 3)
    assert start[-1, -1] + lat[-1] == pytest.approx(ttft_ms(lat, 3))
    assert start[1, 0] == 3.0 and start[0, 2] == 6.0


def test_fixed_chunks():
    assert fixed_chunks(4, 10) == [4, 4, 2]
    assert fixed_chunks(5, 10) == [5, 5]


def brute_force_min_sum(model, positions, bound):
    """Min sum of chunk latencies over every boundary subset, largest chunk latency <= bound."""
    best = np.inf
    inner = positions[1:-1]
    for r in range(len(inner) + 1):
        for cut in itertools.combinations(inner, r):
            bounds = [positions[0], *cut, positions[-1]]
            lat = chunk_latencies_ms(model, list(np.diff(bounds)))
            if lat.max() <= bound * (1 + 1e-9):
                best = min(best, lat.sum())
    return best


def test_dp_matches_brute_force_for_each_bound():
    model = LatencyModel("prefix", a=1e-4, b=0.05, c=2.0, g=0.02)
    pos = np.arange(0, 11) * 64
    phi = model.a * pos**2.0 + model.b * pos
    psi = model.c + (model.g - model.b) * pos - model.a * pos**2.0
    n, window = len(pos), len(pos) - 1
    idx = np.arange(n)[:, None] - 1 - np.arange(window)[None, :]
    cost = np.where(idx >= 0, phi[:, None] + psi[np.clip(idx, 0, None)], np.inf)
    idx = np.clip(idx, 0, None)
    for bound in (40.0, 60.0, 100.0, 400.0):
        _, value, chunks = _solve(cost, idx, pos, np.array([bound]), num_stages=1)
        want = brute_force_min_sum(model, pos, bound)
        assert value == pytest.approx(want), f"{bound=} {chunks=}"
        assert chunk_latencies_ms(model, chunks).max() <= bound * (1 + 1e-9)


@pytest.mark.parametrize("seed", range(12))
def test_optimal_never_worse_than_greedy_or_fixed(seed):
    rng = np.random.default_rng(seed)
    name = ["quadratic", "prefix"][seed % 2]
    model = LatencyModel(name, a=10 ** rng.uniform(-8, -5), b=rng.uniform(0, 0.05), c=rng.uniform(0, 20),
                         g=rng.uniform(0, 0.003) if name == "prefix" else 0.0)
    base = int(rng.choice([1024, 4096, 8192, 5000]))
    p = from_dict(policy_dict(model, base_chunk_size=base, smooth_factor=float(rng.uniform(0.3, 1)),
                              context_len=400000))
    prompt_len = int(rng.integers(base // 2, 300000))
    stages = int(rng.integers(1, 9))
    fixed, greedy, optimal = plan_prompt(p, prompt_len, stages)
    for plan in (fixed, greedy, optimal):
        assert sum(plan.chunk_sizes) == prompt_len, plan.strategy
        assert plan.ttft_ms == pytest.approx(ttft_ms(chunk_latencies_ms(model, plan.chunk_sizes), stages))
    assert optimal.ttft_ms <= greedy.ttft_ms + 1e-9 and optimal.ttft_ms <= fixed.ttft_ms + 1e-9, f"{seed=}"


def test_optimal_beats_fixed_when_prefix_cost_grows():
    model = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=2e-4)
    fixed = fixed_chunks(4096, 100000)
    best = optimal_chunks(model, 100000, 2, 64, 4096, [fixed])
    assert ttft_ms(chunk_latencies_ms(model, best), 2) < ttft_ms(chunk_latencies_ms(model, fixed), 2) - 10
    assert all(b % 64 == 0 for b in np.cumsum(best)[:-1]), f"{best=}"


def test_plan_prompt_rejects_bad_input():
    p = from_dict(policy_dict(LatencyModel("quadratic", a=3e-7, b=0.01, c=5.0)))
    with pytest.raises(ValueError, match="--prompt-len 0"):
        plan_prompt(p, 0, 2)
    with pytest.raises(ValueError, match="--pp 0"):
        plan_prompt(p, 100, 0)

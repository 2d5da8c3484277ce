import itertools

import numpy as np
import pytest

from ppprof.policy import LatencyModel, from_dict
from ppprof.policy.planners import (
    STRATEGIES,
    chunk_costs,
    chunk_latencies_ms,
    fixed_chunks,
    min_sums,
    optimal_chunks,
    plan_prompt,
    ttft_ms,
)
from ppprof.policy.timeline import drawn_stages, start_times

from .policy_helpers import policy_dict


def test_ttft_formula_and_timeline_agree():
    lat = [3.0, 5.0, 2.0, 4.0]
    assert ttft_ms(lat, 3) == 14.0 + 2 * 5.0
    start = start_times(lat, 3)
    assert start[-1, -1] + lat[-1] == pytest.approx(ttft_ms(lat, 3))
    assert start[1, 0] == 3.0 and start[0, 2] == 6.0


def naive_schedule(lat, pp_size):
    start = np.zeros((len(lat), pp_size))
    for i in range(len(lat)):
        for s in range(pp_size):
            start[i, s] = max(start[i, s - 1] + lat[i] if s else 0.0, start[i - 1, s] + lat[i - 1] if i else 0.0)
    return start


@pytest.mark.parametrize("seed", range(5))
def test_schedule_matches_the_recurrence(seed):
    rng = np.random.default_rng(seed)
    lat = rng.uniform(0.1, 10, size=int(rng.integers(1, 30)))
    stages = int(rng.integers(1, 40))
    np.testing.assert_allclose(start_times(lat, stages), naive_schedule(lat, stages), rtol=1e-12)
    assert start_times(lat, stages)[-1, -1] + lat[-1] == pytest.approx(ttft_ms(lat, stages), rel=1e-12)


def test_drawn_stages_are_at_most_16():
    assert drawn_stages(3) == [0, 1, 2] and drawn_stages(16) == list(range(16))
    assert drawn_stages(1024) == list(range(15)) + [1023]


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
    cost = chunk_costs(model, pos, 640)
    for bound in (40.0, 60.0, 100.0, 400.0):
        (value,), _ = min_sums(cost, np.array([bound]))
        want = brute_force_min_sum(model, pos, bound)
        assert value == pytest.approx(want), f"{bound=}"


def brute_force_best_ttft(model, prompt_len, pp_size, alignment, max_chunk):
    """Least TTFT over every plan with boundaries on multiples of the alignment and chunks <= max_chunk."""
    inner = range(alignment, prompt_len, alignment)
    best = np.inf
    for r in range(len(inner) + 1):
        for cut in itertools.combinations(inner, r):
            sizes = np.diff([0, *cut, prompt_len])
            if sizes.max() <= max_chunk:
                best = min(best, ttft_ms(chunk_latencies_ms(model, list(sizes)), pp_size))
    return best


def random_policy(rng, name):
    model = LatencyModel(
        name,
        a=10 ** rng.uniform(-7, -3),
        b=rng.uniform(0, 0.05),
        c=rng.uniform(0, 30),
        g=rng.uniform(0, 0.1) if name == "prefix" else 0.0,
    )
    alignment = int(rng.choice([16, 32, 64]))
    base = alignment * int(rng.integers(1, 7))
    cap = int(rng.choice([0, alignment * int(rng.integers(1, 8))]))  # 0: B; may be below B
    largest = max(base, cap)  # the profiled domain: the DP's chunks reach the larger of B and the cap
    return model, from_dict(
        policy_dict(
            model,
            base_chunk_size=base,
            alignment=alignment,
            max_chunk_size=cap,
            smooth_factor=float(rng.uniform(0.3, 1)),
            context_len=4096,
            largest=largest,
        )
    )


@pytest.mark.parametrize("seed", range(40))
def test_optimal_equals_brute_force_minimum(seed):
    rng = np.random.default_rng(seed)
    model, p = random_policy(rng, ["quadratic", "prefix"][seed % 2])
    s = p.settings
    prompt_len = s.alignment * int(rng.integers(1, 12)) + int(rng.integers(0, s.alignment))
    stages = int(rng.integers(1, 9))
    fixed, greedy, optimal = plan_prompt(p, prompt_len, stages, ("fixed", "greedy", "optimal"))
    want = brute_force_best_ttft(model, prompt_len, stages, s.alignment, max(s.base_chunk_size, s.max_chunk_size))
    assert optimal.ttft_ms == pytest.approx(want, rel=1e-9, abs=0), (
        f"{seed=} {model=} {prompt_len=} {stages=} {optimal.chunk_sizes=}"
    )
    assert optimal.search["exact_on_grid"] and optimal.search["gap_ms"] == 0.0
    assert optimal.ttft_ms <= min(fixed.ttft_ms, greedy.ttft_ms) * (1 + 1e-12)


def test_optimal_may_exceed_every_seed_max_latency():
    """The best plan's largest latency need not be any seed's (the old candidate bounds stopped at the seeds')."""
    model = LatencyModel("quadratic", a=1.1e-6, b=0.015, c=24.4)  # a large fixed cost: few, longer chunks win
    fixed = fixed_chunks(32, 358)
    chunks, _ = optimal_chunks(model, 358, 8, 32, 96, [fixed])
    want = brute_force_best_ttft(model, 358, 8, 32, 96)
    got = ttft_ms(chunk_latencies_ms(model, chunks), 8)
    assert got == pytest.approx(want, rel=1e-9, abs=0), f"{chunks=}"
    assert got < 0.9 * ttft_ms(chunk_latencies_ms(model, fixed), 8), f"{chunks=}"
    assert chunk_latencies_ms(model, chunks).max() > chunk_latencies_ms(model, fixed).max(), f"{chunks=}"


def test_large_prompt_search_reports_its_gap():
    model = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=2e-4)
    fixed = fixed_chunks(8192, 200000)
    chunks, search = optimal_chunks(model, 200000, 4, 64, 8192, [fixed])
    assert sum(chunks) == 200000 and search["grid_tokens"] == 64
    assert search["num_chunk_costs"] > search["bounds_evaluated"], f"{search=}"
    got = ttft_ms(chunk_latencies_ms(model, chunks), 4)
    assert got < ttft_ms(chunk_latencies_ms(model, fixed), 4)
    assert search["exact_on_grid"] or 0.0 <= search["gap_ms"] < 1e-3 * got, f"{search=}"


def test_optimal_beats_fixed_when_prefix_cost_grows():
    model = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=2e-4)
    fixed = fixed_chunks(4096, 100000)
    best, _ = optimal_chunks(model, 100000, 2, 64, 4096, [fixed])
    assert ttft_ms(chunk_latencies_ms(model, best), 2) < ttft_ms(chunk_latencies_ms(model, fixed), 2) - 10
    assert all(b % 64 == 0 for b in np.cumsum(best)[:-1]), f"{best=}"


def test_plan_prompt_rejects_bad_input():
    p = from_dict(policy_dict(LatencyModel("quadratic", a=3e-7, b=0.01, c=5.0)))
    with pytest.raises(ValueError, match="--prompt-len 0"):
        plan_prompt(p, 0, 2)
    with pytest.raises(ValueError, match=r"--pp 0 is invalid: .* 1\.\.1024"):
        plan_prompt(p, 100, 0)
    with pytest.raises(ValueError, match=r"--pp 100000 is invalid: .* 1\.\.1024"):
        plan_prompt(p, 100, 100000)
    assert [q.strategy for q in plan_prompt(p, 100, 1024)] == list(STRATEGIES)
    data = policy_dict(LatencyModel("quadratic", a=3e-7, b=0.01, c=5.0))
    data["prompt_table"]["max_prompt_len"] = 100000  # as if the profile's deepest prefix were 99999
    with pytest.raises(ValueError, match=r"--prompt-len 131072 is beyond the policy's domain .* give --extrapolate"):
        plan_prompt(from_dict(data), 131072, 2)
    assert plan_prompt(from_dict(data), 131072, 2, ("fixed",), extrapolate=True)[0].chunk_sizes == [8192] * 16


def test_replay_of_a_hand_made_latency_table_gives_the_hand_computed_ttft():
    from ppprof.policy.timeline import replay

    # Two stages, three chunks; stage 1 is slow on chunk 0, then fast; 0.5 ms to move a chunk.
    #   stage 0: [0, 3] [3, 5] [5, 9]
    #   stage 1: chunk 0 arrives 3.5 -> [3.5, 9.5]; chunk 1 arrives 5.5, stage free at 9.5 -> [9.5, 10.5];
    #            chunk 2 arrives 9.5, free at 10.5 -> [10.5, 11.5]
    start, finish = replay([[3, 2, 4], [6, 1, 1]], 0.5)
    assert start.tolist() == [[0, 3, 5], [3.5, 9.5, 10.5]]
    assert finish[-1, -1] == 11.5
    # Equal stages and no transfer: the planner's formula sum t + (P - 1) max t.
    t = [4.0, 3.0, 2.0, 2.5]
    _, finish = replay([t] * 3, 0.0)
    assert finish[-1, -1] == sum(t) + 2 * max(t)
    # Per-chunk transfer times.
    _, finish = replay([[1, 1], [1, 1]], [2.0, 0.0])
    assert finish.tolist() == [[1, 2], [4, 5]]

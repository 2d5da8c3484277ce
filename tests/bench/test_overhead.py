"""The per-chunk pipeline overhead: the solve against the replay it inverts (a known injected overhead comes back),
the fixed plans, and the summary run.json carries, from the rows the prompts measured."""

import numpy as np
import pytest

from ppprof.bench.overhead import (
    DEEP_PREFIX_CHUNKS,
    MIN_CHUNKS,
    OVERHEAD_CHUNKS,
    chunk_overhead_ms,
    median_stderr,
    overhead_chunk_sizes,
    overhead_plans,
    overhead_run,
    pipeline_overhead,
    summarize,
)
from ppprof.policy.timeline import replay


def ttft(stage_ms) -> float:
    return float(replay(stage_ms)[1][-1, -1])


@pytest.mark.parametrize("pp_size,num_chunks,seed", [(1, 8, 0), (2, 8, 1), (4, 5, 2), (8, 3, 3), (3, 1, 4)])
@pytest.mark.parametrize("injected", [0.0, 0.37, 2.5])
def test_an_injected_overhead_is_solved_back_exactly_from_the_replay(pp_size, num_chunks, seed, injected):
    rng = np.random.default_rng(seed)
    # Unequal stages and chunks, so that the critical path bends (a uniform plan would not test the closed form).
    t = rng.uniform(0.5, 6.0, (pp_size, num_chunks)) * rng.uniform(0.3, 2.0, (pp_size, 1))
    measured = ttft(t + injected)  # the pipeline, had every chunk cost `injected` more on every stage
    o = chunk_overhead_ms(t, measured)
    assert o == pytest.approx(injected, abs=1e-9), f"{o=} {injected=}"
    # The solved o, put back into the recurrence, gives the measured TTFT.
    assert ttft(t + o) == pytest.approx(measured, rel=1e-12)


def test_the_solve_is_the_root_of_the_replay_in_o_found_by_bisection():
    rng = np.random.default_rng(7)
    t = rng.uniform(1.0, 9.0, (3, 6))
    measured = ttft(t) + 11.0
    lo, hi = 0.0, 11.0
    for _ in range(100):  # replay(t + o) grows with o: bisection is the naive reference
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ttft(t + mid) < measured else (lo, mid)
    assert chunk_overhead_ms(t, measured) == pytest.approx(lo, abs=1e-9)
    assert chunk_overhead_ms(t, measured) == pytest.approx(11.0 / (6 + 3 - 1))


def test_a_pipeline_faster_than_its_stages_compose_gives_a_negative_overhead():
    t = np.full((2, 4), 3.0)  # replay: 4 x 3 + 3 = 15 ms
    assert chunk_overhead_ms(t, 10.0) == pytest.approx(-1.0)


def test_the_fixed_plans_sizes_are_b_over_4_b_and_2b_aligned_within_the_probed_range():
    assert overhead_chunk_sizes(512, 1, 2048) == [128, 512, 1024]
    assert overhead_chunk_sizes(512, 64, 2048) == [128, 512, 1024]
    assert overhead_chunk_sizes(100, 16, 112) == [16, 96, 112]  # 2B above the largest probe chunk (1.25 B): capped
    assert overhead_chunk_sizes(8, 8, 10) == [8, 10]  # B/4 below a page: a page


def test_the_plans_interleave_the_sizes_after_one_warm_up_and_fit_the_request():
    warmup, timed = overhead_plans([128, 512, 1024], 32768, 2)
    assert warmup == (128, 512, 1024)
    assert [(r, c[0], len(c)) for r, c in timed] == [
        (0, 128, 8),
        (0, 512, 8),
        (0, 1024, 8),
        (1, 512, 8),
        (1, 1024, 8),
        (1, 128, 8),
    ]
    warmup, timed = overhead_plans([128, 512, 1024], 2100, 1)
    assert warmup == (128, 512, 1024) and [len(c) for _, c in timed] == [OVERHEAD_CHUNKS, 4, 2]
    warmup, timed = overhead_plans([128, 512, 1024], 1100, 1)  # 1024 fits once only: left out
    assert warmup == (128, 512) and [c[0] for _, c in timed] == [128, 512]
    assert all(1100 // c[0] >= MIN_CHUNKS for _, c in timed)
    assert overhead_plans([512], 600, 3) == ((), [])
    assert overhead_plans([128], 32768, 0)[1] == []


def test_with_b_the_smallest_plan_runs_after_a_deep_prefix_of_b_sized_chunks():
    warmup, timed = overhead_plans([128, 512, 1024], 32768, 1, base_chunk_size=512)
    assert warmup == (128, 512, 1024)
    assert [c for _, c in timed] == [(512,) * DEEP_PREFIX_CHUNKS + (128,) * 8, (512,) * 8, (1024,) * 8]
    _, timed = overhead_plans([128, 512, 1024], 2100, 1, base_chunk_size=512)  # 2100 - 1024 holds two chunks of B
    assert timed[0][1] == (512, 512) + (128,) * 8 and sum(timed[0][1]) <= 2100
    _, timed = overhead_plans([512, 1024], 32768, 1, base_chunk_size=512)  # no size below B: no deep plan
    assert timed[0][1] == (512,) * 8
    run = overhead_run(timed[0][1][:3] + (128,), np.ones((2, 4)), 10.0, 0)
    assert run["chunk_size"] == 128 and run["chunk_sizes"] == [512, 512, 512, 128] and run["num_chunks"] == 4


def test_the_summary_is_the_median_with_its_standard_error_and_the_median_at_each_size():
    rng = np.random.default_rng(3)
    runs = []
    for repeat in range(5):
        for size, o in ((128, 0.4), (512, 0.6)):
            t = rng.uniform(1.0, 4.0, (2, 8))
            truth = o + 0.01 * rng.standard_normal()
            runs.append(overhead_run((size,) * 8, t, ttft(t + truth), repeat))
    s = summarize(runs, 2)
    values = [r["ms_per_chunk"] for r in runs]
    assert s["ms_per_chunk"] == pytest.approx(np.median(values), abs=1e-4)
    assert s["by_chunk_size"]["128"] == pytest.approx(0.4, abs=0.03)
    assert s["by_chunk_size"]["512"] == pytest.approx(0.6, abs=0.03)
    assert list(s["by_chunk_size"]) == ["128", "512"] and s["num_stages"] == 2 and len(s["runs"]) == 10
    assert 0 < s["stderr_ms"] < 0.2
    assert set(runs[0]) == {
        "chunk_size",
        "num_chunks",
        "repeat",
        "measured_ms",
        "replay_ms",
        "ms_per_chunk",
        "stage_ms",
        "chunk_sizes",
    }
    assert runs[0]["replay_ms"] < runs[0]["measured_ms"]


def test_the_standard_error_follows_the_spread():
    assert median_stderr([1.0, 1.0, 1.0]) == 0.0
    narrow, wide = median_stderr([1.0, 1.1, 0.9, 1.05]), median_stderr([1.0, 2.0, 0.0, 1.5])
    assert 0 < narrow < wide
    assert median_stderr([0.8]) == 0.8  # one run: no spread to tell, as large as the value


def test_the_phase_rows_of_every_stage_give_the_injected_overhead_back_the_warm_up_unread():
    rng = np.random.default_rng(5)
    pp_size, injected = 2, 0.3
    warmup, timed = overhead_plans([128, 512], 32768, 2)
    rows, measured = [], {}
    for index, chunks in enumerate([warmup] + [c for _, c in timed]):  # prompt 0 is the warm-up
        t = rng.uniform(1.0, 4.0, (pp_size, len(chunks)))
        measured[index] = ttft(t + injected) if index else float("nan")
        rows += [
            {"prompt": index, "stage": s, "chunk": k, "compute_ms": float(t[s, k])}
            for s in range(pp_size)
            for k in range(len(chunks))
        ]
    o = pipeline_overhead(timed, rows[::-1], measured, pp_size)  # in any order, as gathered from the ranks
    assert o["ms_per_chunk"] == pytest.approx(injected, abs=1e-3) and len(o["runs"]) == len(timed)
    assert [(r["repeat"], r["chunk_size"]) for r in o["runs"]] == [(r, c[-1]) for r, c in timed]

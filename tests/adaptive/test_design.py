"""The adaptive design (pure): D-optimal initial design, identifiability, the bootstrap's stopping rule, batches."""

import itertools

import numpy as np
import pytest

from ppprof.adaptive.design import (
    INITIAL_REQUESTS,
    MAX_REPEATS_PER_BATCH,
    DesignStep,
    check_identifiable,
    d_optimal,
    feasible,
    initial_design,
    log_det,
    prior_cost,
    regressors,
)
from ppprof.adaptive.stop import MIN_STEPS, Budget, decide
from ppprof.adaptive.uncertainty import MAX_REQUESTS, MAX_SECONDS, STABLE, bootstrap, table_differences
from ppprof.config import ChunkSettings
from ppprof.fit.least_squares import fit_model
from ppprof.fit.regress import fit_candidates
from ppprof.policy.rule import LatencyModel, build_table

TRUTH = LatencyModel("prefix", a=2.1e-6, b=0.0071, c=1.9, g=7e-5)  # tiny-hybrid on 2 CPU cores, B = 512
SETTINGS = ChunkSettings(base_chunk_size=512, context_len=32768)
PREFIXES = [0, 512, 1172, 2681, 6135, 14040, 32128]
CHUNKS = [640, 560, 480, 400, 320, 240, 160, 64]
CAND_L = np.array([p for p in PREFIXES for _ in CHUNKS])
CAND_X = np.array([c for _ in PREFIXES for c in CHUNKS])


def measure(points, noise, seed=0):
    L = np.array([p for p, _ in points])
    x = np.array([c for _, c in points])
    y = TRUTH.chunk_latency_ms(L, x) * (1 + noise * np.random.default_rng(seed).standard_normal(len(L)))
    return L, x, y


def decide_on(L, x, y, steps=MIN_STEPS, **kw):
    u = bootstrap(fit_candidates(L, x, y, "prefix")[0]["prefix"], (L, x, y), SETTINGS, 2)
    cost_s = 2 * TRUTH.chunk_latency_ms(CAND_L, CAND_X) / 1e3
    # check None: the table and predicted TTFT alone (the status checks are tested in test_step)
    step = DesignStep(u, SETTINGS, 2, (L, x), (CAND_L, CAND_X), cost_s, check=None)
    budget = Budget(**(dict(requests_run=len(L), seconds_spent=1.0, requests_per_probe=128) | kw))
    return u, decide(step, budget, steps)


def test_initial_design_determines_the_four_coefficients():
    points = initial_design(CAND_L, CAND_X, 512)
    assert len(points) == INITIAL_REQUESTS
    assert all(points.count(p) == 2 for p in points)  # every point twice: the first fit sees the noise
    L, x, y = measure(points, noise=0.0)
    check_identifiable(L, x)
    got = fit_model("prefix", L, x, y)  # exact data, so an identifiable design gives back the truth
    for key in ("a", "b", "c", "g"):
        assert getattr(got, key) == pytest.approx(getattr(TRUTH, key), rel=1e-6), f"{key=} {got=}"
    assert len(set(L.tolist())) >= 3 and len(set(x.tolist())) >= 2


@pytest.mark.parametrize(
    "L,x,match",
    [
        ([0, 1000, 2000, 0], [100, 100, 100, 200], r"rank 3, condition number inf"),  # x varies at prefix 0 only
        ([0, 0, 0, 0], [64, 128, 256, 512], r"design has 1 prefix lengths and 4 chunk sizes"),
        ([0, 512, 1024, 2048], [128, 128, 128, 128], r"design has 4 prefix lengths and 1 chunk sizes"),
    ],
)
def test_a_degenerate_design_is_refused(L, x, match):
    with pytest.raises(ValueError, match=match):
        check_identifiable(np.array(L), np.array(x))


def test_d_optimal_matches_exhaustive_search_on_a_small_grid():
    L = np.array([p for p in (0, 1000, 4000, 16000) for _ in range(3)])
    x = np.array([c for _ in range(4) for c in (64, 256, 512)])
    cost = prior_cost(L, x, 512)
    Z = regressors("prefix", L, x)
    Z = Z / np.abs(Z).max(axis=0) / np.sqrt(cost)[:, None]
    best = max(log_det(Z[list(s)]) for s in itertools.combinations(range(len(L)), 5) if feasible(L, x, list(s)))
    got = d_optimal(L, x, 5, cost)
    assert feasible(L, x, got)
    assert log_det(Z[got]) == pytest.approx(best, rel=1e-9), f"{got=}"


def test_the_stopping_rule_stops_on_a_noiseless_model_after_the_initial_design():
    L, x, y = measure(initial_design(CAND_L, CAND_X, 512), noise=0.0)
    u, decision = decide_on(L, x, y)
    assert decision.stop_reason == STABLE and decision.points == []
    assert u.stable and min(u.within_one_unit) == 1.0 and max(u.ttft_half_width) < 1e-9
    assert (u.starts, u.sizes) == build_table(TRUTH, SETTINGS, TRUTH.target_ms(512))
    assert decision.uncertainty["stable"] is True


def test_the_stopping_rule_does_not_stop_while_the_table_is_uncertain():
    # The table is robust (sizes a unit apart, the floor at B/4): it takes very noisy samples to move it by two units.
    L, x, y = measure(initial_design(CAND_L, CAND_X, 512), noise=0.5, seed=0)
    u, decision = decide_on(L, x, y)
    assert not u.table_stable, f"{u.within_one_unit=}"
    assert decision.stop_reason is None
    assert decision.points and set(decision.points) <= set(zip(CAND_L.tolist(), CAND_X.tolist()))
    assert max(decision.points.count(p) for p in decision.points) <= MAX_REPEATS_PER_BATCH
    assert len(decision.points) <= 128


def test_more_requests_where_the_batch_says_make_the_policy_certain():
    points = initial_design(CAND_L, CAND_X, 512)
    for step in range(12):
        L, x, y = measure(points, noise=0.05, seed=step)
        u, decision = decide_on(L, x, y, seconds_spent=0.5 * (step + 1))
        if decision.stop_reason:
            break
        points += decision.points
    assert decision.stop_reason == STABLE, f"{len(points)=} {u.within_one_unit=} {u.ttft_half_width=}"
    assert len(points) < 896  # fewer than the grid design's requests


def test_budgets_stop_the_design():
    L, x, y = measure(initial_design(CAND_L, CAND_X, 512), noise=0.15, seed=3)
    assert decide_on(L, x, y, max_requests=len(L))[1].stop_reason == MAX_REQUESTS
    assert decide_on(L, x, y, max_seconds=0.5)[1].stop_reason == MAX_SECONDS
    left = decide_on(L, x, y, max_requests=len(L) + 5)[1]
    assert left.stop_reason is None and len(left.points) <= 5


def test_table_differences_count_stretches_beyond_one_unit():
    a = {"prefix_len": [0, 100, 1000], "chunk_size": [512, 448, 256]}
    b = {"prefix_len": [0, 100, 500, 2000], "chunk_size": [512, 384, 256, 128]}
    # stretches: [0,100) same; [100,500) 448 vs 384 (one unit); [500,1000) 448 vs 256; [1000,2000) 256 vs 256;
    # [2000, ...) 256 vs 128
    assert table_differences(a, b, 64) == (2, 5)
    assert table_differences(a, a, 64) == (0, 3)

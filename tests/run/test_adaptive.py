"""Rank 0's choice between probes of the adaptive design (ppprof.run.adaptive.choose), in process."""

import time
from types import SimpleNamespace

from ppprof.config import ProfileConfig
from ppprof.fit.uncertainty import MAX_REQUESTS
from ppprof.probe.synth import make_probes


def fake_run(**cfg):
    return SimpleNamespace(cfg=ProfileConfig(design="adaptive", **cfg), info=SimpleNamespace(world_size=2),
                           state={"t_probes": time.perf_counter()})


def timings(probe, latency):
    """stage_ms[probe][stage][request] and e2e_ms[probe][request] of one probe with these stage-0 latencies."""
    lat = [latency(r.prefix_len, r.chunk_size) for r in probe.requests]
    return [[lat, [0.5 * v for v in lat]]], [[2.1 * v for v in lat]]


def test_samples_that_do_not_determine_the_model_run_the_initial_design_again_within_the_budget():
    from ppprof.run.adaptive import choose

    run = fake_run()
    probes = make_probes(run.cfg)
    stage_ms, e2e_ms = timings(probes[0], lambda L, x: 50.0 - 0.05 * x - 1e-3 * L)  # faster with more work
    decision = choose(run, probes, stage_ms, e2e_ms, 0.5)
    assert decision.stop_reason is None and decision.uncertainty is None
    assert decision.points == [(r.prefix_len, r.chunk_size) for r in probes[0].requests]
    run = fake_run(max_requests=len(probes[0].requests))
    assert choose(run, probes, stage_ms, e2e_ms, 0.5).stop_reason == MAX_REQUESTS


def test_a_prefix_model_is_fitted_and_the_next_batch_comes_from_the_candidate_grid():
    from ppprof.probe.synth import candidate_grid
    from ppprof.run.adaptive import choose

    run = fake_run()
    probes = make_probes(run.cfg)
    rng = iter(range(1000))
    stage_ms, e2e_ms = timings(probes[0], lambda L, x: (2.0 + 7e-3 * x + 2e-6 * (2 * L * x + x * x) + 7e-5 * L)
                               * (1 + 0.3 * ((next(rng) % 3) - 1)))  # +-30%: not certain yet
    decision = choose(run, probes, stage_ms, e2e_ms, 0.5)
    assert decision.stop_reason is None and decision.points
    assert set(decision.points) <= set(zip(*candidate_grid(run.cfg)))
    assert decision.uncertainty["model"] == "prefix" and not decision.uncertainty["stable"]

"""Rank 0's step of the adaptive design (ppprof.adaptive.step), in process, on samples.csv files written as a profile
writes them: the choice between probes, and the rows and model it judges, which must be the policy fit's."""

from dataclasses import replace

import numpy as np
import pytest

from ppprof.adaptive.design import unstable_gradients
from ppprof.adaptive.probes import candidate_grid, design_probe, initial_probes
from ppprof.adaptive.status import StatusCheck, mean_ttft_gradient, status_check
from ppprof.adaptive.step import Seconds, choose, design_fit
from ppprof.adaptive.stop import MIN_STEPS
from ppprof.adaptive.uncertainty import MAX_REQUESTS, STABLE, model_terms
from ppprof.config import ProfileConfig
from ppprof.fit import fit, read_samples
from ppprof.policy.rule import LatencyModel
from ppprof.probe.output import samples_frame, write_samples


def write_run(tmp_path, probes, latency, slower_stage=1):
    """samples.csv of `probes` run on two stages: stage `slower_stage` takes latency(L, x), the other 0.9 x that
    (more on a prefix-free row: the bottleneck by total is not every row's slowest); e2e is 2.1 x. Returns
    (path, e2e_ms[probe][request])."""
    stage_ms, e2e_ms = [], []
    for probe in probes:
        lat = [latency(r.prefix_len, r.chunk_size) for r in probe.requests]
        other = [v * (1.3 if r.prefix_len == 0 else 0.9) for v, r in zip(lat, probe.requests)]
        stage_ms.append([lat, other] if slower_stage == 0 else [other, lat])
        e2e_ms.append([2.1 * v for v in lat])
    path = tmp_path / "samples.csv"
    write_samples(path, samples_frame(probes, stage_ms, e2e_ms))
    return path, e2e_ms


def test_samples_that_do_not_determine_the_model_run_the_initial_design_again_within_the_budget(tmp_path):
    cfg = ProfileConfig(design="adaptive")
    probes = initial_probes(cfg)
    path, e2e_ms = write_run(tmp_path, probes, lambda L, x: 200.0 - 0.02 * x - 1e-3 * L)  # faster with more work
    decision = choose(cfg, 2, probes, read_samples(path), e2e_ms, Seconds(0.5, 0.5))
    assert decision.stop_reason is None and decision.uncertainty is None
    assert decision.points == [(r.prefix_len, r.chunk_size) for r in probes[0].requests]
    cfg = ProfileConfig(design="adaptive", max_requests=len(probes[0].requests))
    assert choose(cfg, 2, probes, read_samples(path), e2e_ms, Seconds(0.5, 0.5)).stop_reason == MAX_REQUESTS


def test_a_model_is_fitted_and_the_next_batch_comes_from_the_candidate_grid(tmp_path):
    cfg = ProfileConfig(design="adaptive")
    probes = initial_probes(cfg)
    rng = iter(range(1000))
    path, e2e_ms = write_run(
        tmp_path,
        probes,
        lambda L, x: (2.0 + 7e-3 * x + 2e-6 * (2 * L * x + x * x) + 7e-5 * L) * (1 + 0.3 * ((next(rng) % 3) - 1)),
    )  # +-30%: not certain yet
    decision = choose(cfg, 2, probes, read_samples(path), e2e_ms, Seconds(0.5, 0.5))
    assert decision.stop_reason is None and decision.points
    assert set(decision.points) <= set(zip(*candidate_grid(cfg)))
    assert not decision.uncertainty["stable"]


IDLE = {"load_rule": False}
"""The fits here are the design's: no under-load rule (the serving simulation is the fit's slowest part)."""

PAIRS = LatencyModel("pairs", a=2e-6, b=7e-3, c=2.0, g=7e-5, h=4e-9)
"""A truth only the pairs model fits: the attention cost per query-key pair grows with the chunk."""


@pytest.mark.parametrize("slower_stage", [0, 1])
def test_the_design_judges_the_rows_and_the_model_of_the_policy_fitted_to_the_samples_it_wrote(tmp_path, slower_stage):
    cfg = ProfileConfig(design="adaptive", base_chunk_size=512)
    probes = initial_probes(cfg)
    cand = list(zip(*candidate_grid(cfg)))
    probes.append(design_probe(1, 1, cand[::3], 100, cfg.probes.seed))
    noise = iter(np.random.default_rng(0).normal(0.0, 0.01, 1000))
    path, _ = write_run(
        tmp_path, probes, lambda L, x: float(PAIRS.chunk_latency_ms(L, x)) * (1 + next(noise)), slower_stage
    )
    samples = read_samples(path)
    _, policy = fit(
        path, tmp_path / "policy.json", base_chunk_size=512, context_len=cfg.probes.context_len, policy_options=IDLE
    )
    diag = policy["report"]["diagnostics"]
    step = design_fit(cfg, 2, samples)

    # The rows: the fit's bottleneck stage (the larger total, though stage 0 is slower on the prefix-free rows) ...
    assert diag["bottleneck_stage"] == samples.bottleneck_stage == slower_stage
    # ... less the warm-up rows the fit dropped (row 0, which ran cold, and the first prefix-free row).
    dropped = [r - 1 for r in diag["dropped_warmup_rows"]]
    assert dropped and len(step.used) == len(samples) - len(dropped)
    kept = np.setdiff1d(np.arange(len(samples)), dropped)
    for column in ("prefix_len", "chunk_size", "chunk_latency_ms"):
        np.testing.assert_array_equal(getattr(step.used, column), getattr(samples, column)[kept], err_msg=column)
    # The model: the one policy.json picked (pairs, not the prefix model it contains), with its very coefficients.
    model = LatencyModel.from_dict(policy["latency_model"])
    assert model.name == "pairs"
    assert step.uncertainty.model == model, f"{step.uncertainty.model=} {model=}"
    assert step.uncertainty.to_dict()["model"] == "pairs"
    assert set(step.uncertainty.coefficients) == {"c", "g", "b", "a", "h"}


CLEAR = LatencyModel("prefix", a=1e-6, b=7e-3, c=0.5, g=2e-4)
"""A surface on which the prompt-aware rule gains a clear 3% over the best fixed chunk at PP2."""
NO_GAIN = LatencyModel("prefix", a=1e-6, b=7e-3, c=0.5, g=0.0)
"""One on which it gains about 1.2%: static."""


def run_design(tmp_path, truth, num_probes, sigma=0.01):
    """samples.csv of the initial probe and `num_probes - 1` design probes of candidates, timed on `truth` with
    lognormal noise; returns (cfg, probes, path, e2e_ms)."""
    cfg = ProfileConfig(design="adaptive", base_chunk_size=512)
    cand = list(zip(*candidate_grid(cfg)))
    probes = initial_probes(cfg)
    for k in range(1, num_probes):
        probes.append(design_probe(k, k, cand[k - 1 :: 2], 1000 * k, cfg.probes.seed))
    noise = iter(np.random.default_rng(0).normal(0.0, sigma, 5000))
    path, e2e_ms = write_run(tmp_path, probes, lambda L, x: float(truth.chunk_latency_ms(L, x)) * np.exp(next(noise)))
    return cfg, probes, path, e2e_ms


@pytest.mark.parametrize("truth,status", [(CLEAR, "dynamic"), (NO_GAIN, "static")])
def test_the_design_stops_once_the_status_the_fit_writes_is_sure(tmp_path, truth, status):
    cfg, probes, path, e2e_ms = run_design(tmp_path, truth, MIN_STEPS)
    decision = choose(cfg, 2, probes, read_samples(path), e2e_ms, Seconds(0.5, 5.0))
    assert decision.stop_reason == STABLE and decision.points == []
    judged = decision.uncertainty["status"]
    assert judged["status"] == status and judged["sure"], judged
    # The status judged is the one the profile's fit writes on the same samples.
    _, policy = fit(
        path, tmp_path / "policy.json", base_chunk_size=512, context_len=cfg.probes.context_len, policy_options=IDLE
    )
    assert policy["status"] == status
    assert judged["gain"] == pytest.approx(policy["report"]["predicted"]["gain_vs_fixed_best"])
    assert judged["gain_lower"] == pytest.approx(policy["report"]["predicted"]["gain_interval"]["lower"])


def test_a_sure_status_does_not_stop_the_design_before_its_third_probe(tmp_path):
    cfg, probes, path, e2e_ms = run_design(tmp_path, CLEAR, MIN_STEPS - 1)
    decision = choose(cfg, 2, probes, read_samples(path), e2e_ms, Seconds(0.5, 5.0))
    assert decision.uncertainty["status"]["sure"]
    assert decision.stop_reason is None and decision.points


def test_a_status_the_samples_cannot_tell_asks_for_a_batch_aimed_at_its_gain(tmp_path):
    cfg, probes, path, e2e_ms = run_design(tmp_path, PAIRS, MIN_STEPS, sigma=0.3)
    samples = read_samples(path)
    check = status_check(cfg, 2, samples, None)
    assert check.interval is not None and not check.sure, check.to_dict()
    # A static policy carries the best fixed chunk; the gain, and so its gradient, is the prompt-aware rule's.
    assert check.status == "static" and np.linalg.norm(check.gradient) > 0
    decision = choose(cfg, 2, probes, samples, e2e_ms, Seconds(0.5, 5.0))
    assert decision.stop_reason is None and decision.points
    u = design_fit(cfg, 2, samples).uncertainty
    G, need = unstable_gradients(u, cfg.chunk_settings(), 2, check)
    np.testing.assert_allclose(G[0], check.gradient / check.tolerance())  # the gain comes first ...
    assert 0 < need[0] < 1  # ... and its variance must shrink


def test_the_gain_gradient_is_the_gain_differentiated_with_the_plans_held():
    model = LatencyModel("pairs", a=2e-6, b=7e-3, c=2.0, g=7e-5, h=4e-9)
    plans, weights = [[512, 512, 384, 256], [1024, 64], [128]], [0.5, 0.3, 0.2]
    calibration = {"linear_scale": 0.9, "shift_ms": 0.2}

    def total(m):
        return mean_ttft_gradient(m, m.planning(calibration, 0.5), plans, weights, 4, 0.9)[0]

    _, grad = mean_ttft_gradient(model, model.planning(calibration, 0.5), plans, weights, 4, 0.9)
    for i, term in enumerate(model_terms("pairs")):
        step = 1e-3 * abs(getattr(model, term))
        up, down = (replace(model, **{term: getattr(model, term) + s}) for s in (step, -step))
        assert grad[i] == pytest.approx((total(up) - total(down)) / (2 * step), rel=1e-6), term


@pytest.mark.parametrize(
    "status,interval,sure",
    [
        ("dynamic", {"lower": 0.021, "upper": 0.03, "share_above_threshold": 0.95}, True),
        ("static", {"lower": -0.01, "upper": 0.019, "share_above_threshold": 0.05}, True),
        ("static", {"lower": 0.01, "upper": 0.03, "share_above_threshold": 0.5}, False),
        ("static", None, False),  # a failed check: more samples may bear the form out
    ],
)
def test_which_statuses_are_sure(status, interval, sure):
    check = StatusCheck(status, "", 0.02, gain=0.025, interval=interval)
    assert check.sure is sure

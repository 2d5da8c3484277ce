"""Rank 0's step of the adaptive design (ppprof.adaptive.step), in process, on samples.csv files written as a profile
writes them: the choice between probes, and the rows and model it judges, which must be the policy fit's."""

import numpy as np
import pytest

from ppprof.adaptive.probes import candidate_grid, design_probe, initial_probes
from ppprof.adaptive.step import choose, design_fit
from ppprof.adaptive.uncertainty import MAX_REQUESTS
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
    decision = choose(cfg, 2, probes, read_samples(path), e2e_ms, 0.5, 0.5)
    assert decision.stop_reason is None and decision.uncertainty is None
    assert decision.points == [(r.prefix_len, r.chunk_size) for r in probes[0].requests]
    cfg = ProfileConfig(design="adaptive", max_requests=len(probes[0].requests))
    assert choose(cfg, 2, probes, read_samples(path), e2e_ms, 0.5, 0.5).stop_reason == MAX_REQUESTS


def test_a_model_is_fitted_and_the_next_batch_comes_from_the_candidate_grid(tmp_path):
    cfg = ProfileConfig(design="adaptive")
    probes = initial_probes(cfg)
    rng = iter(range(1000))
    path, e2e_ms = write_run(
        tmp_path,
        probes,
        lambda L, x: (2.0 + 7e-3 * x + 2e-6 * (2 * L * x + x * x) + 7e-5 * L) * (1 + 0.3 * ((next(rng) % 3) - 1)),
    )  # +-30%: not certain yet
    decision = choose(cfg, 2, probes, read_samples(path), e2e_ms, 0.5, 0.5)
    assert decision.stop_reason is None and decision.points
    assert set(decision.points) <= set(zip(*candidate_grid(cfg)))
    assert not decision.uncertainty["stable"]


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
    _, policy = fit(path, tmp_path / "policy.json", base_chunk_size=512, context_len=cfg.probes.context_len)
    diag = policy["diagnostics"]
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

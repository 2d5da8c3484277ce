"""The adaptive design and the model choice (ppprof.adaptive, ppprof.fit.crossval.choose_model, ppprof.fit.confidence's
rechosen_refits), in process on samples.csv files written as a profile writes them: the design's probes identify the
prefix term, the choice is judged at long prefixes before the count of coefficients, and a status that hangs on the
choice is not sure until the samples settle it."""

import numpy as np
import pytest

from ppprof.adaptive.design import DesignStep
from ppprof.adaptive.probes import candidate_grid, design_probe, initial_probes
from ppprof.adaptive.status import status_check
from ppprof.adaptive.step import design_fit
from ppprof.adaptive.stop import Budget, decide
from ppprof.config import ProfileConfig, sweep_chunk_sizes
from ppprof.fit import read_samples
from ppprof.fit.crossval import choose_model
from ppprof.fit.regress import fit_candidates
from ppprof.fit.selection import pick
from ppprof.policy.rule import LatencyModel
from ppprof.probe.output import samples_frame, write_samples
from ppprof.probe.synth import DESIGN, Probe, ProbeRequest

PREFIX_AWARE = LatencyModel("prefix", a=2.1e-6, b=7.1e-3, c=1.9, g=5e-4)
"""tiny-hybrid's chunk terms with a prefix term that is a quarter of a chunk's latency at the longest prefix."""
PREFIX_FREE = LatencyModel("quadratic", a=2.1e-6, b=7.1e-3, c=1.9)


def write(tmp_path, probes, latency) -> tuple:
    """samples.csv of `probes` on two stages, stage 1 the slower (latency(request)), e2e 2.1 x; (samples, e2e_ms)."""
    stage_ms, e2e_ms = [], []
    for probe in probes:
        lat = [latency(r) for r in probe.requests]
        stage_ms.append([[0.9 * v for v in lat], lat])
        e2e_ms.append([2.1 * v for v in lat])
    path = tmp_path / "samples.csv"
    write_samples(path, samples_frame(probes, stage_ms, e2e_ms))
    return read_samples(path), e2e_ms


def run_design(tmp_path, truth, sigma, max_steps=8):
    """The design from its initial probe and a prefix-free sweep of its chunk sizes (so the quadratic is a
    candidate from the start), each next probe the one `decide` chooses, until it stops; every request timed once
    on `truth` with lognormal noise. Returns (cfg, probes, samples of the last step, the last step's fit)."""
    cfg = ProfileConfig(design="adaptive", base_chunk_size=512)
    cand_L, cand_x = (np.array(v) for v in candidate_grid(cfg))
    probes = initial_probes(cfg)
    probes.append(design_probe(1, 1, [(0, int(x)) for x in np.unique(cand_x)] * 2, 1000, cfg.probes.seed))
    rng, drawn = np.random.default_rng(0), {}

    def latency(r):
        if r.rid not in drawn:
            drawn[r.rid] = float(truth.chunk_latency_ms(r.prefix_len, r.chunk_size)) * float(
                np.exp(rng.normal(0, sigma))
            )
        return drawn[r.rid]

    for _ in range(max_steps):
        samples, e2e_ms = write(tmp_path, probes, latency)
        step = design_fit(cfg, 2, samples)
        u = step.uncertainty
        cost_s = 2.1 * u.model.chunk_latency_ms(cand_L, cand_x) / 1e3
        rows = (step.used.prefix_len, step.used.chunk_size)
        design = DesignStep(u, cfg.chunk_settings(), 2, rows, (cand_L, cand_x), cost_s, check=None)
        spent = sum(map(sum, e2e_ms)) / 1e3
        decision = decide(design, Budget(len(samples), spent, 128, cfg.request_budget), steps=len(probes))
        if decision.stop_reason:
            break
        first_rid = 1 + max(r.rid for p in probes for r in p.requests)
        probes.append(design_probe(len(probes), len(probes), decision.points, first_rid, cfg.probes.seed))
    return cfg, probes, samples, step, decision


def test_the_design_identifies_the_prefix_term_and_auto_does_not_choose_the_quadratic(tmp_path):
    cfg, probes, samples, step, decision = run_design(tmp_path, PREFIX_AWARE, sigma=0.05)
    assert decision.stop_reason == "stable", decision.uncertainty["model_choice"]
    errors = decision.uncertainty["model_choice"]["term_error_over_tolerance"]
    assert decision.uncertainty["model_choice"]["settled"] and max(errors.values()) <= 1.0, errors
    # The batches after the start went mostly to prefixed cells (a quadratic's design gave them none).
    chosen = [r.prefix_len for p in probes[2:] for r in p.requests]
    assert sum(L > 0 for L in chosen) > len(chosen) / 2, chosen
    used = step.used
    fitted, _ = fit_candidates(used.prefix_len, used.chunk_size, used.chunk_latency_ms, "auto")
    name = pick(fitted, used)[0]
    g = fitted[name].model.g
    assert name != "quadratic" and g == pytest.approx(PREFIX_AWARE.g, rel=0.10), f"{name=} {g=}"
    assert step.uncertainty.model.name == name  # the model the design bootstrapped is the fit's


def test_on_a_prefix_free_surface_auto_chooses_the_quadratic(tmp_path):
    """Exact samples of the design from a surface without a prefix term: every model holds it, so the held-out
    errors, overall and at long prefixes, are within noise and the fewest coefficients decide. (On noisy samples the
    quadratic, fitted to the prefix-free rows alone, predicts long prefixes worse than the prefix model with g near
    0, which the choice then keeps.)"""
    cfg, probes, samples, step, decision = run_design(tmp_path, PREFIX_FREE, sigma=0.0, max_steps=1)
    used = step.used
    fitted, _ = fit_candidates(used.prefix_len, used.chunk_size, used.chunk_latency_ms, "auto")
    assert set(fitted) == {"quadratic", "prefix", "pairs"}
    assert pick(fitted, used)[0] == "quadratic" == step.uncertainty.model.name
    aware, _ = write(tmp_path, probes, lambda r: float(PREFIX_AWARE.chunk_latency_ms(r.prefix_len, r.chunk_size)))
    fitted, _ = fit_candidates(aware.prefix_len[1:], aware.chunk_size[1:], aware.chunk_latency_ms[1:], "auto")
    assert select_name(fitted) == "prefix"  # the same cells on a prefix-aware surface


def select_name(fitted) -> str:
    from ppprof.fit.selection import select_model

    return select_model(fitted)[0]


def test_the_choice_reads_long_prefixes_before_the_count_of_coefficients():
    # (models, replicates, folds): quadratic, prefix, pairs.
    within = np.array([[[0.050, 0.052, 0.049]], [[0.049, 0.050, 0.051]], [[0.048, 0.051, 0.050]]])
    apart = np.array([[[0.09, 0.10, 0.11]], [[0.050, 0.049, 0.051]], [[0.049, 0.051, 0.050]]])
    tied = np.array([[[0.050, 0.049, 0.051]], [[0.049, 0.051, 0.050]], [[0.051, 0.050, 0.049]]])
    clear = np.array([[[0.10, 0.11, 0.12]], [[0.05, 0.06, 0.05]], [[0.03, 0.03, 0.04]]])
    assert choose_model(within, apart).tolist() == [1]  # within noise overall: the long prefixes decide
    assert choose_model(within, tied).tolist() == [0]  # within noise there too: the fewest coefficients
    assert choose_model(clear, tied).tolist() == [2]  # beyond noise overall: the least held-out error
    both = np.concatenate([within, clear], axis=1)
    assert choose_model(both, np.concatenate([apart, tied], axis=1)).tolist() == [1, 2]  # replicates apart


def probes_of(cells_by_probe) -> list[Probe]:
    out, rid = [], 0
    for i, cells in enumerate(cells_by_probe):
        out.append(Probe(i, DESIGN, tuple(ProbeRequest(rid + k, L, x) for k, (L, x) in enumerate(cells)), i))
        rid += len(cells)
    return out


def two_noises(truth: LatencyModel, seed: int):
    """A request's latency on `truth`, lognormal noise of 0.5% without a prefix and 10% with one."""
    rng = np.random.default_rng(seed)

    def latency(r) -> float:
        noise = 0.005 if r.prefix_len == 0 else 0.1
        return float(truth.chunk_latency_ms(r.prefix_len, r.chunk_size)) * float(np.exp(rng.normal(0, noise)))

    return latency


DISAGREE = LatencyModel("prefix", a=1e-6, b=7e-3, c=0.5, g=2e-4)
"""At PP2 the prefix model gains about 3% over the best fixed chunk; the quadratic, which lacks its g, about 1.3%."""


def test_a_status_that_hangs_on_the_model_choice_is_not_sure_until_the_samples_settle_it(tmp_path):
    """A precise prefix-free sweep and one noisy request a prefixed cell: the quadratic (static) and the prefix
    models (dynamic) are within noise, so the resampled fits choose either and the interval straddles --min-gain;
    twelve requests a cell settle the choice and the status."""
    cfg = ProfileConfig(design="adaptive", base_chunk_size=512)
    sweep = [(0, int(x)) for x in sweep_chunk_sizes(512)] + [(0, 2048), (0, 1390), (0, 944)] * 2
    cells = [(L, x) for L in (6931, 14592, 30720) for x in (2048, 512, 128)]
    checks = []
    for repeats in (1, 12):
        probes = probes_of([sweep] + [cells] * repeats)
        samples, _ = write(tmp_path, probes, two_noises(DISAGREE, seed=1))
        checks.append(status_check(cfg, 2, samples, None))
    few, many = checks
    shares = few.model_shares
    assert few.model == "quadratic" and few.status == "static" and not few.sure, few.to_dict()
    assert shares.get("quadratic", 0) >= 0.1 and shares.get("prefix", 0) + shares.get("pairs", 0) >= 0.5, shares
    assert few.interval["lower"] < cfg.fit.min_gain < few.interval["upper"], few.interval
    assert many.status == "dynamic" and many.sure and many.model != "quadratic", many.to_dict()
    assert many.model_shares.get("quadratic", 0.0) == 0.0, many.model_shares

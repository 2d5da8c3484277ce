"""The policy carries the optimum (issue 20): its prompt-aware rule plans within 1% of the DP optimum at every prompt
length of a dense grid, on the committed default profile and on a GPU-sized model; its history-only table is never
above the best fixed chunk on its workload; its status is static exactly when the gain is below the threshold."""

import shutil
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from ppprof.fit.build import fit
from ppprof.fit.synthetic import SyntheticProbes, SyntheticRun, make_samples, write_run_dir
from ppprof.policy import LatencyModel, load
from ppprof.policy.optimum import Domain, bound_grid, optimum_at
from ppprof.policy.planners import chunk_latencies_ms, fixed_chunks, optimal_chunks, ttft_ms

REPO = Path(__file__).resolve().parents[2]
DEFAULT = REPO / "results" / "bench-reference" / "profile"
IDLE = {"load_rule": False}
"""The rules and the status are the idle rules': no under-load rule (the serving simulation is the fit's slowest part)."""

GPU = LatencyModel("prefix", a=3.25e-7, b=6.03e-3, c=26.1, g=5.39e-4)
"""A published 4-stage GPU deployment's chunk latency (ms, tokens), B = 8192, prompts up to 131072 tokens."""


@cache
def default_policy(pp_size: int, tmp: str):
    """The committed default profile's samples (results/bench-reference/profile: `ppprof profile` with today's code),
    fitted for `pp_size` stages (the rules are dynamic whatever they gain, so that they are built and checked)."""
    out = Path(tmp) / f"default-pp{pp_size}"
    out.mkdir(parents=True, exist_ok=True)
    for name in ("samples.csv", "run.json"):
        shutil.copy(DEFAULT / name, out / name)
    path, _ = fit(out / "samples.csv", policy_options={"pp_size": pp_size, "min_gain": 0.0, **IDLE})
    return load(path)


@cache
def gpu_policy(pp_size: int, tmp: str):
    """The GPU-sized model profiled through fit.synthetic (a sweep and prefix probes up to 4 B with 1% noise)."""
    out = Path(tmp) / f"gpu-pp{pp_size}"
    frame = make_samples(
        GPU,
        SyntheticProbes(
            base_chunk_size=8192,
            prefixes=[0, 8192, 32768, 65536, 98304, 131072],
            chunk_sizes=[1024, 4096, 8192, 16384, 32768],
            noise=0.01,
        ),
    )
    write_run_dir(
        out, frame, SyntheticRun(base_chunk_size=8192, context_len=131072, pp_size=pp_size, num_layers=32, min_gain=0.0)
    )
    path, _ = fit(out / "samples.csv", policy_options={"pp_size": pp_size, **IDLE})
    return load(path)


def dense_lengths(policy, rng) -> np.ndarray:
    """Every unit of the domain, one token past each, and 400 lengths at random."""
    rule = policy.data["prompt_table"]
    unit, top = rule["unit"], rule["max_prompt_len"]
    grid = np.arange(unit, top + 1, unit)
    return np.unique(np.concatenate([grid, grid[:-1] + 1, rng.integers(1, top + 1, 400), [1, top]]))


def ratios_to_optimum(policy) -> np.ndarray:
    """The prompt-aware rule's predicted TTFT over a lower bound of the DP optimum (chunks of whole units up to the
    largest, the last one the rest) at every dense length."""
    rule = policy.data["prompt_table"]
    dom = Domain(rule["unit"], rule["largest_chunk"], rule["max_prompt_len"])
    model, stages = policy.planning_model, policy.pp_size
    lengths = dense_lengths(policy, np.random.default_rng(0))
    lower, _ = optimum_at(model, dom, bound_grid(model, dom), lengths, stages)
    ours = np.array([ttft_ms(chunk_latencies_ms(model, policy.plan(int(n))), stages) for n in lengths])
    return ours / lower


@pytest.mark.parametrize("pp_size", [2, 4, 8])
def test_prompt_aware_rule_is_within_1_percent_of_the_optimum_on_the_default_profile(pp_size, tmp_path_factory):
    policy = default_policy(pp_size, str(tmp_path_factory.getbasetemp()))
    assert policy.status == "dynamic" and policy.pp_size == pp_size
    r = ratios_to_optimum(policy)
    assert r.max() <= 1.01, f"{r.max()=}"
    # and against the planner's own DP (the `optimal` strategy) at lengths spread over the domain
    unit, largest = policy.data["prompt_table"]["unit"], policy.data["prompt_table"]["largest_chunk"]
    model = policy.planning_model
    for n in np.linspace(1000, policy.data["prompt_table"]["max_prompt_len"], 7).astype(int):
        ours = policy.plan(int(n))
        best, _ = optimal_chunks(model, int(n), pp_size, unit, largest, [ours])
        assert ttft_ms(chunk_latencies_ms(model, ours), pp_size) <= 1.01 * ttft_ms(
            chunk_latencies_ms(model, best), pp_size
        ), f"{n=}"


@pytest.mark.parametrize("pp_size", [2, 4, 8])
def test_prompt_aware_rule_is_within_1_percent_of_the_optimum_on_a_gpu_sized_model(pp_size, tmp_path_factory):
    policy = gpu_policy(pp_size, str(tmp_path_factory.getbasetemp()))
    assert policy.status == "dynamic"
    r = ratios_to_optimum(policy)
    assert r.max() <= 1.01, f"{r.max()=}"
    assert policy.plan(8192 * 16)[0] > policy.plan(8192 * 16)[-2]  # the first chunk larger than later ones


def workload_mean(model, plans, weights, pp_size) -> float:
    return sum(w * ttft_ms(chunk_latencies_ms(model, p), pp_size) for p, w in zip(plans, weights))


@pytest.mark.parametrize("which", ["default", "gpu"])
def test_history_only_table_is_never_above_the_best_fixed_chunk_on_its_workload(which, tmp_path_factory):
    policy = (default_policy if which == "default" else gpu_policy)(4, str(tmp_path_factory.getbasetemp()))
    lengths, weights = policy.report.workload["prompt_lens"], policy.report.workload["weights"]
    model, stages = policy.planning_model, policy.pp_size
    history = workload_mean(model, [policy.plan_history(n) for n in lengths], weights, stages)
    unit, largest = policy.data["prompt_table"]["unit"], policy.data["prompt_table"]["largest_chunk"]
    fixed = {
        x: workload_mean(model, [fixed_chunks(x, n) for n in lengths], weights, stages)
        for x in range(unit, largest + 1, unit)
    }
    assert history <= min(fixed.values()) * (1 + 1e-12), (history, min(fixed.values()))
    predicted = policy.report.predicted
    assert predicted["mean_ttft_ms"]["policy-history"] == pytest.approx(history, rel=1e-9)
    assert predicted["mean_ttft_ms"]["fixed-best"] == pytest.approx(min(fixed.values()), rel=1e-9)
    assert predicted["mean_ttft_ms"]["policy"] <= history * (1 + 1e-12)


def test_status_is_static_exactly_when_the_gain_or_its_lower_bound_is_below_the_threshold(tmp_path):
    frame = make_samples(
        GPU,
        SyntheticProbes(
            base_chunk_size=2048, prefixes=[0, 4096, 16384, 32768], chunk_sizes=[512, 2048, 8192], noise=0.01
        ),
    )
    write_run_dir(tmp_path, frame, SyntheticRun(base_chunk_size=2048, context_len=32768, pp_size=4))
    samples = tmp_path / "samples.csv"
    _, data = fit(samples, tmp_path / "any.json", policy_options={"min_gain": 0.0, **IDLE})
    gain, lower = (
        data["report"]["predicted"]["gain_vs_fixed_best"],
        data["report"]["predicted"]["gain_interval"]["lower"],
    )
    assert 0.0 < lower < gain < 0.9, (lower, gain)
    _, below = fit(samples, tmp_path / "below.json", policy_options={"min_gain": lower * 0.999, **IDLE})
    _, between = fit(samples, tmp_path / "between.json", policy_options={"min_gain": (lower + gain) / 2, **IDLE})
    _, above = fit(samples, tmp_path / "above.json", policy_options={"min_gain": gain * 1.001, **IDLE})
    assert below["status"] == "dynamic" and f"gain {gain:.1%}" in below["reason"], below["reason"]
    assert between["status"] == "static" and "cannot tell it from no gain" in between["reason"], between["reason"]
    assert above["status"] == "static" and "no gain" in above["reason"], above["reason"]
    best = above["report"]["predicted"]["fixed_best_chunk"]
    assert above["table"]["chunk_size"] == [best] and load(tmp_path / "above.json").plan(20000) == fixed_chunks(
        best, 20000
    )

"""The bench's plans without a pipeline: the fixed sweep, each server's arm (that server's rule on its boot fit of the
profile's samples: what `ppprof tune` scores), the policy's greedy plan, the extra plans and the DP bound."""

import json

import pytest

from ppprof.bench.plans import arms, fixed_sizes
from ppprof.config import BENCH_STRATEGIES, DEFAULT_STRATEGIES
from ppprof.config.workload import parse_prompt_spec
from ppprof.fit.build import fit
from ppprof.fit.samples import read_samples
from ppprof.fit.synthetic import SyntheticProbes, SyntheticRun, make_samples, write_run_dir
from ppprof.policy import LatencyModel, from_dict
from ppprof.servers.sglang import SGLANG
from ppprof.servers.tune import tune
from ppprof.servers.tuner import Tuner

PROMPT_LENS = (6000, 20000)
TRUTH = LatencyModel("prefix", a=2e-7, b=0.01, c=2.0, g=3e-4)


def profile(tmp_path, truth):
    """A run folder of noise-free samples of `truth` and its policy (B = 2048)."""
    frame = make_samples(
        truth,
        SyntheticProbes(base_chunk_size=2048, prefixes=(2048, 8192, 16384), chunk_sizes=(256, 1024, 2048), noise=0.0),
    )
    csv = write_run_dir(tmp_path, frame, SyntheticRun(base_chunk_size=2048, context_len=32768))
    path, _ = fit(csv, latency_model="prefix")
    return from_dict(json.loads(path.read_text())), csv


def by_name(plans, prompt_len):
    return {a.name: list(a.chunk_sizes) for a in plans if a.prompt_len == prompt_len}


def test_fixed_sizes_are_b_or_the_aligned_sweep_around_it():
    assert fixed_sizes(2048, 64, sweep=False) == [2048]
    assert fixed_sizes(2048, 64, sweep=True) == [512, 1024, 2048, 4096]
    assert fixed_sizes(96, 64, sweep=True) == [64, 192], "B/4 and B/2 align down to one unit, counted once"


@pytest.mark.parametrize("server", ["sglang", "vllm-ascend"])
def test_a_servers_arm_is_the_plan_tune_scores_for_the_policys_flags(tmp_path, server):
    policy, csv = profile(tmp_path, TRUTH)
    assert policy.status == "dynamic", policy.reason
    bench = arms(policy, csv, PROMPT_LENS, (server,), 2)
    workload = parse_prompt_spec(",".join(map(str, PROMPT_LENS)))
    scored = tune(Tuner(policy, workload, 2, server, forwards=read_samples(csv)))
    assert scored["boot_fit"] == "samples"
    for n in PROMPT_LENS:
        assert by_name(bench, n)[server] == scored["plans"][str(n)]["policy"], f"{n=}"
    without = arms(policy, None, PROMPT_LENS, (server,), 2)
    by_model = tune(Tuner(policy, workload, 2, server))
    assert by_name(without, 20000)[server] == by_model["plans"]["20000"]["policy"]


def test_the_sglang_arm_is_sglangs_rule_on_sglangs_boot_fit_not_ppprofs_fit(tmp_path):
    policy, csv = profile(tmp_path, TRUTH)
    setting = SGLANG.setting_of(policy)
    want = SGLANG.chunks(setting, SGLANG.boot_fit(read_samples(csv)), policy.settings.context_len, 20000)
    assert by_name(arms(policy, csv, (20000,), ("sglang",), 2), 20000)["sglang"] == want
    # A concave prefix-free curve: SGLang's boot fit has a <= 0 and keeps fixed chunks of B, whatever ppprof fits.
    concave, csv = profile(tmp_path / "concave", LatencyModel("prefix", a=-2e-8, b=0.01, c=3.0, g=2e-4))
    plans = by_name(arms(concave, csv, (20000,), ("sglang", "greedy"), 2), 20000)
    assert plans["sglang"] == [2048] * 9 + [1568] and plans["greedy"] != plans["sglang"]


def test_every_arm_covers_its_prompt_and_the_dp_bound_beats_them_all(tmp_path):
    policy, csv = profile(tmp_path, TRUTH)
    extra = {"6000": {"mine": [1000, 5000]}}
    strategies = ("fixed", "fixed-best", "sglang", "greedy", "policy", "policy-history", "policy-load", "optimal")
    plans = arms(policy, csv, PROMPT_LENS, strategies, 4, extra)
    names = {n: {a.name for a in plans if a.prompt_len == n} for n in PROMPT_LENS}
    best = f"fixed-{policy.report.predicted['fixed_best_chunk']}"  # the policy's own best fixed chunk joins the sweep
    assert names[6000] == {
        "fixed-512",
        "fixed-1024",
        "fixed-2048",
        "fixed-4096",
        best,
        "sglang",
        "greedy",
        "policy",
        "policy-history",
        "policy-load",
        "plan-mine",
        "optimal",
    } and names[20000] == names[6000] - {"plan-mine"}
    for n in PROMPT_LENS:
        group = [a for a in plans if a.prompt_len == n]
        assert all(sum(a.chunk_sizes) == n and len(a.predicted_ms) == len(a.chunk_sizes) for a in group)
        best = next(a for a in group if a.name == "optimal").predicted_ttft_ms
        assert all(best <= a.predicted_ttft_ms + 1e-9 for a in group), f"{n=}"
    assert by_name(plans, 6000)["greedy"] == policy.sglang_plan(6000)
    assert by_name(plans, 6000)["policy"] == policy.plan(6000)
    assert by_name(plans, 20000)["policy-history"] == policy.plan_history(20000)
    assert all(by_name(plans, n)["policy-load"] == policy.plan(n) for n in PROMPT_LENS)  # a bench has no load


def test_policy_load_runs_only_when_asked_for():
    assert "policy-load" in BENCH_STRATEGIES and "policy-load" not in DEFAULT_STRATEGIES
    assert set(BENCH_STRATEGIES) - set(DEFAULT_STRATEGIES) == {"policy-load"}

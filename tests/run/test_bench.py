"""`ppprof bench` on real gloo ranks (tiny sizes, a timeout): every strategy runs, chunks add up to the prompt on every
stage, nothing leaks (the bench checks after every prompt and fails loudly), and a replayed deeper pipeline runs on
fewer ranks. Timings are never asserted."""

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from tests.multirank import run_cli

pytestmark = pytest.mark.multirank
TINY_PROFILE = ("--base-chunk-size", "256", "--requests-per-probe", "16", "--prefix-lens", "256,512", "--warmup",
                "1", "--context-len", "4096")
ARMS = {"fixed-64", "fixed-128", "fixed-256", "fixed-512", "sglang", "greedy", "optimal"}  # B = 256, alignment 64


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "run"
    r = run_cli("profile", "--out", str(out), "--model", "tiny-hybrid", *TINY_PROFILE)
    assert r.returncode == 0, r.stderr[-3000:]
    return out / "policy.json"


def best_fixed(policy) -> set[str]:
    """The arm of the policy's own best fixed chunk, which joins the fixed sweep (none where the fit failed a gate)."""
    best = (json.loads(policy.read_text())["predicted"] or {}).get("fixed_best_chunk")
    return {f"fixed-{best}"} if best else set()


def check_bench(out, prompt_lens, num_stages, arms):
    frame = pd.read_csv(out / "bench.csv")
    doc = json.loads((out / "bench.json").read_text())
    assert set(frame.arm) == set(arms), f"{set(frame.arm)=}"
    for (prompt, stage), g in frame.groupby(["prompt", "stage"]):
        assert g.chunk_size.sum() == g.prompt_len.iloc[0], f"{prompt=} {stage=}"
        assert (g.sort_values("chunk").prefix_len == g.sort_values("chunk").chunk_size.cumsum().shift(fill_value=0)
                ).all()
    assert sorted(frame.stage.unique()) == list(range(num_stages))
    assert sorted(int(k) for k in doc["prompt_lens"]) == sorted(prompt_lens)
    for entry in doc["prompt_lens"].values():
        assert set(entry["strategies"]) == {"fixed", "fixed-best", "sglang", "greedy", "optimal"} | (
            {"policy", "policy-history"} if "policy" in arms else set())
        for s in entry["strategies"].values():
            assert s["replay_ttft_ms"]["median"] > 0 and s["predicted_ttft_ms"] > 0
        assert "optimal/fixed-best" in entry["ratios"]
    for n in prompt_lens:
        assert (out / f"timeline-{n}.png").stat().st_size > 0
    return frame, doc


def test_bench_runs_every_strategy_through_the_real_pipeline(policy, tmp_path):
    out = tmp_path / "bench"
    r = run_cli("bench", str(policy), "--prompt-len", "1024", "--prompt-len", "1536", "--repeats", "2", "--out",
                str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    frame, doc = check_bench(out, [1024, 1536], 2, ARMS | {"policy", "policy-history"} | best_fixed(policy))
    assert doc["composition"] == "real and replay"
    for entry in doc["prompt_lens"].values():
        assert entry["strategies"]["fixed"]["ttft_ms"]["median"] > 0
        assert entry["strategies"]["greedy"]["replay_vs_real"] is not None
    assert "ratios (median of paired repeats)" in r.stderr


def test_a_deeper_pipeline_is_replayed_on_fewer_ranks(policy, tmp_path):
    out = tmp_path / "bench"
    r = run_cli("bench", str(policy), "--prompt-len", "1000", "--repeats", "1", "--pp", "4", "--strategies",
                "fixed,fixed-best,sglang,greedy,optimal", "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    frame, doc = check_bench(out, [1000], 4, ARMS | best_fixed(policy))
    assert doc["composition"] == "replay" and doc["num_stages"] == 4
    assert frame.groupby("stage")["rank"].first().tolist() == [0, 0, 1, 1]


@pytest.mark.parametrize("args,message", [
    (["--prompt-len", "5000"], "--prompt-len 5000 exceeds the context length 4096"),
    (["--prompt-len", "256", "--pp", "3"], "--pp 3 is not a multiple of the profile's 2 stages"),
    (["--prompt-len", "256", "--strategies", "fixed,bogus"], "--strategies 'fixed,bogus' is invalid"),
    ([], "--prompt-len is required"),
])
def test_bad_bench_input_is_one_line_exit_2(policy, tmp_path, args, message):
    out = tmp_path / "bench"
    r = CliRunner().invoke(main, ["bench", str(policy), "--out", str(out), *args])
    assert r.exit_code == 2, r.output
    assert message in r.stderr and r.stderr.count("\n") == 1
    assert not out.exists()


def test_a_policy_without_its_run_folder_is_refused(tmp_path):
    from pathlib import Path

    committed = Path(__file__).resolve().parents[2] / "results" / "profile-tiny-hybrid" / "policy.json"
    (tmp_path / "policy.json").write_text(committed.read_text())
    r = CliRunner().invoke(main, ["bench", str(tmp_path / "policy.json"), "--prompt-len", "256"])
    assert r.exit_code == 2 and "run.json does not exist" in r.stderr
    (tmp_path / "policy.json").write_text("{}")  # the policy itself is checked first, as `ppprof validate` does
    r = CliRunner().invoke(main, ["bench", str(tmp_path / "policy.json"), "--prompt-len", "256"])
    assert r.exit_code == 2 and "$.schema_version: missing" in r.stderr


def test_tune_plans_run_as_arms_beside_the_strategies(policy, tmp_path):
    """`ppprof tune --json` then `ppprof bench --plans`: the recommendation measured on the pipeline."""
    tuned = tmp_path / "tune.json"
    r = CliRunner().invoke(main, ["tune", str(policy), "--prompt-lens", "1000", "--json", "--png",
                                  str(tmp_path / "t.png")])
    assert r.exit_code == 0, r.output
    tuned.write_text(r.stdout)
    out = tmp_path / "bench"
    r = run_cli("bench", str(policy), "--plans", str(tuned), "--strategies", "fixed", "--repeats", "1",
                "--out", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "bench.json").read_text())
    arms = set(doc["prompt_lens"]["1000"]["strategies"])
    assert {"plan-recommended", "plan-best-fixed", "plan-optimal", "plan-current", "fixed"} <= arms, arms
    planned = json.loads(tuned.read_text())["plans"]["1000"]["recommended"]
    frame = pd.read_csv(out / "bench.csv")
    g = frame[(frame.arm == "plan-recommended") & (frame.stage == 0)]
    assert g[g.prompt == g.prompt.min()].sort_values("chunk").chunk_size.tolist() == planned


@pytest.mark.parametrize("plans,message", [
    ({"1000": {"x": [500, 400]}}, "chunks sum to 900, not the prompt length 1000"),
    ({"999": {"x": [999]}}, "--plans has no plan for --prompt-len 1000"),
    ({"1000": {"Bad Name": [1000]}}, "name 'Bad Name' is invalid"),
    ({"1000": {"x": [1000.0]}}, "must be a non-empty list of positive integers"),
])
def test_bad_plans_are_one_line_exit_2(policy, tmp_path, plans, message):
    path = tmp_path / "plans.json"
    path.write_text(json.dumps(plans))
    r = CliRunner().invoke(main, ["bench", str(policy), "--plans", str(path), "--prompt-len", "1000"])
    assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.output


def test_a_bench_out_that_holds_files_is_refused_unless_overwrite_and_timeout_is_checked(policy, tmp_path):
    out = tmp_path / "bench"
    out.mkdir()
    (out / "bench.csv").write_text("old")
    r = CliRunner().invoke(main, ["bench", str(policy), "--prompt-len", "1024", "--out", str(out)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert f"--out {out} is not empty (it holds bench.csv)" in r.stderr
    r = CliRunner().invoke(main, ["bench", str(policy), "--prompt-len", "1024", "--timeout", "-1"])
    assert r.exit_code == 2 and "--timeout -1.0 must be a number of seconds" in r.stderr

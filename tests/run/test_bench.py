"""`ppprof bench` on real gloo ranks (tiny sizes, a timeout): every strategy and `ppprof tune`'s plans run, chunks add
up to the prompt on every stage, nothing leaks (the bench checks after every prompt and fails loudly), and a replayed
deeper pipeline runs on fewer ranks. Timings are never asserted. The policy is the committed tiny run's
(tests/runs/tiny-hybrid); the bench's input checks, which start no rank, are in tests/run/test_bench_input.py."""

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.policy.runtime import report_of
from tests.multirank import TINY_RUN, run_cli

pytestmark = pytest.mark.multirank
ARMS = {"fixed-64", "fixed-128", "fixed-256", "fixed-512", "sglang", "greedy", "optimal"}  # B = 256, alignment 64
PLAN_ARMS = {"plan-current", "plan-policy", "plan-recommended", "plan-best-fixed", "plan-optimal"}


@pytest.fixture
def policy():
    return TINY_RUN / "policy.json"


def best_fixed(policy) -> set[str]:
    """The arm of the policy's own best fixed chunk, which joins the fixed sweep (none where the fit failed a gate)."""
    best = (report_of(json.loads(policy.read_text()))["predicted"] or {}).get("fixed_best_chunk")
    return {f"fixed-{best}"} if best else set()


def check_bench(out, prompt_lens, pp_size, arms):
    frame = pd.read_csv(out / "bench.csv")
    doc = json.loads((out / "bench.json").read_text())
    assert set(frame.arm) == set(arms), f"{set(frame.arm)=}"
    for (prompt, stage), g in frame.groupby(["prompt", "stage"]):
        assert g.chunk_size.sum() == g.prompt_len.iloc[0], f"{prompt=} {stage=}"
        assert (
            g.sort_values("chunk").prefix_len == g.sort_values("chunk").chunk_size.cumsum().shift(fill_value=0)
        ).all()
    assert sorted(frame.stage.unique()) == list(range(pp_size))
    assert sorted(int(k) for k in doc["prompt_lens"]) == sorted(prompt_lens)
    for entry in doc["prompt_lens"].values():
        assert set(entry["strategies"]) == {"fixed", "fixed-best", "sglang", "greedy", "optimal"} | (
            {"policy", "policy-history"} if "policy" in arms else set()
        ) | {a for a in arms if a.startswith("plan-")}
        for s in entry["strategies"].values():
            assert s["replay_ttft_ms"]["median"] > 0 and s["predicted_ttft_ms"] > 0
        assert "optimal/fixed-best" in entry["ratios"]
    for n in prompt_lens:
        assert (out / f"timeline-{n}.png").stat().st_size > 0
    return frame, doc


def test_bench_runs_every_strategy_and_tunes_plans_through_the_real_pipeline(policy, tmp_path):
    """Every strategy, and `ppprof tune --json`'s plans (`bench --plans`: the recommendation measured on the
    pipeline), each an arm of one bench."""
    tuned = tmp_path / "tune.json"
    r = CliRunner().invoke(
        main, ["tune", str(policy), "--prompt-lens", "1024,1536", "--json", "--png", str(tmp_path / "t.png")]
    )
    assert r.exit_code == 0, r.output
    tuned.write_text(r.stdout)
    out = tmp_path / "bench"
    r = run_cli(
        "bench",
        str(policy),
        "--prompt-len",
        "1024",
        "--prompt-len",
        "1536",
        "--repeats",
        "2",
        "--plans",
        str(tuned),
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    arms = ARMS | {"policy", "policy-history"} | best_fixed(policy) | PLAN_ARMS
    frame, doc = check_bench(out, [1024, 1536], 2, arms)
    assert doc["composition"] == "real and replay"
    for n, entry in doc["prompt_lens"].items():
        assert entry["strategies"]["fixed"]["ttft_ms"]["median"] > 0
        assert entry["strategies"]["greedy"]["replay_vs_real"] is not None
        planned = json.loads(tuned.read_text())["plans"][n]["recommended"]
        g = frame[(frame.arm == "plan-recommended") & (frame.stage == 0) & (frame.prompt_len == int(n))]
        assert g[g.prompt == g.prompt.min()].sort_values("chunk").chunk_size.tolist() == planned
    assert "ratios (median of paired repeats)" in r.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["recorded"] == "by the command" and "bench" in manifest["command"], manifest


def test_a_deeper_pipeline_is_replayed_on_fewer_ranks(policy, tmp_path):
    out = tmp_path / "bench"
    r = run_cli(
        "bench",
        str(policy),
        "--prompt-len",
        "1000",
        "--repeats",
        "1",
        "--pp",
        "4",
        "--strategies",
        "fixed,fixed-best,sglang,greedy,optimal",
        "--out",
        str(out),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    frame, doc = check_bench(out, [1000], 4, ARMS | best_fixed(policy))
    assert doc["composition"] == "replay" and doc["num_stages"] == 4
    assert frame.groupby("stage")["rank"].first().tolist() == [0, 0, 1, 1]

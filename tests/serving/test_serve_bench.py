"""`ppprof serve-bench --simulate`: every arm at every level, serving.json with its manifest, written atomically; a
policy without a latency model is refused in one line."""

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.config.workload import Workload
from ppprof.policy import load
from ppprof.serving.arms import SERVING_ARMS
from ppprof.serving.levels import ServingPlan, parse_levels, simulate_levels

POLICY = Path(__file__).resolve().parents[1] / "runs/tiny-hybrid/policy.json"


def test_every_arm_at_every_level_into_serving_json(tmp_path):
    out = tmp_path / "serving.json"
    args = ["serve-bench", str(POLICY), "--simulate", "--concurrency", "1,4", "--num-prompts", "12", "--out", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert doc["manifest"]["command"] and doc["mode"] == "simulated" and doc["pp_size"] == 2
    assert list(doc["levels"]) == ["concurrency-1", "concurrency-4"]
    for arms in doc["levels"].values():
        assert list(arms) == list(SERVING_ARMS)
        for s in arms.values():
            assert s["num_requests"] == 12 and s["throughput_tokens_per_s"] > 0
            assert s["ttft_ms"]["p50"] <= s["ttft_ms"]["p90"] <= s["ttft_ms"]["p99"]
            assert len(s["ttft_ms_by_request"]) == 12 and max(s["ttft_ms_by_request"]) == pytest.approx(
                s["ttft_ms"]["p99"], rel=0.2
            )
    busy = doc["levels"]["concurrency-4"]["policy-history"]
    assert busy["requests_per_batch"] > 1  # waiting requests packed beside the chunked one
    assert "concurrency-4" in r.output and "policy-history" in r.output
    assert (tmp_path / "serving.png").stat().st_size > 0 and (tmp_path / "serving-ttft.png").stat().st_size > 0


def test_poisson_levels_and_a_chosen_workload(tmp_path):
    out = tmp_path / "s.json"
    args = ["serve-bench", str(POLICY), "--simulate", "--request-rate", "5,50", "--num-prompts", "10"]
    args += ["--prompt-lens", "1024:1,3072:1", "--strategies", "fixed,policy", "--out", str(out)]
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 0, r.output
    doc = json.loads(out.read_text())
    assert list(doc["levels"]) == ["rate-5", "rate-50"] and doc["workload"]["prompt_lens"] == [1024, 3072]
    assert list(doc["levels"]["rate-5"]) == ["fixed", "policy"]


def test_a_policy_without_a_latency_model_is_refused():
    policy = dataclasses.replace(load(POLICY), planning_model=None)
    plan = ServingPlan(tuple(parse_levels("1", None)), ("fixed",), Workload((1024,), (1.0,)), 4, 2)
    with pytest.raises(ValueError, match="has no latency model"):
        simulate_levels(policy, plan)

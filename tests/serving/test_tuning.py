"""`ppprof tune --concurrency`: each server setting scored under load in the serving simulation as well as alone,
the search minimising both (the geometric mean of the mean TTFTs), and the command's output and bad input."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.commands.tune import echo_tune
from ppprof.config.workload import parse_prompt_spec
from ppprof.policy import LatencyModel, from_dict
from ppprof.servers.tune import tune
from ppprof.servers.tuner import Tuner
from ppprof.serving.arms import packed_stage_ms
from ppprof.serving.scheduler import Capacity
from ppprof.serving.simulate import Arrivals, LoadLevel, prompts_of, serve
from ppprof.serving.tuning import load_scorer, policy_load_figures
from ppprof.serving.underload import LOAD_PROMPTS, LOAD_SEED

from ..policy.policy_helpers import policy_dict

MODEL = LatencyModel("prefix", a=1.5e-6, b=0.01, c=6.0, g=4e-4)
"""A fixed cost of 6 ms a forward: under load, batches of more tokens pay it less often."""
LEVELS = (4,)
PP = 4


@pytest.fixture(scope="module")
def policy():
    data = policy_dict(MODEL, base_chunk_size=1024, context_len=8192, pp_size=PP)
    data["report"]["domain"] = {"prefix_len": [0, 8000], "chunk_size": [64, 4096]}
    return from_dict(data)


@pytest.fixture(scope="module")
def workload(policy):
    return parse_prompt_spec("2048,6144", policy.settings.context_len)


@pytest.fixture(scope="module")
def busy(policy, workload):
    return tune(Tuner(policy, workload, PP, "sglang", load_score=load_scorer(policy, workload, PP, LEVELS)))


def test_a_fixed_setting_under_load_is_its_fixed_chunks_served(policy, workload, busy):
    fixed = busy["settings"]["best fixed"]
    size = busy["plans"]["6144"]["best-fixed"][0]
    prompts = prompts_of(workload.prompt_lens, workload.weights, max(LOAD_PROMPTS, 2 * max(LEVELS)), LOAD_SEED)
    stage_ms = packed_stage_ms(policy.planning_model, PP, policy.extra_piece_ms)
    for level in LEVELS:
        capacity = Capacity(max(prompts) * level, level)
        want = serve(PP, lambda *_: size, stage_ms, capacity, Arrivals(prompts, LoadLevel(concurrency=level))).summary()
        got = fixed["load"][f"concurrency-{level}"]
        assert got["throughput_tokens_per_s"] == want["throughput_tokens_per_s"]
        assert got["ttft_mean_ms"] == want["ttft_ms"]["mean"] and got["ttft_p90_ms"] == want["ttft_ms"]["p90"]


def test_the_recommendation_weighs_the_load_and_beats_every_row_on_it(policy, workload, busy):
    alone = tune(Tuner(policy, workload, PP, "sglang"))
    assert "load" not in alone["settings"]["recommended"] and "objective_gain" not in alone
    rows = busy["settings"]
    objective = {k: float(np.exp(np.mean(np.log(objectives(r))))) for k, r in rows.items()}
    assert all(objective["recommended"] <= v + 1e-9 for v in objective.values()), objective
    assert busy["objective_gain"]["vs_best_fixed"] >= 0.0
    # alone, the least mean TTFT; with the load, a setting that gives some of it up for the loaded level
    assert alone["settings"]["recommended"]["mean_ttft_ms"] <= rows["recommended"]["mean_ttft_ms"]
    assert busy["settings"]["recommended"]["objective_ms"] == pytest.approx(objective["recommended"])


def test_the_text_shows_each_level(busy, capsys):
    echo_tune(busy | {"png": "t.png"}, Path("policy.json"))
    out = capsys.readouterr().out
    assert "under load (serving simulation)" in out and "concurrency-4 server default:" in out
    assert "recommended under load and alone" in out


def objectives(row: dict) -> list[float]:
    return [row["mean_ttft_ms"], *(level["ttft_mean_ms"] for level in row["load"].values())]


def test_tune_command_under_load_and_its_bad_input(tmp_path):
    path = tmp_path / "policy.json"
    data = policy_dict(MODEL, base_chunk_size=1024, context_len=8192, pp_size=PP)
    data["report"]["domain"] = {"prefix_len": [0, 8000], "chunk_size": [64, 4096]}
    path.write_text(json.dumps(data))
    args = ["tune", str(path), "--prompt-lens", "2048,6144", "--pp", str(PP), "--png", str(tmp_path / "t.png")]
    r = CliRunner().invoke(main, [*args, "--concurrency", "2", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert all(set(row["load"]) == {"concurrency-2"} for row in out["settings"].values())
    # ppprof's own sizer on the same prompts, beside the server's settings: the policy-load arm
    policy = from_dict(data)
    assert out["policy_load"] == policy_load_figures(policy, parse_prompt_spec("2048,6144", 8192), PP, [2])
    r = CliRunner().invoke(main, [*args, "--concurrency", "2"])
    assert r.exit_code == 0 and "policy-load: " in r.output, r.output
    for bad in ("0", "two", "2,,4"):
        r = CliRunner().invoke(main, [*args, "--concurrency", bad])
        assert r.exit_code == 2 and "--concurrency" in r.output and "Traceback" not in r.output, r.output
        assert len(r.output.strip().splitlines()) == 1, r.output

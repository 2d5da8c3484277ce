"""`ppprof tune`: the search and its guarantees (never worse than the current setting, never better than the DP
bound), the servers' boot fits, and the command."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.config.workload import parse_prompt_spec
from ppprof.policy import LatencyModel, from_dict
from ppprof.servers import SERVERS
from ppprof.servers.tune import tune
from ppprof.servers.tuner import Tuner, cut

from .helpers import policy_dict

PREFIX = LatencyModel("prefix", a=1.5e-6, b=0.01, c=2.0, g=4e-4)
DOMAIN = {"prefix_len": [0, 60000], "chunk_size": [64, 16384]}


def policy(model=PREFIX, **settings):
    data = policy_dict(model, **{"base_chunk_size": 4096, "context_len": 65536, **settings})
    data["report"]["domain"] = DOMAIN
    return from_dict(data)


@pytest.mark.parametrize("server", SERVERS)
def test_recommendation_beats_current_and_never_the_bound(server):
    p = policy()
    workload = parse_prompt_spec("8192:2,24576,60000", 65536)
    currents = {
        "sglang": "--chunked-prefill-size 4096 --enable-dynamic-chunking",
        "vllm-ascend": "--max-num-batched-tokens 16384",
        "atom": "--max-num-batched-tokens 8192",
    }
    for current in (None, currents[server]):
        r = tune(Tuner(p, workload, 4, server), current)
        settings = r["settings"]
        first = "current" if current else "server default"
        rec, cur, fixed = settings["recommended"], settings[first], settings["best fixed"]
        assert rec["mean_ttft_ms"] <= cur["mean_ttft_ms"] + 1e-9
        assert rec["mean_ttft_ms"] <= fixed["mean_ttft_ms"] + 1e-9
        for mine, bound in zip(rec["per_prompt"], r["optimal"]["per_prompt"]):
            assert bound["ttft_ms"] <= mine["ttft_ms"] + 1e-9
        for n, plans in r["plans"].items():
            assert all(sum(c) == int(n) for c in plans.values())
            assert max(plans["recommended"]) <= DOMAIN["chunk_size"][1]
        assert r["gain"]["vs_current"] >= 0 and r["gap_to_optimal"] >= -1e-12


def test_a_prefix_heavy_model_is_told_to_chunk_dynamically():
    """With a large attention term, equal-latency chunks beat every fixed chunk over long prompts."""
    r = tune(Tuner(policy(LatencyModel("prefix", a=2e-5, b=0.005, c=1.0, g=0.0)), parse_prompt_spec("60000"), 8))
    assert r["recommended"]["setting"]["dynamic"]
    assert r["settings"]["recommended"]["mean_ttft_ms"] < r["settings"]["best fixed"]["mean_ttft_ms"]
    assert "--enable-dynamic-chunking" in r["recommended"]["command"]


def test_tune_command_text_json_plot_and_bad_input(tmp_path):
    path = tmp_path / "policy.json"
    data = policy_dict(PREFIX, base_chunk_size=4096, context_len=65536)
    data["report"]["domain"] = DOMAIN
    path.write_text(json.dumps(data))
    r = CliRunner().invoke(main, ["tune", str(path), "--prompt-lens", "8192,32768", "--pp", "4"])
    assert r.exit_code == 0, r.output
    # The recommended flags set the layout tuned for: the stages asked for, the profile's TP degree.
    r8 = CliRunner().invoke(
        main,
        [
            "tune",
            str(path),
            "--prompt-lens",
            "8192",
            "--pp-size",
            "8",
            "--json",
            "--current",
            "--pp-size 8 --tp-size 1 --chunked-prefill-size 4096",
        ],
    )
    assert r8.exit_code == 0, r8.output
    assert json.loads(r8.stdout)["recommended"]["args"][:4] == ["--pp-size", "8", "--tp-size", "1"]
    assert "--tp-size" not in " ".join(json.loads(r8.stdout)["notes"])  # a layout flag is not "ignored"
    assert "recommended SGLang flags:" in r.stdout and "DP-optimal bound" in r.stdout
    assert (tmp_path / "policy.tune-sglang.png").stat().st_size > 0
    r = CliRunner().invoke(
        main,
        ["tune", str(path), "--prompt-lens", "8192", "--server", "atom", "--json", "--png", str(tmp_path / "a.png")],
    )
    doc = json.loads(r.stdout)
    assert doc["server"] == "atom" and set(doc["plans"]["8192"]) == {
        "current",
        "policy",
        "recommended",
        "best-fixed",
        "optimal",
    }
    before = sorted(tmp_path.iterdir())
    for args, message in [
        (["--prompt-lens", "8192;1"], "--prompt-lens '8192;1' is neither"),
        (["--prompt-lens", "8192", "--pp", "0"], "--pp 0 is invalid"),
        (["--prompt-lens", "8192", "--current", "--chunked-prefill-size x"], "is not an integer"),
        (
            ["--prompt-lens", "8192", "--current", "--tp-size 8 --chunked-prefill-size 4096"],
            "--current sets TP degree 8 but the policy was profiled at --tp-size 1",
        ),
        (
            ["--prompt-lens", "8192", "--current", "--pp-size 2"],
            "--current sets 2 pipeline stages but tune plans for 4: give --pp-size 2",
        ),
        (["--prompt-lens", "8192", "--current", "--tp-size two"], "--tp-size 'two' is not"),
    ]:
        r = CliRunner().invoke(main, ["tune", str(path), *args])
        assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1, (args, r.output)
    assert sorted(tmp_path.iterdir()) == before


def test_the_servers_boot_fit_comes_from_the_profiles_samples(tmp_path):
    """Beside samples.csv, SGLang's boot fit is SGLang's fit of them: a concave prefix-free curve turns it off."""
    from ppprof.fit.synthetic import SyntheticProbes, SyntheticRun, make_samples, write_run_dir

    truth = LatencyModel("prefix", a=-2e-8, b=0.01, c=3.0, g=2e-4)
    frame = make_samples(
        truth,
        SyntheticProbes(base_chunk_size=2048, prefixes=(2048, 8192, 16384), chunk_sizes=(256, 1024, 2048), noise=0.0),
    )
    csv = write_run_dir(tmp_path, frame, SyntheticRun(base_chunk_size=2048))
    r = CliRunner().invoke(main, ["fit", str(csv), "--latency-model", "quadratic", "-o", str(tmp_path / "q.json")])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["fit", str(csv), "--latency-model", "prefix"])
    assert r.exit_code == 0, r.output
    policy_path = str(tmp_path / "policy.json")
    r = CliRunner().invoke(main, ["tune", policy_path, "--prompt-lens", "8000", "--json"])
    doc = json.loads(r.stdout)
    assert doc["boot_fit"] == "samples" and "it keeps fixed chunks" in doc["notes"][0]
    assert not doc["recommended"]["setting"]["dynamic"] and not doc["settings"]["policy"]["setting"]["dynamic"]
    r = CliRunner().invoke(main, ["tune", policy_path, "--prompt-lens", "8000", "--json", "--boot-fit", "model"])
    assert json.loads(r.stdout)["boot_fit"] == "model"


def test_a_longer_prompts_chunks_cut_into_a_shorter_ones():
    from ppprof.chunks import walk

    chunks = np.asarray(walk(lambda L: 100 if L < 300 else 50, 1000))
    assert chunks.sum() == 1000 and list(chunks[:4]) == [100, 100, 100, 50]
    for n in (1, 99, 100, 101, 350, 1000):
        plan = cut(chunks, n)
        assert plan.sum() == n and list(plan[:-1]) == list(chunks[: len(plan) - 1]), f"{n=} {plan=}"


def test_when_the_users_own_flags_win_their_calibration_is_the_one_recommended(monkeypatch):
    """ATOM's flags carry a calibration: where the user's current flags score best, the recommended command must
    carry the calibration they were scored with, not ppprof's."""
    from ppprof.servers.tuner import Scored, Tuner

    search = Tuner.search

    def worse_search(self, inside):  # every searched candidate made slower than anything the user could give
        best, best_fixed = search(self, inside)
        return (
            Scored(best.setting, best.label, best.ttft_ms * 10, best.mean_ms * 10, best.p90_ms * 10, best.plans),
            best_fixed,
        )

    monkeypatch.setattr(Tuner, "search", worse_search)
    mine = "3e-06,0.02,1,0.0002"
    current = (
        f"--enable-dynamic-chunking --dynamic-chunking-base-size 4096 --max-num-batched-tokens 4096 "
        f"--dynamic-chunking-calibration {mine}"
    )
    r = tune(Tuner(policy(), parse_prompt_spec("8192,32768"), 4, "atom"), current)
    assert r["recommended"]["setting"] == r["settings"]["current"]["setting"]
    assert f"--dynamic-chunking-calibration {mine}" in r["recommended"]["command"], r["recommended"]["command"]

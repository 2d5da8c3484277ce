"""`ppprof bench`'s input checks, before any rank starts: a bad flag or plan, an --out that holds files, a policy
without its run folder; each one line, exit 2, nothing written. The policy is the committed tiny run's."""

import json

import pytest
from click.testing import CliRunner

from ppprof.cli import main
from tests.multirank import TINY_RUN

POLICY = TINY_RUN / "policy.json"


@pytest.mark.parametrize(
    "args,message",
    [
        (["--prompt-len", "5000"], "--prompt-len 5000 exceeds the context length 4096"),
        (["--prompt-len", "256", "--pp", "3"], "--pp 3 is not a multiple of the profile's 2 stages"),
        (["--prompt-len", "256", "--strategies", "fixed,bogus"], "--strategies 'fixed,bogus' is invalid"),
        ([], "--prompt-len is required"),
        (["--prompt-len", "1024", "--timeout", "-1"], "--timeout -1.0 must be a number of seconds"),
    ],
)
def test_bad_bench_input_is_one_line_exit_2(tmp_path, args, message):
    out = tmp_path / "bench"
    r = CliRunner().invoke(main, ["bench", str(POLICY), "--out", str(out), *args])
    assert r.exit_code == 2, r.output
    assert message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not out.exists()


def test_a_policy_without_its_run_folder_is_refused(tmp_path):
    (tmp_path / "policy.json").write_text(POLICY.read_text())
    r = CliRunner().invoke(main, ["bench", str(tmp_path / "policy.json"), "--prompt-len", "256"])
    assert r.exit_code == 2 and "run.json does not exist" in r.stderr
    (tmp_path / "policy.json").write_text("{}")  # the policy itself is checked first, as `ppprof validate` does
    r = CliRunner().invoke(main, ["bench", str(tmp_path / "policy.json"), "--prompt-len", "256"])
    assert r.exit_code == 2 and "$.schema_version: missing" in r.stderr


@pytest.mark.parametrize(
    "plans,message",
    [
        ({"1000": {"x": [500, 400]}}, "chunks sum to 900, not the prompt length 1000"),
        ({"999": {"x": [999]}}, "--plans has no plan for --prompt-len 1000"),
        ({"1000": {"Bad Name": [1000]}}, "name 'Bad Name' is invalid"),
        ({"1000": {"x": [1000.0]}}, "must be a non-empty list of positive integers"),
    ],
)
def test_bad_plans_are_one_line_exit_2(tmp_path, plans, message):
    path = tmp_path / "plans.json"
    path.write_text(json.dumps(plans))
    r = CliRunner().invoke(
        main, ["bench", str(POLICY), "--plans", str(path), "--prompt-len", "1000", "--out", str(tmp_path / "bench")]
    )
    assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.output
    assert not (tmp_path / "bench").exists()


def test_a_bench_out_that_holds_files_is_refused(tmp_path):
    out = tmp_path / "bench"
    out.mkdir()
    (out / "bench.csv").write_text("old")
    r = CliRunner().invoke(main, ["bench", str(POLICY), "--prompt-len", "1024", "--out", str(out)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert f"--out {out} is not empty (it holds bench.csv)" in r.stderr
    assert (out / "bench.csv").read_text() == "old"

import json

from click.testing import CliRunner

from ppprof.cli import main
from ppprof.fit.synthetic import SyntheticProbes, SyntheticRun, make_samples, write_run_dir
from ppprof.policy import SCHEMA_VERSION
from ppprof.policy.rule import LatencyModel

MODEL = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=4e-4)


def samples(tmp_path):
    frame = make_samples(
        MODEL, SyntheticProbes(base_chunk_size=4096, prefixes=[0, 8192, 32768], chunk_sizes=[1024, 4096])
    )
    return write_run_dir(tmp_path, frame, SyntheticRun(base_chunk_size=4096, min_gain=0.0))


def test_fit_writes_policy_and_summary(tmp_path):
    out = tmp_path / "sub" / "p.json"
    result = CliRunner().invoke(main, ["fit", str(samples(tmp_path)), "-o", str(out), "--smooth-factor", "0.6"])
    assert result.exit_code == 0, result.output
    assert "dynamic" in result.output and "CV MAPE" in result.output
    data = json.loads(out.read_text())
    assert data["settings"]["smooth_factor"] == 0.6 and data["schema_version"] == SCHEMA_VERSION


def test_no_load_rule_writes_the_idle_rules_alone_and_says_so(tmp_path):
    """--no-load-rule: no `load` and no simulation, the diagnostics and `validate` naming the flag; the prompt-aware
    rule, the table and the status as the fit that chooses the under-load rule writes them."""
    csv = samples(tmp_path)
    with_rule, without = tmp_path / "with.json", tmp_path / "without.json"
    for args in (["-o", str(with_rule)], ["-o", str(without), "--no-load-rule"]):
        result = CliRunner().invoke(main, ["fit", str(csv), *args])
        assert result.exit_code == 0, result.output
    a, b = (json.loads(p.read_text()) for p in (with_rule, without))
    assert a["report"]["diagnostics"]["under_load"]["cells"], "the fit without the flag simulates the serving scheduler"
    assert "load" not in b and b["report"]["diagnostics"]["under_load"] == {"skipped": "--no-load-rule"}
    for key in ("status", "prompt_table", "table", "latency_model"):
        assert a[key] == b[key], key
    assert a["report"]["predicted"] == b["report"]["predicted"]
    shown = CliRunner().invoke(main, ["validate", str(without), "--verbose"])
    assert shown.exit_code == 0 and "no under-load rule (--no-load-rule: the same chunks at every load)" in shown.output


def test_bad_options_exit_2_and_write_nothing(tmp_path):
    csv = samples(tmp_path)
    cases = [
        (["--smooth-factor", "1.5"], "--smooth-factor 1.5 is out of range"),
        (["--smooth-factor", "0"], "--smooth-factor 0.0 is out of range"),
        (["--max-chunk-size", "32"], "--max-chunk-size 32 is below the alignment 64"),
        (["--alignment", "0"], "--alignment 0 must be an integer >= 1"),
        (["--alignment", "8192"], "--alignment 8192 is larger than --base-chunk-size 4096"),
        (["--latency-model", "cubic"], "Invalid value for '--latency-model'"),
    ]
    for args, message in cases:
        result = CliRunner().invoke(main, ["fit", str(csv)] + args)
        assert result.exit_code == 2, (args, result.output)
        assert message in result.output, (args, result.output)
        assert not (tmp_path / "policy.json").exists(), args


def test_bad_files_exit_2(tmp_path):
    result = CliRunner().invoke(main, ["fit", str(tmp_path / "none.csv")])
    assert result.exit_code == 2 and "does not exist" in result.output
    (tmp_path / "x.csv").write_text("prefix_len,latency_ms\n0,1.0\n")
    result = CliRunner().invoke(main, ["fit", str(tmp_path / "x.csv"), "--base-chunk-size", "4096"])
    assert result.exit_code == 2 and "lacks column(s) chunk_size" in result.output
    (tmp_path / "y.csv").write_text("prefix_len,chunk_size,latency_ms\n0,64,1.0\n")
    result = CliRunner().invoke(main, ["fit", str(tmp_path / "y.csv")])
    assert result.exit_code == 2 and "--base-chunk-size is required" in result.output
    assert not list(tmp_path.glob("*.json"))


def test_cap_below_base_chunk_is_allowed(tmp_path):
    """SGLang allows max_prefill_tokens < chunked_prefill_size: the first chunk is B, the cap binds after it."""
    out = tmp_path / "p.json"
    result = CliRunner().invoke(main, ["fit", str(samples(tmp_path)), "-o", str(out), "--max-chunk-size", "2000"])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["status"] == "dynamic", data["reason"]
    from ppprof.policy import load

    chunks = load(out).sglang_plan(30000)  # SGLang's rule on these settings, as the export carries them
    assert chunks[0] == 4096 and chunks[1] == 1984 and max(chunks[1:]) <= 1984, chunks
    result = CliRunner().invoke(main, ["validate", str(out)])
    assert result.exit_code == 0, result.output
    result = CliRunner().invoke(main, ["export", str(out), "--server", "sglang"])
    assert "--chunked-prefill-size 4096 --max-prefill-tokens 2000" in result.output, result.output

import json

from click.testing import CliRunner

from ppprof.cli import main
from ppprof.io import atomic_write_json
from ppprof.policy import LatencyModel

from .policy_helpers import policy_dict

MODEL = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=2e-4)


def write(tmp_path, **kw):
    return str(atomic_write_json(tmp_path / "policy.json", policy_dict(MODEL, **kw)))


def test_plan_text_json_and_png(tmp_path):
    path = write(tmp_path)
    result = CliRunner().invoke(main, ["plan", path, "--prompt-len", "50000"])
    assert result.exit_code == 0, result.output
    for word in ("fixed:", "greedy:", "optimal:", "predicted TTFT", "4 stages"):
        assert word in result.output
    assert (tmp_path / "policy.plan-50000-pp4.png").stat().st_size > 1000
    png = tmp_path / "t.png"
    result = CliRunner().invoke(
        main, ["plan", path, "--prompt-len", "50000", "--pp", "2", "--strategy", "greedy", "--json", "--png", str(png)]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert [p["strategy"] for p in out["plans"]] == ["greedy"] and out["num_stages"] == 2
    assert sum(out["plans"][0]["chunk_sizes"]) == 50000 and png.exists()


def test_plan_bad_input_exit_2_nothing_written(tmp_path):
    path = write(tmp_path)
    for args, message in [
        (["--prompt-len", "0"], "--prompt-len 0 is invalid"),
        (["--prompt-len", "10", "--pp", "0"], "--pp 0 is invalid"),
        (["--prompt-len", "x"], "Invalid value for '--prompt-len'"),
        (
            ["--prompt-len", "10", "--pp", "100000"],
            "--pp 100000 is invalid: use a number of pipeline stages in 1..1024",
        ),
    ]:
        result = CliRunner().invoke(main, ["plan", path] + args)
        assert result.exit_code == 2 and message in result.output, (args, result.output)
    assert not list(tmp_path.glob("*.png"))
    result = CliRunner().invoke(main, ["plan", str(tmp_path / "none.json"), "--prompt-len", "10"])
    assert result.exit_code == 2 and "does not exist" in result.output


def test_export_formats(tmp_path):
    path = write(tmp_path, smooth_factor=0.7)
    out = CliRunner().invoke(main, ["export", path, "--server", "sglang"]).output
    assert "export SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR=0.7" in out
    assert "--enable-dynamic-chunking --chunked-prefill-size 8192" in out and "re-profiles" in out
    out = CliRunner().invoke(main, ["export", path, "--server", "vllm-ascend"]).output
    config = json.loads(out.strip().splitlines()[-1].split("--additional-config ")[1].strip("'"))
    assert config == {
        "scheduler_config": {"profiling_chunk_config": {"enabled": True, "smooth_factor": 0.7, "min_chunk": 2048}}
    }
    out = CliRunner().invoke(main, ["export", path, "--server", "atom"]).output
    assert "--dynamic-chunking-smooth-factor 0.7 --dynamic-chunking-min-chunk-size 2048" in out
    assert "--dynamic-chunking-calibration " in out
    static = write(tmp_path, status="static")
    out = CliRunner().invoke(main, ["export", static, "--server", "sglang"]).output
    command = out.strip().splitlines()[-1]
    assert "--enable-dynamic-chunking" not in command and "--chunked-prefill-size 8192" in command
    result = CliRunner().invoke(main, ["export", static, "--server", "trt"])
    assert result.exit_code == 2


def test_validate_ok_and_bad(tmp_path):
    path = write(tmp_path)
    result = CliRunner().invoke(main, ["validate", path])
    assert result.exit_code == 0 and result.output.startswith("ok ")
    data = json.loads((tmp_path / "policy.json").read_text())
    data["table"]["chunk_size"][-2] = 12345
    (tmp_path / "policy.json").write_text(json.dumps(data))
    result = CliRunner().invoke(main, ["validate", path])
    assert result.exit_code == 2 and result.output.count("\n") == 1 and "error:" in result.output, result.output


def png_size(path):
    """(width, height) from a PNG's IHDR chunk."""
    header = path.read_bytes()[16:24]
    return int.from_bytes(header[:4], "big"), int.from_bytes(header[4:], "big")


def test_timeline_draws_at_most_16_stages(tmp_path):
    path = write(tmp_path)
    sizes = {}
    for pp in (16, 17, 1024):
        png = tmp_path / f"pp{pp}.png"
        result = CliRunner().invoke(main, ["plan", path, "--prompt-len", "20000", "--pp", str(pp), "--png", str(png)])
        assert result.exit_code == 0, result.output
        sizes[pp] = png_size(png)
    assert sizes[1024][1] == sizes[17][1] and abs(sizes[1024][1] - sizes[16][1]) < 50, f"{sizes=}"


def test_cap_below_base_plans_validates_and_exports(tmp_path):
    path = write(tmp_path, max_chunk_size=3000)
    result = CliRunner().invoke(main, ["validate", path])
    assert result.exit_code == 0 and result.output.startswith("ok "), result.output
    result = CliRunner().invoke(main, ["plan", path, "--prompt-len", "30000", "--json"])
    assert result.exit_code == 0, result.output
    plans = {p["strategy"]: p["chunk_sizes"] for p in json.loads(result.output)["plans"]}
    assert plans["greedy"][0] == 8192 and max(plans["greedy"][1:]) <= 2944, plans["greedy"]
    out = CliRunner().invoke(main, ["export", path, "--server", "sglang"]).output
    assert "--chunked-prefill-size 8192 --max-prefill-tokens 3000" in out, out

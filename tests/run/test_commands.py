"""Input checks of `ppprof profile`: one line, exit code 2, nothing written, before any rank starts."""

import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.run.options import resolve_config


@pytest.mark.parametrize("args,message", [
    (["--model", "no-such-model"], "no-such-model"),
    (["--model", "tiny-dense", "--nproc-per-node", "9"], "number of stages (9) cannot be greater than layers"),
    (["--requests-per-probe", "200"], "--requests-per-probe 200 is out of range: use 8..128"),
    (["--requests-per-probe", "4"], "--requests-per-probe 4 is out of range"),
    (["--max-total-tokens", "256"], "does not fit the KV cache"),
    (["--layer-partition", "3,3"], "--layer-partition 3,3 adds up to 6 layers but the model has 8"),
    (["--layer-partition", "8,0"], "would leave a stage empty"),
    (["--nnodes", "1:4"], "--nnodes '1:4' must be a fixed node count"),
    (["--bogus"], "No such option '--bogus'"),
    (["--dtype", "int8"], "--dtype: dtype 'int8' is not supported: use one of float32, bfloat16, float16"),
    (["--attention-backend", "flashinfer"], "--attention-backend flashinfer runs on CUDA only"),
    (["--attention-backend", "fast"], "Invalid value for '--attention-backend'"),
    (["--device", "cuda", "--start-method", "fork"], "--start-method fork cannot be used with --device cuda"),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, args, message):
    out = tmp_path / "run"
    r = CliRunner().invoke(main, ["profile", "--out", str(out), *args])
    assert r.exit_code == 2, r.output
    assert message in r.stderr
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ")
    assert "Traceback" not in r.output
    assert not out.exists()


def test_yaml_config_is_read_and_flags_win(tmp_path):
    cfg_file = tmp_path / "p.yaml"
    cfg_file.write_text("model: tiny-dense\nbase-chunk-size: 256\nlayer_partition: 1,3\nprefix_lens: [256, 512]\n"
                        "dtype: bf16\n")
    cfg = resolve_config(str(cfg_file), {"base_chunk_size": 128, "seed": None})
    assert cfg.model == "tiny-dense"
    assert cfg.base_chunk_size == 128
    assert cfg.layer_partition == (1, 3)
    assert cfg.prefix_lens == (256, 512)
    assert cfg.dtype == "bfloat16"


def test_yaml_with_an_unknown_key_is_refused(tmp_path):
    cfg_file = tmp_path / "p.yaml"
    cfg_file.write_text("base_chunk: 256\n")
    r = CliRunner().invoke(main, ["profile", "--config", str(cfg_file)])
    assert r.exit_code == 2
    assert "unknown setting 'base_chunk'" in r.stderr


def test_shipped_config_files_resolve():
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[2] / "configs").glob("profile-*.yaml")):
        cfg = resolve_config(str(path), {})
        assert cfg.requests_per_probe <= 128, path


def test_an_output_folder_that_cannot_be_written_is_refused_before_any_rank(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = CliRunner().invoke(main, ["profile", "--out", str(blocker / "run")])
    assert r.exit_code == 2
    assert r.stderr.startswith(f"error: --out {blocker / 'run'}: {blocker} is not a writable folder")
    r = CliRunner().invoke(main, ["profile", "--out", str(blocker)])
    assert r.exit_code == 2 and "exists and is not a folder" in r.stderr


def test_cli_turns_an_unwritable_output_into_one_line(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("")
    samples = tmp_path / "s.csv"
    samples.write_text("prefix_len,chunk_size,latency_ms\n" + "".join(f"0,{c},{1 + c * 0.01}\n" for c in range(1, 200, 5)))
    r = CliRunner().invoke(main, ["fit", str(samples), "--base-chunk-size", "128", "-o", str(blocker / "p.json")])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"error: cannot use {blocker / 'p.json'}: ") and r.stderr.count("\n") == 1


def test_a_mamba_cache_below_the_probe_size_is_warned_about():
    from ppprof.config import ProfileConfig
    from ppprof.run.options import warnings

    assert warnings(ProfileConfig()) == []
    (line,) = warnings(ProfileConfig(max_mamba_cache_size=64))
    assert "--max-mamba-cache-size 64 is below --requests-per-probe 128" in line and "raise it to 128" in line

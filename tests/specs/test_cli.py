"""`ppprof model` through the real command group: JSON output, text table, one-line errors with exit code 2."""

from __future__ import annotations

import json

from click.testing import CliRunner

from ppprof.cli import main


def run(*args):
    return CliRunner().invoke(main, ["model", *args])


def test_json_tiny_hybrid_two_stages():
    r = run("tiny-hybrid", "--pp", "2", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["name"] == "tiny-hybrid" and d["family"] == "nemotron_h" and d["num_layers"] == 8
    assert d["layout"] == "M-*EM-*-"
    assert d["accounting_dtype"] == "bfloat16" and d["dtype"] is None
    assert [(s["layer_start"], s["layer_stop"]) for s in d["stages"]] == [(0, 4), (4, 8)]
    for s in d["stages"]:
        assert s["kv_bytes_per_token"] > 0 and s["mamba_bytes_per_slot"] > 0, f"{s=}"
        assert s["num_params"]["total"] == sum(v for k, v in s["num_params"].items() if k != "total")


def test_json_options():
    d = json.loads(
        run(
            "nemotron-h-8b",
            "--num-layers",
            "4",
            "--pp",
            "2",
            "--layer-partition",
            "3,1",
            "--dtype",
            "float32",
            "--json",
        ).stdout
    )
    assert d["layout"] == "M-M*" and d["dtype"] == "float32"
    assert [s["layout"] for s in d["stages"]] == ["M-M", "*"]
    assert d["stages"][1]["kv_bytes_per_token"] == 2 * 8 * 128 * 4


def test_text_table():
    r = run("jamba-mini", "--pp", "4")
    assert r.exit_code == 0, r.output
    assert "jamba-mini (family jamba)" in r.stdout
    assert "(M- ME M- ME *- ME M- ME) x4" in r.stdout
    assert "stage" in r.stdout and "KV/token" in r.stdout and "Mamba/slot" in r.stdout
    assert len([line for line in r.stdout.splitlines() if line[:1].isdigit()]) == 4


def test_hf_config_path(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4})
    )
    r = run(str(tmp_path), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["head_dim"] == 16


def assert_one_line_error(r, *needles):
    assert r.exit_code == 2, r.output
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), f"{r.stderr=}"
    for needle in needles:
        assert needle in lines[0], f"{needle=} {lines[0]=}"


def test_bad_preset():
    assert_one_line_error(run("nope", "--json"), "unknown model preset 'nope'", "tiny-hybrid")


def test_pp_greater_than_layers():
    assert_one_line_error(run("tiny-dense", "--pp", "5"), "number of stages (5) cannot be greater than layers (4)")


def test_bad_partition_dtype_and_num_layers():
    assert_one_line_error(run("tiny-dense", "--pp", "2", "--layer-partition", "1,2"), "adds up to 3")
    assert_one_line_error(run("tiny-dense", "--pp", "2", "--layer-partition", "a,b"), "--layer-partition")
    assert_one_line_error(run("tiny-dense", "--dtype", "int8"), "dtype 'int8'")
    assert_one_line_error(run("tiny-dense", "--num-layers", "9"), "--num-layers 9")

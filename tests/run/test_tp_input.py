"""PP x TP input, before any rank starts: a mesh the job cannot hold and a model's TP split refused in one line, from
the flags and from YAML; the GPU check's PP2 x TP2 command uses only flags `ppprof profile` takes."""

import re
import subprocess

import pytest
from click.testing import CliRunner

from ppprof.cli import main
from tests.multirank import REPO


@pytest.mark.parametrize(
    "args,message",
    [
        (
            ["--model", "tiny-dense", "--tp-size", "3"],
            "--tp-size 3 does not divide num_attention_heads (4) of model 'tiny-dense': use a --tp-size that is a divisor "
            "of 4",
        ),
        (
            ["--model", "tiny-hybrid", "--tp-size", "8", "--pp-size", "1"],
            "--tp-size 8 does not divide num_attention_heads (4) of model 'tiny-hybrid'",
        ),
        (
            ["--model", "tiny-dense", "--pp-size", "2", "--tp-size", "2", "--nproc-per-node", "2"],
            "--pp-size 2 x --tp-size 2 = 4 ranks but the job has 2 (nnodes x nproc-per-node)",
        ),
        (
            ["--model", "tiny-dense", "--tp-size", "2", "--nproc-per-node", "3"],
            "--tp-size 2 does not divide the 3 ranks of the job",
        ),
        (
            ["--model", "tiny-dense", "--tp-size", "2", "--nproc-per-node", "1", "--nnodes", "2"],
            "--tp-size 2 would span nodes: a node's 1 ranks must hold whole TP groups",
        ),
        (["--model", "tiny-dense", "--tp-size", "0"], "--tp-size 0 must be an integer"),
        (["--model", "tiny-dense", "--pp-size", "0"], "--pp-size 0 must be an integer"),
    ],
)
def test_bad_meshes_and_tp_splits_are_one_line_before_any_rank(tmp_path, args, message):
    r = CliRunner().invoke(main, ["profile", *args, "--out", str(tmp_path / "run")])
    assert r.exit_code == 2, r.output
    assert message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert not (tmp_path / "run").exists()


def test_tp_size_is_read_from_yaml(tmp_path):
    config = tmp_path / "tp.yaml"
    config.write_text("model: tiny-dense\ntp_size: 3\n")
    r = CliRunner().invoke(main, ["profile", "--config", str(config)])
    assert r.exit_code == 2 and "--tp-size 3 does not divide num_attention_heads (4)" in r.stderr, r.output


def test_the_gpu_check_runs_pp2_tp2_over_nccl_with_flags_profile_takes():
    script = REPO / "scripts" / "gpu_check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    block = text[text.index("PP2 x TP2 over NCCL") : text.index("PP2 x TP2 skipped")]
    command = block[block.index("ppprof profile") : block.index(" > ")].replace("\\\n", " ")
    assert "--device cuda --pp-size 2 --tp-size 2 --nproc-per-node 4" in command
    known = {o for p in main.commands["profile"].params for o in p.opts}
    assert set(re.findall(r"--[a-z][a-z0-9-]*", command)) <= known, command

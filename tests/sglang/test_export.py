"""`ppprof export --server sglang` prints, beside the flags, the policy-file way: its arguments are ones the launcher
takes and the sizer matches at load (on the server of the profile the policy came from)."""

from __future__ import annotations

import json
import shlex

from click.testing import CliRunner

from ppprof.cli import main
from ppprof.policy import load
from ppprof.servers.export import export_data
from ppprof.sglang.__main__ import check_server_args, server_flag
from ppprof.sglang.match import ServerConfig, mismatch, model_shape_of

from .standin import REPO, model_config, shaped

BASELINE = REPO / "results" / "baseline" / "policy.json"


def test_the_exported_policy_file_way_is_taken_by_the_launcher_and_matched_by_the_sizer(tmp_path):
    path = shaped(BASELINE, tmp_path)
    policy = load(path)
    way = export_data(policy, "sglang", str(path))["policy_file"]
    assert way["env"] == {"PPPROF_POLICY": str(path.resolve())}
    assert shlex.split(way["command"])[:4] == [
        f"PPPROF_POLICY={path.resolve()}",
        "python",
        "-m",
        "sglang.launch_server",
    ]
    launcher = shlex.split(way["launcher"])
    assert launcher[:5] == ["python", "-m", "ppprof.sglang", "--policy", str(path.resolve())]
    args = launcher[launcher.index("--") + 1 :]
    assert args == way["args"]
    check_server_args(policy, args)
    config = model_config(path)
    server = ServerConfig(
        pp_size=int(server_flag(args, "--pp-size")),
        tp_size=int(server_flag(args, "--tp-size")),
        page_size=int(server_flag(args, "--page-size") or 1),
        chunked_prefill_size=int(server_flag(args, "--chunked-prefill-size")),
        max_prefill_tokens=int(server_flag(args, "--max-prefill-tokens")),
        context_len=config.context_len,
        device="cpu",
        device_name=None,
        model_shape=model_shape_of(config),
    )
    assert mismatch(policy, server) is None


def test_the_text_export_keeps_the_flags_last_and_says_when_the_shapes_are_missing(tmp_path):
    out = CliRunner().invoke(main, ["export", str(BASELINE), "--server", "sglang"]).output
    lines = out.strip().splitlines()
    assert lines[-1].startswith("--pp-size 2 --tp-size 1 --enable-dynamic-chunking --chunked-prefill-size 512"), lines[
        -1
    ]
    assert any(x.startswith("#   PPPROF_POLICY=") and "python -m sglang.launch_server" in x for x in lines)
    assert any(x.startswith("#   python -m ppprof.sglang --policy ") for x in lines)
    assert not any("does not record" in x for x in lines)  # the committed policy records the model's shapes
    unshaped = json.loads(BASELINE.read_text())
    del unshaped["provenance"]["model_shape"]  # a policy fitted before ppprof recorded them
    (tmp_path / "unshaped.json").write_text(json.dumps(unshaped))
    old_out = CliRunner().invoke(main, ["export", str(tmp_path / "unshaped.json"), "--server", "sglang"]).output
    assert "does not record the profiled model's shapes" in old_out
    assert "policy_file" not in export_data(load(BASELINE), "atom")

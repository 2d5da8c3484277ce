"""The exports: read each export's flags back, run that server's own rule on them, and what the export says about
where it differs from the policy is what that rule does; `ppprof export --server` (and its old name --format)."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.policy import from_dict
from ppprof.servers import SERVERS, get
from ppprof.servers.export import export_data, server_model

from .helpers import PREFIX, QUADRATIC, policy_dict


@pytest.mark.parametrize("server", SERVERS)
@pytest.mark.parametrize("model", [PREFIX, QUADRATIC], ids=["prefix", "quadratic"])
def test_each_export_says_where_its_servers_rule_differs(server, model):
    """Read the export's flags back, run that server's rule on them and count the differences independently."""
    policy = from_dict(
        policy_dict(model, base_chunk_size=4096, context_len=32768, smooth_factor=0.75, max_chunk_size=3000)
    )
    data = export_data(policy, server)
    target = get(server)
    setting, calibration, ignored = target.parse_flags(data["command"], page_size=64)
    assert ignored == [] and setting.to_dict() == data["setting"]
    model_used = target.boot_model(calibration if calibration is not None else policy.latency_model)
    rule = target.rule(setting, model_used, 32768)
    prefix_lens = range(0, 32767, 64)
    theirs = [min(rule.next(L), 32768 - L) for L in prefix_lens]
    ours = [min(policy.next_chunk_size(L), 32768 - L) for L in prefix_lens]
    differ = [L for L, t, o in zip(prefix_lens, theirs, ours) if t != o]
    assert data["differences"]["differ"] == len(differ)
    assert data["differences"]["first_differs_at"] == (differ[0] if differ else None)
    # The policy's table is its own rule, not a server's: each server's rule differs from it somewhere
    assert differ and "differs from the policy at" in "\n".join(data["comments"])
    if server != "sglang":
        assert any("3000 tokens" in c and "lost" in c for c in data["causes"])


def test_export_json_cli_and_round_trip_of_every_server(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(policy_dict(PREFIX, base_chunk_size=4096, context_len=32768)))
    for server in SERVERS:
        r = CliRunner().invoke(main, ["export", str(path), "--server", server, "--json"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.output)
        assert doc["server"] == server and doc["differences"]["prefix_lens_checked"] == 512
        target = get(server)
        setting, calibration, _ = target.parse_flags(doc["command"], page_size=64)
        env, args = target.format_flags(setting, calibration)
        assert (env, target.format_parallel(4, 1) + args) == (doc["env"], doc["args"])


@pytest.mark.parametrize("server", SERVERS)
def test_an_export_sets_the_layout_the_policy_was_profiled_at(server):
    """The stages and the TP degree of the profile (provenance pp_size, tp_size) are in the flags, in the server's
    own names, and read back as they were written; the chunking flags are unchanged by them."""
    data = policy_dict(PREFIX, base_chunk_size=4096, context_len=32768, pp_size=2)
    data["report"]["provenance"] = {**data["report"]["provenance"], "pp_size": 2, "tp_size": 4}
    doc = export_data(from_dict(data), server)
    target = get(server)
    names = {
        "sglang": ["--pp-size", "2", "--tp-size", "4"],
        "vllm-ascend": ["--pipeline-parallel-size", "2", "--tensor-parallel-size", "4"],
        "atom": ["--pipeline-parallel-size", "2", "--tensor-parallel-size", "4"],
    }[server]
    assert doc["args"][:4] == names and any("2 stages of 4 TP ranks" in c for c in doc["comments"])
    from ppprof.servers.flags import split_command

    assert target.parse_parallel(split_command(doc["command"]))[0] == {"pp_size": 2, "tp_size": 4}
    setting, _, ignored = target.parse_flags(doc["command"], page_size=64)
    assert ignored == [] and setting.to_dict() == doc["setting"]


def test_format_is_the_old_name_of_server_and_prints_the_same(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(policy_dict(PREFIX, base_chunk_size=4096, context_len=32768)))
    for server in SERVERS:
        new = CliRunner().invoke(main, ["export", str(path), "--server", server])
        old = CliRunner().invoke(main, ["export", str(path), "--format", server])
        assert new.exit_code == old.exit_code == 0 and new.output == old.output, server
    assert "--format" not in CliRunner().invoke(main, ["export", "--help"]).output
    for args, message in [
        ([], "Missing option '--server'"),
        (["--server", "sglang", "--format", "atom"], "name different servers"),
        (["--server", "trt"], "'trt' is not one of"),
    ]:
        r = CliRunner().invoke(main, ["export", str(path), *args])
        assert r.exit_code == 2 and message in r.stderr and r.stderr.count("\n") == 1, (args, r.output)


def test_the_model_a_server_sizes_chunks_with_beside_a_policy():
    policy = from_dict(policy_dict(PREFIX))
    assert server_model(policy, "sglang").name == "quadratic" and np.isclose(server_model(policy, "sglang").a, PREFIX.a)
    assert server_model(policy, "atom") == PREFIX
    with pytest.raises(ValueError, match="--server 'trt' is unknown: use one of sglang, vllm-ascend, atom"):
        export_data(policy, "trt")


@pytest.mark.parametrize("server", SERVERS)
def test_an_export_says_whether_its_server_carries_the_under_load_rule(server):
    data = policy_dict(PREFIX, base_chunk_size=4096, context_len=32768)
    assert not any("under load" in c for c in export_data(from_dict(data), server)["comments"])
    rule = {
        "slots": 4,
        "fill": 2.0,
        "unit": data["prompt_table"]["unit"],
        "full": {"bound_ms": None, "chunk_cap": 8192},
    }
    data |= {"schema_version": 5, "load": rule}
    notes = [c for c in export_data(from_dict(data), server)["comments"] if "under load" in c]
    assert len(notes) == 1 and "(once the work fills 2 x 4 slots)" in notes[0], notes
    want = {"sglang": "the policy file loaded by ppprof's sizer does", "vllm-ascend": "vllm-ascend cannot"}
    want["atom"] = "hands over at 1 pending request, where the policy's reads whether the pipeline is full"
    assert want[server] in notes[0], notes

"""Each server's rule re-derived from its docs (ppprof.policy.servers), its flags read and written, and the exports:
what a server's own rule does with the exported flags is what the export says it does."""

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.policy import LatencyModel, from_dict
from ppprof.policy.export import compare_rules, export_data, server_model
from ppprof.policy.servers import (ServerRule, ServerSetting, boot_model, chunk_sequence, cut, default_setting,
                                   format_flags, parse_flags)

from .policy_helpers import policy_dict

PREFIX = LatencyModel("prefix", a=1.5e-6, b=0.01, c=2.0, g=4e-4)
QUADRATIC = LatencyModel("quadratic", a=1.5e-6, b=0.01, c=2.0)


def root(a, b, target):
    """The documented equal-latency root: a x^2 + b x - target = 0."""
    return (-b + math.sqrt(b * b + 4 * a * target)) / (2 * a)


def test_vllm_ascend_rule_by_hand():
    s = ServerSetting("vllm-ascend", 4096, True, 0.8, 1024, 4096, page_size=1)
    rule = ServerRule(s, boot_model("vllm-ascend", PREFIX), context_len=65536)
    a, b = PREFIX.a, PREFIX.b
    T = a * 4096 ** 2 + b * 4096
    assert rule.next(0) == 4096
    for L in (1, 4096, 9000, 30000, 60000):
        x = root(a, 2 * a * L + b, T)
        size = max(int(4096 + 0.8 * (x - 4096)), 1024)
        want = min(math.ceil(size / 64) * 64, 4096, 65536 - 1 - L)
        assert rule.next(L) == want, L
    # a negative fitted a becomes 1e-9 (SGLang would turn dynamic chunking off)
    assert boot_model("vllm-ascend", LatencyModel("quadratic", a=-1e-7, b=0.01, c=1.0)).a == 1e-9
    assert boot_model("sglang", LatencyModel("quadratic", a=-1e-7, b=0.01, c=1.0)) is None


def test_atom_rule_by_hand():
    s = ServerSetting("atom", 4096, True, 1.0, 512, 8192, page_size=16)
    rule = ServerRule(s, boot_model("atom", PREFIX), context_len=65536)
    a, b, g = PREFIX.a, PREFIX.b, PREFIX.g
    assert rule.next(0) == 4096
    for L in (100, 4096, 20000, 50000):
        x = root(a, 2 * a * L + b, a * 4096 ** 2 + b * 4096 - g * L)
        floor = root(a, 2 * a * L + b, 4 * g * L)  # prefix cost at most 20% of the chunk's latency
        size = min(max(int(x), 16, 512, int(floor)), 4096, 8192)
        assert rule.next(L) == size - size % 16, L
    # a prefix cost above the whole budget: the base size
    heavy = LatencyModel("prefix", a=1e-7, b=0.001, c=1.0, g=0.01)
    assert ServerRule(s, heavy, 10 ** 6).next(900000) == 4096
    assert boot_model("atom", LatencyModel("prefix", a=1e-6, b=-0.1, c=1.0, g=0.0)) is None


def test_sglang_rule_is_ppprofs_and_its_export_matches_the_policy_everywhere():
    policy = from_dict(policy_dict(QUADRATIC, base_chunk_size=4096, context_len=65536, smooth_factor=0.7))
    data = export_data(policy, "sglang")
    assert data["differences"]["differ"] == 0 and data["differences"]["prefix_lens_checked"] == 1024
    setting, _, ignored = parse_flags("sglang", data["command"], page_size=64)
    assert ignored == [] and setting == ServerSetting("sglang", 4096, True, 0.7, 1024, 4096, 64)
    rule = ServerRule(setting, boot_model("sglang", policy.model), 65536)
    for L in range(0, 65536, 7):
        assert rule.next(L) == policy.next_chunk_size(L), L


@pytest.mark.parametrize("server", ["sglang", "vllm-ascend", "atom"])
@pytest.mark.parametrize("model", [PREFIX, QUADRATIC], ids=["prefix", "quadratic"])
def test_each_export_says_where_its_servers_rule_differs(server, model):
    """Read the export's flags back, run that server's rule on them and count the differences independently."""
    policy = from_dict(policy_dict(model, base_chunk_size=4096, context_len=32768, smooth_factor=0.75,
                                   max_chunk_size=3000))
    data = export_data(policy, server)
    setting, calibration, ignored = parse_flags(server, data["command"], page_size=64)
    assert ignored == [] and setting.to_dict() == data["setting"]
    model_used = boot_model("atom", calibration) if server == "atom" else boot_model(server, policy.model)
    rule = ServerRule(setting, model_used, 32768)
    prefix_lens = range(0, 32767, 64)
    theirs = [min(rule.next(L), 32768 - L) for L in prefix_lens]
    ours = [min(policy.next_chunk_size(L), 32768 - L) for L in prefix_lens]
    differ = [L for L, t, o in zip(prefix_lens, theirs, ours) if t != o]
    assert data["differences"]["differ"] == len(differ)
    assert data["differences"]["first_differs_at"] == (differ[0] if differ else None)
    if server == "sglang" and model is QUADRATIC:
        assert differ == [] and "gives the policy's chunk size at every one" in "\n".join(data["comments"])
    else:
        assert differ and "differs from the policy at" in "\n".join(data["comments"])
    if server != "sglang":
        assert any("3000 tokens" in c and "lost" in c for c in data["causes"])


def test_export_json_cli_and_round_trip_of_every_format(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(policy_dict(PREFIX, base_chunk_size=4096, context_len=32768)))
    for server in ("sglang", "vllm-ascend", "atom"):
        r = CliRunner().invoke(main, ["export", str(path), "--format", server, "--json"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.output)
        assert doc["server"] == server and doc["differences"]["prefix_lens_checked"] == 512
        setting, _, _ = parse_flags(server, doc["command"], page_size=64)
        env, args = format_flags(setting, parse_flags(server, doc["command"], 64)[1])
        assert (env, args) == (doc["env"], doc["args"])


def test_parse_flags_defaults_layouts_and_errors():
    assert parse_flags("sglang", "python -m sglang.launch_server --model m")[0] == default_setting("sglang")
    legacy = parse_flags("vllm-ascend", "--max-num-batched-tokens 16384 --additional-config "
                                        "'{\"profiling_chunk_config\": {\"enabled\": true, \"min_chunk\": 2048}}'")[0]
    assert (legacy.dynamic, legacy.base_chunk_size, legacy.min_chunk_size, legacy.smooth_factor) == \
        (True, 16384, 2048, 1.0)
    atom, calibration, _ = parse_flags("atom", "--max-num-batched-tokens=32768 --enable-dynamic-chunking "
                                               "--dynamic-chunking-calibration 3.25e-07,6.03e-03,26.1,5.39e-04")
    assert atom.base_chunk_size == 32768 and calibration.g == 5.39e-04
    for server, text, message in [
        ("sglang", "--chunked-prefill-size abc", "--chunked-prefill-size 'abc' is not an integer"),
        ("sglang", "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR=1.5", "out of range"),
        ("sglang", "--chunked-prefill-size", "has no value"),
        ("sglang", "--chunked-prefill-size 32", "below the alignment 64"),
        ("vllm-ascend", "--additional-config '{bad'", "is not JSON"),
        ("atom", "--dynamic-chunking-calibration 1,2", "four numbers"),
        ("sglang", "'unclosed", "is not a command line"),
    ]:
        with pytest.raises(ValueError) as e:
            parse_flags(server, text)
        assert message in str(e.value) and "\n" not in str(e.value), (text, str(e.value))


def test_chunk_sequences_cut_into_shorter_prompts():
    chunks = chunk_sequence(lambda L: 100 if L < 300 else 50, 1000)
    assert chunks.sum() == 1000 and list(chunks[:4]) == [100, 100, 100, 50]
    for n in (1, 99, 100, 101, 350, 1000):
        plan = cut(chunks, n)
        assert plan.sum() == n and list(plan[:-1]) == list(chunks[: len(plan) - 1])
    assert server_model(from_dict(policy_dict(PREFIX)), "sglang").name == "quadratic"
    assert np.isclose(server_model(from_dict(policy_dict(PREFIX)), "sglang").a, PREFIX.a)

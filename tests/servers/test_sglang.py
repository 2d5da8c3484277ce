"""SGLang: its rule is ppprof's with its floor and margin, its boot clamps, and its flags read and written."""

import pytest

from ppprof.chunks import walk
from ppprof.policy import LatencyModel, from_dict
from ppprof.policy.rule import next_chunk_size
from ppprof.servers import ServerSetting
from ppprof.servers.export import export_data
from ppprof.servers.sglang import SGLANG

from .helpers import QUADRATIC, policy_dict


def test_sglang_rule_is_ppprofs_and_its_export_matches_the_policy_everywhere():
    policy = from_dict(policy_dict(QUADRATIC, base_chunk_size=4096, context_len=65536, smooth_factor=0.7))
    data = export_data(policy, "sglang")
    assert data["differences"]["prefix_lens_checked"] == 1024  # against the policy's own (history-only) table
    setting, _, ignored = SGLANG.parse_flags(data["command"], page_size=64)
    assert ignored == [] and setting == ServerSetting(
        server="sglang",
        base_chunk_size=4096,
        dynamic=True,
        smooth_factor=0.7,
        min_chunk_size=1024,
        max_chunk_size=4096,
        page_size=64,
    )
    rule = SGLANG.rule(setting, SGLANG.boot_model(policy.latency_model), 65536)
    for L in range(0, 65536, 7):  # SGLang's rule on the policy's model: ppprof's `greedy` strategy
        assert rule.next(L) == next_chunk_size(policy.latency_model, policy.settings, policy.target_ms, L), f"{L=}"
    assert walk(rule.next, 30000) == policy.sglang_plan(30000)


def test_boot_clamps_a_non_positive_a_turns_it_off_and_a_negative_b_is_0():
    assert SGLANG.boot_model(LatencyModel("quadratic", a=-1e-7, b=0.01, c=1.0)) is None
    assert SGLANG.boot_model(LatencyModel("quadratic", a=0.0, b=0.01, c=1.0)) is None
    assert SGLANG.boot_model(LatencyModel("quadratic", a=1e-7, b=-0.01, c=1.0)).b == 0.0
    s = ServerSetting(
        server="sglang",
        base_chunk_size=4096,
        dynamic=True,
        smooth_factor=0.75,
        min_chunk_size=1024,
        max_chunk_size=8192,
    )
    assert [SGLANG.rule(s, None, 65536).next(L) for L in (0, 9000)] == [4096, 4096]


def test_flags_defaults_floor_and_errors():
    assert SGLANG.parse_flags("python -m sglang.launch_server --model m")[0] == SGLANG.default_setting()
    setting, _, ignored = SGLANG.parse_flags(
        "--chunked-prefill-size 2048 --max-prefill-tokens=4096 --page-size 32 "
        "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR=0.5 --model m"
    )
    assert setting == ServerSetting(
        server="sglang",
        base_chunk_size=2048,
        dynamic=False,
        smooth_factor=0.5,
        min_chunk_size=512,
        max_chunk_size=4096,
        page_size=32,
    ) and ignored == ["--model", "m"]
    env, args = SGLANG.format_flags(
        ServerSetting(
            server="sglang",
            base_chunk_size=2048,
            dynamic=True,
            smooth_factor=0.5,
            min_chunk_size=512,
            max_chunk_size=4096,
            page_size=32,
        )
    )
    assert env == {"SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR": "0.5"} and args[0] == "--enable-dynamic-chunking"
    for text, message in [
        ("--chunked-prefill-size abc", "--chunked-prefill-size 'abc' is not an integer"),
        ("SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR=1.5", "out of range"),
        ("--chunked-prefill-size", "has no value"),
        ("--chunked-prefill-size 32", "below the alignment 64"),
        ("'unclosed", "is not a command line"),
    ]:
        with pytest.raises(ValueError) as e:
            SGLANG.parse_flags(text)
        assert message in str(e.value) and "\n" not in str(e.value), (text, str(e.value))


def test_tune_tries_caps_not_floors():
    """The floor is B // 4 in every candidate; the caps are the default cap, 3B/4 and B/2."""
    candidates = SGLANG.dynamic_candidates(4096, (0.5, 1.0), 64, 1)
    assert {c.min_chunk_size for c in candidates} == {1024}
    assert sorted({c.max_chunk_size for c in candidates}) == [2048, 3072, 16384]
    fixed = SGLANG.fixed_candidate(4096, 1)
    assert (fixed.dynamic, fixed.base_chunk_size, fixed.min_chunk_size, fixed.max_chunk_size) == (
        False,
        4096,
        1024,
        16384,
    )

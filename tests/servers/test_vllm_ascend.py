"""vllm-ascend's rule re-derived by hand from its docs, its boot clamps and its --additional-config layouts."""

import json
import math

import pytest

from ppprof.policy import LatencyModel
from ppprof.servers import ServerSetting
from ppprof.servers.vllm_ascend import VLLM_ASCEND

from .helpers import PREFIX, root


def test_vllm_ascend_rule_by_hand():
    s = ServerSetting(
        server="vllm-ascend",
        base_chunk_size=4096,
        dynamic=True,
        smooth_factor=0.8,
        min_chunk_size=1024,
        max_chunk_size=4096,
        page_size=1,
    )
    rule = VLLM_ASCEND.rule(s, VLLM_ASCEND.boot_model(PREFIX), context_len=65536)
    a, b = PREFIX.a, PREFIX.b
    T = a * 4096**2 + b * 4096
    assert rule.next(0) == 4096
    for L in (1, 4096, 9000, 30000, 60000):
        x = root(a, 2 * a * L + b, T)
        size = max(int(4096 + 0.8 * (x - 4096)), 1024)
        want = min(math.ceil(size / 64) * 64, 4096, 65536 - 1 - L)
        assert rule.next(L) == want, f"{L=}"


def test_a_negative_fitted_a_becomes_1e_9_and_no_model_keeps_the_budget():
    assert VLLM_ASCEND.boot_model(LatencyModel("quadratic", a=-1e-7, b=0.01, c=1.0)).a == 1e-9
    assert VLLM_ASCEND.boot_model(LatencyModel("quadratic", a=1e-7, b=-0.01, c=1.0)).b == -0.01  # b kept as fitted
    s = ServerSetting(
        server="vllm-ascend",
        base_chunk_size=4096,
        dynamic=True,
        smooth_factor=1.0,
        min_chunk_size=1024,
        max_chunk_size=4096,
    )
    assert [VLLM_ASCEND.rule(s, None, 10000).next(L) for L in (0, 5000, 9000)] == [4096, 4096, 999]


def test_additional_config_both_layouts_and_the_nested_one_wins():
    legacy = VLLM_ASCEND.parse_flags(
        "--max-num-batched-tokens 16384 --additional-config "
        '\'{"profiling_chunk_config": {"enabled": true, "min_chunk": 2048}}\''
    )[0]
    assert (
        legacy.dynamic,
        legacy.base_chunk_size,
        legacy.max_chunk_size,
        legacy.min_chunk_size,
        legacy.smooth_factor,
    ) == (True, 16384, 16384, 2048, 1.0)
    both = {
        "profiling_chunk_config": {"min_chunk": 2048},
        "scheduler_config": {"profiling_chunk_config": {"min_chunk": 512, "smooth_factor": 0.5}},
    }
    setting = VLLM_ASCEND.parse_flags(f"--additional-config '{json.dumps(both)}'")[0]
    assert (setting.min_chunk_size, setting.smooth_factor) == (512, 0.5)


@pytest.mark.parametrize(
    "text,message",
    [
        ("--additional-config '{bad'", "is not JSON"),
        ("--additional-config '[1]'", "must be a JSON object"),
        ('--additional-config \'{"profiling_chunk_config": {"enabled": 1}}\'', "must be true or false"),
        ("--max-num-batched-tokens 32", "vllm-ascend --max-num-batched-tokens 32 is below the alignment 64"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(text, message):
    with pytest.raises(ValueError) as e:
        VLLM_ASCEND.parse_flags(text)
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)

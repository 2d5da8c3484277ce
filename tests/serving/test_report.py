"""serving.json's paired ratios: an arm against each other arm repeat by repeat, the median of the ratios."""

import pytest

from ppprof.serving.report import paired_ratios


def cell(throughput: float, ttft_mean: float) -> dict:
    return {"throughput_tokens_per_s": throughput, "ttft_ms": {"mean": ttft_mean}}


def test_each_repeat_is_compared_with_the_same_repeat_of_the_other_arm():
    # the host slows down in repeat 1 for both arms: the paired ratio stays 1.1, the medians' ratio would not
    cells = {
        ("concurrency-2", "fixed"): [cell(100.0, 50.0), cell(50.0, 100.0), cell(100.0, 50.0)],
        ("concurrency-2", "policy-load"): [cell(110.0, 40.0), cell(55.0, 80.0), cell(110.0, 40.0)],
        ("concurrency-4", "fixed"): [cell(100.0, 50.0)],
    }
    out = paired_ratios(cells)
    assert set(out) == {"concurrency-2"}  # policy-load did not run at concurrency 4
    pair = out["concurrency-2"]["policy-load/fixed"]
    assert pair["throughput"] == pytest.approx(1.1) and pair["ttft_mean"] == pytest.approx(0.8)
    assert pair["range"]["throughput"] == pytest.approx([1.1, 1.1])
    assert paired_ratios(cells, arm="fixed")["concurrency-2"]["fixed/policy-load"]["ttft_mean"] == pytest.approx(1.25)

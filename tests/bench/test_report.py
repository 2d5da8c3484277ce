"""The bench report's pure parts (ppprof.bench.report) on hand-built measurements, with hand-computed expectations."""

import numpy as np
import pandas as pd
import pytest

from ppprof.bench.plans import Arm
from ppprof.bench.report import paired_ratios, per_prompt, spread, strategy_names, summarize

NO_TRANSFER = {"a_ms": 0.0, "b_ms_per_token": 0.0}


def rows(prompt: int, arm: str, repeat: int, stage_ms: list[list[float]], sizes: list[int]) -> list[dict]:
    """The bench.csv rows of one prompt: stage s ran chunk k in stage_ms[s][k] ms."""
    return [
        {
            "prompt": prompt,
            "arm": arm,
            "repeat": repeat,
            "prompt_len": sum(sizes),
            "stage": s,
            "chunk": k,
            "chunk_size": sizes[k],
            "compute_ms": t,
        }
        for s, per in enumerate(stage_ms)
        for k, t in enumerate(per)
    ]


def test_per_prompt_replays_the_pipeline_and_names_the_bottleneck():
    # Stage 0: 2, 2, 2 ms; stage 1: 1, 3, 1 ms. Stage 1 finishes chunk 0 at 3, chunk 1 at max(3, 4) + 3 = 7, chunk 2
    # at max(7, 6) + 1 = 8: replayed TTFT 8 ms; stage 0's total (6) is the larger, so it is the bottleneck.
    frame = pd.DataFrame(rows(0, "greedy", 0, [[2, 2, 2], [1, 3, 1]], [100, 100, 100]))
    (row,) = per_prompt(frame, {0: 9.0}, NO_TRANSFER, 2, real=True).to_dict("records")
    assert row["replay_ttft_ms"] == 8.0 and row["ttft_ms"] == 9.0 and row["num_chunks"] == 3
    assert row["bottleneck_stage"] == 0 and row["bottleneck_cv"] == 0.0
    assert row["idle_ms"] == [3.0, 4.0]  # measured 9 ms less each stage's compute


def test_a_transfer_delays_every_hop():
    frame = pd.DataFrame(rows(0, "fixed-100", 0, [[2, 2], [2, 2]], [100, 100]))
    transfer = {"a_ms": 0.5, "b_ms_per_token": 0.01}  # 1.5 ms a 100-token chunk
    (row,) = per_prompt(frame, {}, transfer, 2, real=False).to_dict("records")
    assert row["replay_ttft_ms"] == pytest.approx(2 + 1.5 + 2 + 2)  # stage 1 waits for chunk 0 only
    assert np.isnan(row["ttft_ms"])


def test_spread_skips_missing_values():
    assert spread(np.array([1.0, np.nan, 3.0, 2.0])) == {
        "median": 2.0,
        "min": 1.0,
        "max": 3.0,
        "p10": 1.2,
        "p90": pytest.approx(2.8),
    }
    assert spread(np.array([np.nan]))["median"] is None


def test_fixed_best_is_the_fixed_arm_of_least_median_and_ratios_pair_repeats():
    arms = [
        Arm("fixed-512", 300, (300,), 10.0, (10.0,)),
        Arm("fixed-256", 300, (256, 44), 9.0, (8.0, 1.0)),
        Arm("greedy", 300, (300,), 10.0, (10.0,)),
    ]
    ttft = {"fixed-512": [10.0, 12.0], "fixed-256": [8.0, 9.0], "greedy": [5.0, 9.0]}
    prompts = pd.DataFrame(
        [
            {
                "arm": arm,
                "repeat": r,
                "ttft_ms": t,
                "replay_ttft_ms": t,
                "num_chunks": 1,
                "bottleneck_cv": 0.0,
                "idle_ms": [0.0],
            }
            for arm, values in ttft.items()
            for r, t in enumerate(values)
        ]
    )
    names = strategy_names(arms, 512, prompts, "ttft_ms")
    assert names == {"greedy": "greedy", "fixed": "fixed-512", "fixed-best": "fixed-256"}
    ratios = paired_ratios(prompts, names, "ttft_ms")
    assert ratios["greedy/fixed"]["median"] == pytest.approx(np.median([5 / 10, 9 / 12]))
    assert ratios["greedy/fixed-best"]["median"] == pytest.approx(np.median([5 / 8, 9 / 9]))
    summary = summarize(prompts, arms, names, "ttft_ms")
    assert summary["fixed-best"]["prediction_error"] == pytest.approx(9.0 / 8.5 - 1)
    assert summary["greedy"]["replay_vs_real"] == 0.0

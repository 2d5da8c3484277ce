"""The calibration onto the pipelined level: fitted on the profile's pipelined runs, carried in the policy, and in
every prediction the policy makes."""

import json

import numpy as np
import pytest

from ppprof.fit import fit
from ppprof.fit.calibrate import calibration_of
from ppprof.fit.synthetic import make_pipeline_overhead, make_samples, write_run_dir
from ppprof.policy import load, validate
from ppprof.policy.planners import plan_prompt
from ppprof.policy.rule import LatencyModel

MODEL = LatencyModel("pairs", a=2e-7, b=0.01, c=5.0, g=4e-4, h=-1e-12)


@pytest.mark.parametrize("scale,shift", [(1.0, 0.0), (0.93, -0.6), (1.12, 0.8), (0.85, 0.0)])
def test_a_known_level_is_recovered_from_the_bottleneck_stage_of_the_runs(scale, shift):
    po = make_pipeline_overhead(MODEL, scale=scale, shift_ms=shift, overhead_ms=0.4, bottleneck_stage=1)
    cal = calibration_of({"pipeline_overhead": po}, MODEL, 1)
    assert cal["source"] == "measured"
    assert cal["scale"] == pytest.approx(scale, abs=1e-5) and cal["shift_ms"] == pytest.approx(shift, abs=1e-3)
    # B = 2048: the 512 plan after 8 chunks of B; every run's first chunk left out; cells shared by runs merge
    assert cal["cells"] == 7 + 8 + 7 and cal["chunk_sizes"] == [512, 2048, 4096] and cal["max_prefix_len"] == 7 * 4096
    planned = MODEL.planning(cal, 0.4)
    L, x = np.array([0, 5000, 60000]), np.array([64, 1000, 4096])
    want = scale * MODEL.chunk_latency_ms(L, x) + shift + 0.4
    np.testing.assert_allclose(planned.chunk_latency_ms(L, x), want, rtol=1e-4)


def test_noise_leaves_the_level_within_its_standard_errors():
    po = make_pipeline_overhead(MODEL, scale=0.92, shift_ms=-0.5, noise=0.03, repeats=5, seed=3)
    cal = calibration_of({"pipeline_overhead": po}, MODEL, 0)
    assert abs(cal["scale"] - 0.92) < 4 * cal["scale_stderr"] + 1e-3, cal
    assert abs(cal["shift_ms"] + 0.5) < 4 * cal["shift_stderr_ms"] + 0.05, cal
    assert 0 < cal["rel_residual"] < 0.05


def test_runs_without_stage_times_one_size_or_a_wild_level_give_none_and_say_why():
    po = make_pipeline_overhead(MODEL)
    for r in po["runs"]:
        del r["stage_ms"]  # a run.json written before the runs recorded them
    cal = calibration_of({"pipeline_overhead": po}, MODEL, 0)
    assert (cal["scale"], cal["shift_ms"], cal["source"]) == (1.0, 0.0, "none") and "two chunk sizes" in cal["why"]
    one = make_pipeline_overhead(MODEL, chunk_sizes=(1024,), base_chunk_size=1024)
    assert "two chunk sizes" in calibration_of({"pipeline_overhead": one}, MODEL, 0)["why"]
    wild = make_pipeline_overhead(MODEL, scale=3.0)
    cal = calibration_of({"pipeline_overhead": wild}, MODEL, 0)
    assert cal["source"] == "none" and "outside" in cal["why"] and cal["rejected"]["scale"] == pytest.approx(3.0)
    negative = make_pipeline_overhead(MODEL, scale=0.6, shift_ms=-4.0)  # a 1-token chunk would cost < 0
    cal = calibration_of({"pipeline_overhead": negative}, MODEL, 0)
    assert cal["source"] == "none" and "not positive" in cal["why"]
    assert calibration_of(None, MODEL, 0)["source"] == "none" and calibration_of({}, None, 0)["why"] == \
        "no latency model"


def fitted(tmp_path, scale, shift):
    frame = make_samples(MODEL, base_chunk_size=4096, prefixes=[0, 8192, 32768, 65536],
                         chunk_sizes=[512, 1024, 2048, 4096, 8192], noise=0.0, bottleneck_stage=1)
    po = make_pipeline_overhead(MODEL, scale=scale, shift_ms=shift, overhead_ms=0.5, bottleneck_stage=1)
    write_run_dir(tmp_path, frame, base_chunk_size=4096, context_len=131072, min_gain=0.0, pipeline_overhead=po)
    path, data = fit(tmp_path / "samples.csv", latency_model="pairs")
    return load(path), data


def test_the_policy_carries_the_level_and_plans_and_predicts_with_it(tmp_path):
    policy, data = fitted(tmp_path / "cold", 0.9, -0.7)
    cal = data["calibration"]
    assert cal["source"] == "measured" and cal["stage"] == 1
    assert cal["scale"] == pytest.approx(0.9, rel=1e-6) and cal["shift_ms"] == pytest.approx(-0.7, abs=1e-3)
    assert data["overhead"]["ms_per_chunk"] == pytest.approx(0.5, abs=1e-3)
    assert "pipelined level 0.900 t -0.7 ms" in validate(policy)
    # the planning model is the fitted one at the pipelined level, plus the overhead
    L, x = np.array([0, 10000, 90000]), np.array([256, 4096, 2048])
    np.testing.assert_allclose(policy.planning_model.chunk_latency_ms(L, x),
                               0.9 * policy.model.chunk_latency_ms(L, x) - 0.7 + 0.5, rtol=1e-4)
    plans = {p.strategy: p for p in plan_prompt(policy, 60000, policy.num_stages)}
    fixed = plans["fixed"]
    t = 0.9 * policy.model.chunk_latency_ms(np.cumsum([0] + fixed.chunk_sizes[:-1]), fixed.chunk_sizes) - 0.2
    assert fixed.ttft_ms == pytest.approx(t.sum() + (policy.num_stages - 1) * t.max(), rel=1e-6)
    # the same samples at another level: the tables are chosen on the level the pipeline runs at
    warm, _ = fitted(tmp_path / "same", 1.0, 0.0)
    assert warm.calibration["scale"] == pytest.approx(1.0, abs=1e-5) and abs(warm.calibration["shift_ms"]) < 1e-3
    assert json.dumps(policy.data["prompt_table"]) != json.dumps(warm.data["prompt_table"])

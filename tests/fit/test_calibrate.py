"""The calibration onto the pipelined level: fitted on the profile's pipelined runs, carried in the policy, and in
every prediction the policy makes."""

import json

import numpy as np
import pytest

from ppprof.bench.overhead import overhead_plans, overhead_run, summarize
from ppprof.fit import fit
from ppprof.fit.calibrate import calibration_of
from ppprof.fit.synthetic import SyntheticProbes, SyntheticRun, make_samples, write_run_dir
from ppprof.policy import load, validate
from ppprof.policy.planners import plan_prompt
from ppprof.policy.rule import LatencyModel
from ppprof.policy.timeline import replay

MODEL = LatencyModel("pairs", a=2e-7, b=0.01, c=5.0, g=4e-4, h=-1e-12)


def make_pipeline_overhead(
    model: LatencyModel,
    *,
    chunk_sizes=(512, 2048, 4096),
    base_chunk_size: int = 2048,
    capacity: int = 131072,
    repeats: int = 3,
    linear_scale: float = 1.0,
    shift_ms: float = 0.0,
    overhead_ms: float = 0.0,
    pp_size: int = 2,
    bottleneck_stage: int = 0,
    noise: float = 0.0,
    seed: int = 0,
) -> dict:
    """run.json's pipeline_overhead as the profile's pipelined runs would record it (its plans: overhead_plans)
    where the bottleneck stage's forwards take the model at that level, linear_scale (c + b x) + the attention terms
    + shift_ms (x (1 + noise N(0,1))), the other stages 60% of that, and every chunk costs overhead_ms beyond them."""
    rng = np.random.default_rng(seed)
    runs = []
    for repeat, chunks in overhead_plans(list(chunk_sizes), capacity, repeats, base_chunk_size)[1]:
        prefix = np.cumsum([0] + list(chunks[:-1]))
        level = model.planning({"linear_scale": linear_scale, "shift_ms": shift_ms}, 0.0)
        t = level.chunk_latency_ms(prefix, np.array(chunks)) * (1 + noise * rng.standard_normal(len(chunks)))
        stage_ms = np.array([t * (1.0 if s == bottleneck_stage else 0.6) for s in range(pp_size)])
        measured = float(replay(stage_ms + overhead_ms)[1][-1, -1])
        runs.append(overhead_run(chunks, stage_ms, measured, repeat))
    return summarize(runs, pp_size)


@pytest.mark.parametrize("scale,shift", [(1.0, 0.0), (0.93, -0.6), (1.12, 0.8), (0.85, 0.0)])
def test_a_known_level_is_recovered_from_the_bottleneck_stage_of_the_runs(scale, shift):
    po = make_pipeline_overhead(MODEL, linear_scale=scale, shift_ms=shift, overhead_ms=0.4, bottleneck_stage=1)
    cal = calibration_of({"pipeline_overhead": po}, MODEL, 1)
    assert cal["source"] == "measured"
    assert cal["linear_scale"] == pytest.approx(scale, abs=1e-5) and cal["shift_ms"] == pytest.approx(shift, abs=1e-3)
    # B = 2048: the 512 plan after 8 chunks of B; every run's first chunk left out; cells shared by runs merge
    assert cal["cells"] == 7 + 8 + 7 and cal["chunk_sizes"] == [512, 2048, 4096] and cal["max_prefix_len"] == 7 * 4096
    planned = MODEL.planning(cal, 0.4)
    L, x = np.array([0, 5000, 60000]), np.array([64, 1000, 4096])
    want = MODEL.chunk_latency_ms(L, x) + (scale - 1) * (MODEL.c + MODEL.b * x) + shift + 0.4
    np.testing.assert_allclose(planned.chunk_latency_ms(L, x), want, rtol=1e-4)


def test_noise_leaves_the_level_within_its_standard_errors():
    po = make_pipeline_overhead(MODEL, linear_scale=0.92, shift_ms=-0.5, noise=0.03, repeats=5, seed=3)
    cal = calibration_of({"pipeline_overhead": po}, MODEL, 0)
    assert abs(cal["linear_scale"] - 0.92) < 4 * cal["linear_scale_stderr"] + 1e-3, cal
    assert abs(cal["shift_ms"] + 0.5) < 4 * cal["shift_stderr_ms"] + 0.05, cal
    assert 0 < cal["rel_residual"] < 0.05


def test_runs_without_stage_times_one_size_or_a_wild_level_give_none_and_say_why():
    po = make_pipeline_overhead(MODEL)
    for r in po["runs"]:
        del r["stage_ms"]  # a run.json written before the runs recorded them
    cal = calibration_of({"pipeline_overhead": po}, MODEL, 0)
    assert (cal["linear_scale"], cal["shift_ms"], cal["source"]) == (1.0, 0.0, "none") and "two chunk sizes" in cal[
        "why"
    ]
    one = make_pipeline_overhead(MODEL, chunk_sizes=(1024,), base_chunk_size=1024)
    assert "two chunk sizes" in calibration_of({"pipeline_overhead": one}, MODEL, 0)["why"]
    wild = make_pipeline_overhead(MODEL, linear_scale=3.0)
    cal = calibration_of({"pipeline_overhead": wild}, MODEL, 0)
    assert cal["source"] == "none" and "outside" in cal["why"] and cal["rejected"]["linear_scale"] == pytest.approx(3.0)
    negative = make_pipeline_overhead(MODEL, linear_scale=0.6, shift_ms=-4.0)  # a 1-token chunk would cost < 0
    cal = calibration_of({"pipeline_overhead": negative}, MODEL, 0)
    assert cal["source"] == "none" and "not positive" in cal["why"]
    assert (
        calibration_of(None, MODEL, 0)["source"] == "none" and calibration_of({}, None, 0)["why"] == "no latency model"
    )


def fitted(tmp_path, scale, shift):
    frame = make_samples(
        MODEL,
        SyntheticProbes(
            base_chunk_size=4096,
            prefixes=[0, 8192, 16384, 32768],
            chunk_sizes=[512, 1024, 2048, 4096, 8192],
            noise=0.0,
            bottleneck_stage=1,
        ),
    )
    po = make_pipeline_overhead(MODEL, linear_scale=scale, shift_ms=shift, overhead_ms=0.5, bottleneck_stage=1)
    # a 65536-token context: the calibration's point needs no more, and the rules' tables cost 4x less to build
    write_run_dir(
        tmp_path, frame, SyntheticRun(base_chunk_size=4096, context_len=65536, min_gain=0.0, pipeline_overhead=po)
    )
    path, data = fit(tmp_path / "samples.csv", latency_model="pairs", policy_options={"load_rule": False})
    return load(path), data


def test_the_policy_carries_the_level_and_plans_and_predicts_with_it(tmp_path):
    policy, data = fitted(tmp_path / "cold", 0.9, -0.7)
    cal = data["calibration"]
    assert cal["source"] == "measured" and cal["stage"] == 1
    assert cal["linear_scale"] == pytest.approx(0.9, rel=1e-6) and cal["shift_ms"] == pytest.approx(-0.7, abs=1e-3)
    assert data["overhead"]["ms_per_chunk"] == pytest.approx(0.5, abs=1e-3)
    assert "calibration 0.900 (c + b x) -0.7 ms" in validate(policy)
    # the planning model is the fitted one at the pipelined level, plus the overhead
    L, x = np.array([0, 10000, 90000]), np.array([256, 4096, 2048])
    m = policy.latency_model
    np.testing.assert_allclose(
        policy.planning_model.chunk_latency_ms(L, x),
        m.chunk_latency_ms(L, x) - 0.1 * (m.c + m.b * x) - 0.7 + 0.5,
        rtol=1e-4,
    )
    plans = {p.strategy: p for p in plan_prompt(policy, 30000, policy.pp_size)}
    fixed = plans["fixed"]
    sizes = np.array(fixed.chunk_sizes)
    t = m.chunk_latency_ms(np.cumsum([0] + fixed.chunk_sizes[:-1]), sizes) - 0.1 * (m.c + m.b * sizes) - 0.2
    assert fixed.ttft_ms == pytest.approx(t.sum() + (policy.pp_size - 1) * t.max(), rel=1e-6)
    # the same samples at another level: the tables are chosen on the level the pipeline runs at
    warm, _ = fitted(tmp_path / "same", 1.0, 0.0)
    assert warm.calibration["linear_scale"] == pytest.approx(1.0, abs=1e-5) and abs(warm.calibration["shift_ms"]) < 1e-3
    assert json.dumps(policy.data["prompt_table"]) != json.dumps(warm.data["prompt_table"])

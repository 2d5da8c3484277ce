import json

import numpy as np
import pandas as pd
import pytest

from ppprof.fit import fit, fit_run
from ppprof.fit.build import fit_samples, rechoose
from ppprof.fit.fitted import Report, RunSamples, document
from ppprof.fit.selection import warmup_rows
from ppprof.fit.settings import resolve_policy_options, resolve_settings
from ppprof.fit.synthetic import SyntheticProbes, SyntheticRun, make_samples, write_run_dir
from ppprof.policy import SCHEMA_VERSION, load, save, validate
from ppprof.policy.rule import LatencyModel
from ppprof.policy.runtime import REPORT_ORDER, Policy

PREFIX_TRUE = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=4e-4)


IDLE = {"load_rule": False}
"""Fits whose checks read nothing of the under-load rule skip its simulation (test_fit_run_... and the stage
columns' test keep it)."""


def run_dir(tmp_path, model=PREFIX_TRUE, noise=0.01, min_gain=0.0, **kw):
    """A synthetic run; min_gain 0 by default, so that a model that passes the gates gives a dynamic policy."""
    frame = make_samples(
        model,
        SyntheticProbes(
            base_chunk_size=4096,
            prefixes=[0, 8192, 32768, 65536],
            chunk_sizes=[512, 1024, 2048, 4096],
            noise=noise,
            bottleneck_stage=1,
        ),
        **kw,
    )
    write_run_dir(tmp_path, frame, SyntheticRun(base_chunk_size=4096, context_len=131072, min_gain=min_gain))
    return tmp_path


def test_fit_run_writes_dynamic_policy_and_plots(tmp_path):
    path = fit_run(run_dir(tmp_path))
    assert path == tmp_path / "policy.json"
    assert (tmp_path / "fit.png").stat().st_size > 1000 and (tmp_path / "chunks.png").stat().st_size > 1000
    data = json.loads(path.read_text())
    assert data["status"] == "dynamic", data["reason"]
    assert data["latency_model"]["name"] == "prefix"
    assert data["latency_model"]["coefficients"]["a"]["unit"] == "ms/token^2"
    assert data["report"]["diagnostics"]["bottleneck_stage"] == 1
    assert set(data["report"]["diagnostics"]["predicted_shrink"]) == {"fraction", "prefix_len"}
    assert {"prefix_len", "chunk_size"} <= set(data["report"]["diagnostics"]["worst_residual"])
    assert (
        set(data["table"]) <= {"prefix_len", "chunk_size", "bound_ms", "chunk_cap"}
        and data["schema_version"] == SCHEMA_VERSION
    )
    assert data["overhead"]["source"] in ("measured", "none") and data["num_stages"] == 2
    assert data["report"]["provenance"]["pp_size"] == 2 and data["report"]["provenance"]["layer_partition"] == [2, 2]
    assert data["settings"]["alignment"] == 64 and data["settings"]["min_chunk_size"] == 1024
    assert data["target_latency_ms"] == pytest.approx(PREFIX_TRUE.target_ms(4096), rel=0.05)
    policy = load(path)
    assert validate(policy).startswith("dynamic")
    first, deep = policy.next_chunk_size(0, 60000), policy.next_chunk_size(50000, 60000)
    assert first >= deep and deep % policy.data["prompt_table"]["unit"] == 0, (first, deep)


def test_gate_failures_give_static_with_reason(tmp_path):
    linear = LatencyModel("prefix", a=0.0, b=0.01, c=5.0, g=0.0)  # no growth with prefix: nothing to shrink
    _, data = fit(
        run_dir(tmp_path / "flat", linear, min_gain=0.05) / "samples.csv", policy_options=IDLE
    )  # passes the gates, gains little
    assert data["status"] == "static" and "below 5.0%" in data["reason"], data["reason"]
    best = data["report"]["predicted"]["fixed_best_chunk"]
    assert data["table"]["chunk_size"] == [best] and data["prompt_table"]["chunk_size"] == [[best]]
    # Rows scattered by 40%: the per-row gates fail (diagnostics only); the right form's cell medians bear it out, so
    # the model is adequate and the gain's interval decides.
    _, data = fit(run_dir(tmp_path / "noisy", noise=0.4) / "samples.csv", policy_options=IDLE)
    diag = data["report"]["diagnostics"]
    assert [g["passed"] for g in diag["row_gates"]] == [False, False] and diag["cv_mape"] > 0.3, diag["row_gates"]
    assert [g["name"] for g in diag["gates"]] == ["form_error", "condition_number"] and all(
        g["passed"] for g in diag["gates"]
    ), diag["gates"]
    assert "adequate" in data["reason"] and "lower bound" in data["reason"], data["reason"]
    _, data = fit(run_dir(tmp_path / "forced", linear) / "samples.csv", latency_model="quadratic", policy_options=IDLE)
    assert data["status"] == "static" and "quadratic" in data["reason"], data["reason"]


def test_plain_csv_needs_base_chunk_size(tmp_path):
    frame = make_samples(
        PREFIX_TRUE, SyntheticProbes(base_chunk_size=4096, prefixes=[0, 8192, 32768], chunk_sizes=[1024, 4096])
    )
    csv = tmp_path / "mine.csv"
    frame[["prefix_len", "chunk_size", "latency_ms"]].to_csv(csv, index=False)
    with pytest.raises(ValueError, match="--base-chunk-size is required"):
        fit(csv)
    assert not (tmp_path / "policy.json").exists()
    path, data = fit(csv, base_chunk_size=4096, context_len=65536, policy_options={"min_gain": 0.0})
    assert data["status"] == "dynamic", data["reason"]
    assert data["report"]["diagnostics"]["bottleneck_stage"] is None
    assert data["report"]["provenance"]["pp_size"] is None and data["settings"]["context_len"] == 65536


def test_bad_csv_values_name_the_row(tmp_path):
    csv = tmp_path / "bad.csv"
    pd.DataFrame({"prefix_len": [0, 0], "chunk_size": [64, -1], "latency_ms": [1.0, 2.0]}).to_csv(csv, index=False)
    with pytest.raises(ValueError, match="chunk_size row 2"):
        fit(csv, base_chunk_size=4096)


def test_quadratic_is_fitted_on_prefix_free_rows_and_scored_on_all(tmp_path):
    heavy_prefix = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=1.5e-3)
    _, data = fit(run_dir(tmp_path, heavy_prefix) / "samples.csv", latency_model="quadratic", policy_options=IDLE)
    diag = data["report"]["diagnostics"]
    assert diag["fit"]["rows"].startswith("143 of the 143 prefix-free rows (prefix_len == 0)"), diag["fit"]["rows"]
    assert diag["fit"]["r2"] > 0.99, diag["fit"]
    assert diag["num_evaluation_rows"] == 127 + 4 * 16 and "48 prefixed" in diag["rows"], diag["rows"]
    # The planner's view of the prefixed rows is poor for this model (it has no prefix term g L): the per-row gates
    # see it, and so do the cells' medians, which refuse it.
    assert diag["r2"] < diag["fit"]["r2"] and diag["cv_mape"] > 0.10, diag
    assert data["status"] == "static" and "gate form_error" in data["reason"], data["reason"]
    assert diag["gates"][0]["value"] > 0.3 and not diag["gates"][0]["passed"], diag["gates"]
    _, data = fit(run_dir(tmp_path / "auto") / "samples.csv", policy_options=IDLE)
    candidates = data["report"]["diagnostics"]["candidates"]
    assert candidates["prefix"]["cv_mape"] < candidates["quadratic"]["cv_mape"], candidates
    assert candidates["quadratic"]["rows"].startswith("all 191 evaluation rows"), candidates
    assert data["latency_model"]["name"] == "prefix" and data["report"]["diagnostics"]["selected_by"] == "held_out_mape"


def test_quadratic_without_enough_prefix_free_rows_is_static(tmp_path):
    frame = make_samples(
        PREFIX_TRUE,
        SyntheticProbes(base_chunk_size=4096, prefixes=[8192, 32768, 65536], chunk_sizes=[512, 1024, 2048, 4096]),
    )
    frame = frame[(frame.prefix_len > 0) | (frame.index < 8)]  # the first 8 sweep rows; 7 are left after warm-up
    csv = tmp_path / "samples.csv"
    frame.to_csv(csv, index=False)
    _, data = fit(csv, latency_model="quadratic", base_chunk_size=4096)
    assert data["status"] == "static", data["reason"]
    assert "quadratic needs >= 8 prefix-free samples (prefix_len == 0), has 7" in data["reason"], data["reason"]


def test_warmup_rows():
    assert warmup_rows(np.array([0, 0, 5])) == [0]
    assert warmup_rows(np.array([5, 5, 0, 0])) == [0, 2]  # the cold row, and SGLang's first prefix-free one
    assert warmup_rows(np.array([5, 5])) == [0]


def test_the_policy_carries_the_design_run_json_records(tmp_path):
    from ppprof.runfiles import RUN_FILE

    frame = make_samples(
        LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=4e-4),
        SyntheticProbes(base_chunk_size=4096, prefixes=[8192, 32768, 65536], chunk_sizes=[512, 2048, 4096]),
    )
    samples = write_run_dir(tmp_path, frame, SyntheticRun(base_chunk_size=4096))
    _, policy = fit(samples, policy_options=IDLE)
    assert "design" not in policy  # a run.json without one: nothing invented
    run = json.loads((tmp_path / RUN_FILE).read_text())
    run["design"] = {"design": "adaptive", "stopping_reason": "stable", "requests": 40, "uncertainty": None}
    (tmp_path / RUN_FILE).write_text(json.dumps(run))
    _, policy = fit(samples, policy_options=IDLE)
    assert policy["report"]["design"] == run["design"]


def test_without_run_json_the_rules_are_chosen_for_the_samples_stage_columns(tmp_path):
    """A samples.csv of 4 stages and no run.json: the fit plans for 4 stages, not 1, and the command says so."""
    from click.testing import CliRunner

    from ppprof.cli import main

    frame = make_samples(
        PREFIX_TRUE,
        SyntheticProbes(base_chunk_size=4096, prefixes=[0, 8192, 32768], chunk_sizes=[1024, 4096], pp_size=4),
    )
    csv = tmp_path / "four.csv"
    frame.to_csv(csv, index=False)
    _, data = fit(csv, base_chunk_size=4096, context_len=65536)
    assert data["num_stages"] == 4
    _, given = fit(csv, tmp_path / "p2.json", base_chunk_size=4096, context_len=65536, policy_options={"pp_size": 2})
    assert given["num_stages"] == 2
    r = CliRunner().invoke(main, ["fit", str(csv), "--base-chunk-size", "4096", "--context-len", "65536"])
    assert r.exit_code == 0, r.output
    assert "note: no run.json beside" in r.stderr and "its 4 stage columns" in r.stderr


def test_a_static_policy_may_carry_a_target_that_is_not_positive(tmp_path):
    """Noisy timings on a tiny model can fit a latency that grows with the prefix only (the coefficients are not
    negative, so a = b = 0 and T = 0; a 4-rank MLA profile in CI did): the fit says static, naming the target, and the
    policy it writes validates; a dynamic policy with that target is refused."""
    _, data = fit(run_dir(tmp_path) / "samples.csv", policy_options=IDLE)
    flat = LatencyModel("prefix", a=0.0, b=0.0, c=5.0, g=4e-4)
    static = rechoose(data, flat, "static", f"target latency {flat.target_ms(4096):.4g} ms is not positive")
    assert static["target_latency_ms"] == 0 and static["reason"] == "target latency 0 ms is not positive"
    assert validate(load(save(tmp_path / "static.json", static))).startswith("static")
    with pytest.raises(ValueError, match=r"\$.target_latency_ms: 0.0 is less than or equal to the minimum of 0"):
        save(tmp_path / "dynamic.json", static | {"status": "dynamic"})


def test_the_fit_returns_the_contract_and_the_report_that_make_up_the_file_written(tmp_path):
    """fit_samples, on samples held in memory, returns the contract a server reads and the report beside it; joined,
    they are the policy `ppprof fit` writes from the same rows read from the files (but for its creation time)."""
    folder = run_dir(tmp_path)
    measured = RunSamples.read(folder / "samples.csv")
    settings = resolve_settings(measured.run, measured.samples.path)
    options = resolve_policy_options(measured.run, measured.samples.path, settings.context_len, **IDLE)
    contract, report = fit_samples(measured, settings, options)
    assert isinstance(contract, Policy) and isinstance(report, Report)
    assert contract.status == "dynamic" and report.predicted["fixed_best_chunk"] == contract.fixed_best_chunk
    ours = document(contract, report)
    assert ours["schema_version"] == 6 and list(ours)[-1] == "report" and ours["report"] == report.to_dict()
    assert not set(ours) & set(REPORT_ORDER), "each field is the contract's or the report's"
    assert list(ours["report"]) == [k for k in REPORT_ORDER if k in ours["report"]]
    written = fit(folder / "samples.csv", tmp_path / "written.json", policy_options=IDLE)[1]
    assert list(written) == list(ours) and list(written["report"]) == list(ours["report"])
    prov = {"provenance": None}
    assert ours | {"report": ours["report"] | prov} == written | {"report": written["report"] | prov}
    ours, written = ours["report"]["provenance"], written["report"]["provenance"]
    assert {**ours, "created_at": None} == {**written, "created_at": None}

"""ppprof.policy.policy_file: policy.json read and written through one check; the schema's and the rules' errors."""

import copy
import json
import math

import pytest

from ppprof.policy import LatencyModel, from_dict, load, save, validate

from .policy_helpers import policy_dict

MODEL = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=2e-4)


def test_save_load_roundtrip(tmp_path):
    data = policy_dict(MODEL)
    path = save(tmp_path / "p.json", data)
    p = load(path)
    assert p.latency_model == MODEL and p.settings.base_chunk_size == 8192
    assert json.loads(path.read_text()) == data
    assert validate(p).startswith("dynamic (prefix, overhead 0 ms a chunk, 4 stages): prompt-aware rule of")


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda d: d.update(schema_version=2), "schema_version 2 is not supported"),
        (lambda d: d.pop("table"), r"\$\.table: missing"),
        (lambda d: d.update(status="maybe"), r"\$\.status: 'maybe' is not one of"),
        (
            lambda d: d["settings"].update(smooth_factor=2.0),
            r"\$\.settings\.smooth_factor: 2\.0 is greater than the maximum",
        ),
        (
            lambda d: d["latency_model"]["coefficients"]["a"].update(unit="s"),
            r"\$\.latency_model\.coefficients\.a\.unit: 's' given, 'ms/token\^2' expected",
        ),
        (
            lambda d: d["table"].update(prefix_len=[1] + d["table"]["prefix_len"][1:]),
            r"\$\.table\.prefix_len\[0\]: 1 given",
        ),
        (lambda d: d["report"].update(design={"design": "adaptive"}), r"\$\.report\.design\.stopping_reason: missing"),
        (lambda d: d["report"].update(design=[]), r"\$\.report\.design: \[\] is not of type 'object'"),
    ],
)
def test_schema_errors(tmp_path, mutate, message):
    data = copy.deepcopy(policy_dict(MODEL))
    mutate(data)
    (tmp_path / "p.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        load(tmp_path / "p.json")


def test_schema_version_1_is_refused(tmp_path):
    data = policy_dict(MODEL)
    data["schema_version"] = 1
    data["table"] = {"history_len": data["table"].pop("prefix_len"), "chunk_size": data["table"]["chunk_size"]}
    (tmp_path / "p.json").write_text(json.dumps(data))
    with pytest.raises(
        ValueError,
        match=r"schema_version 1 is not supported: this ppprof reads 3, 4, 5, 6; regenerate it "
        r"with `ppprof fit`$",
    ):
        load(tmp_path / "p.json")


def test_validate_catches_a_tampered_table():
    data = policy_dict(MODEL)
    data["table"]["chunk_size"][3] += 64
    with pytest.raises(ValueError, match=r"\$\.table: chunk .* is not the rule's .* from the coefficients"):
        validate(from_dict(data))
    data = policy_dict(MODEL)
    data["prompt_table"]["chunk_size"][-1][-1] += 512
    with pytest.raises(ValueError, match=r"\$\.prompt_table\.band\[\d+\]: chunk"):
        validate(from_dict(data))
    data = policy_dict(MODEL, overhead_ms=3.0)  # the tables are the rules on the planning model (c + overhead)
    data["overhead"]["ms_per_chunk"] = 0.0
    with pytest.raises(ValueError, match="from the coefficients, overhead and bound"):
        validate(from_dict(data))
    data = policy_dict(MODEL, status="static")
    data["table"] = {"prefix_len": [0, 10], "chunk_size": [8192, 4096]}
    with pytest.raises(ValueError, match="static policy's table and prompt_table must be the one fixed chunk"):
        validate(from_dict(data))


def test_save_refuses_what_load_refuses_and_writes_nothing(tmp_path):
    path = tmp_path / "p.json"
    data = policy_dict(MODEL)
    data["table"]["chunk_size"][3] += 64  # the schema takes it; the rule rebuilt does not
    with pytest.raises(ValueError, match=r"\$\.table: chunk .* is not the rule's .* from the coefficients"):
        save(path, data)
    data = policy_dict(MODEL)
    data["report"]["diagnostics"] = {"rms": math.nan}  # json.dumps writes NaN; the strict reader refuses it
    with pytest.raises(ValueError, match="is not strict JSON: NaN is not a JSON number"):
        save(path, data)
    data = policy_dict(MODEL)
    data["settings"]["context_len"] = 10**30
    with pytest.raises(ValueError, match=r"\$\.settings\.context_len: 10{30} is outside 0\.\.2147483647"):
        save(path, data)
    assert not path.exists()


def test_load_reports_missing_and_broken_files(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ValueError, match="not readable JSON"):
        load(tmp_path / "bad.json")


@pytest.mark.parametrize(
    "model",
    [
        LatencyModel("quadratic", a=2e-6, b=0.05, c=3.0),
        LatencyModel("prefix", a=2e-6, b=0.05, c=3.0, g=1e-4),
        LatencyModel("pairs", a=2e-6, b=0.05, c=3.0, g=1e-4, h=3e-11),
    ],
)
def test_every_model_round_trips_and_drives_the_rule_the_table_and_the_planners(tmp_path, model):
    from ppprof.policy.planners import plan_prompt
    from ppprof.policy.rule import next_chunk_size
    from tests.policy.policy_helpers import policy_dict

    path = save(tmp_path / "policy.json", policy_dict(model))
    policy = load(path)
    assert policy.latency_model == model
    assert validate(policy).startswith(f"dynamic ({model.name}")
    greedy = policy.sglang_plan(65536)  # SGLang's rule, from the coefficients and the settings
    assert greedy[0] == 8192 and greedy[1] == next_chunk_size(model, policy.settings, policy.target_ms, 8192)
    plans = {p.strategy: p for p in plan_prompt(policy, 65536, 4)}
    assert {sum(p.chunk_sizes) for p in plans.values()} == {65536}
    assert plans["optimal"].ttft_ms <= min(p.ttft_ms for p in plans.values()) + 1e-9
    assert plans["policy"].chunk_sizes == policy.plan(65536)
    # The rule's unit here is 256 tokens (a 131072-token context), the DP's grid 128: a little slack for the grid.
    assert plans["policy"].ttft_ms <= 1.02 * plans["optimal"].ttft_ms


def test_a_coefficient_the_model_lacks_is_refused():
    with pytest.raises(ValueError, match="prefix latency model has h=1e-09: h must be 0"):
        LatencyModel("prefix", a=1e-6, b=0.01, c=1.0, h=1e-9)

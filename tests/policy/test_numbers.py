"""ppprof.policy.numbers: every number of a policy file is bounded, by the schema or by the reader, and a number
beyond its bound is refused in one line naming the field, the value and the fix (issue 32: a context_len of 10^30
validated ok)."""

import copy
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from ppprof.bounds import MAX_TOKENS
from ppprof.cli import main
from ppprof.config import PolicyOptions
from ppprof.fit.build import with_load
from ppprof.policy import LatencyModel, from_dict, load
from ppprof.policy.numbers import FIELDS, number_error, values_at
from ppprof.policy.runtime import flattened, nested, upgraded
from ppprof.policy.schema import policy_schema
from ppprof.policy.tables import LoadRule

from .policy_helpers import policy_dict, with_packed_forwards

REPO = Path(__file__).resolve().parents[2]
MODEL = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=2e-4)
FULL = (REPO / "tests" / "runs" / "tiny-hybrid" / "policy.json", REPO / "results" / "baseline" / "policy.json")
"""Two policies `ppprof profile` wrote, which between them hold every field FIELDS names."""


def steps(path: str) -> list[str]:
    return re.findall(r"\[\]|[^.\[\]]+", path)


def schema_numbers(node: dict, schema: dict, path: str = ""):
    """(path, has an upper bound) of each number the schema allows, `[]` for a list's items."""
    if "$ref" in node:
        target = schema
        for key in node["$ref"].removeprefix("#/").split("/"):
            target = target[key]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    for key in ("allOf", "oneOf", "anyOf"):
        for sub in node.get(key, ()):
            yield from schema_numbers(sub, schema, path)
    types = node.get("type", [])
    if {"integer", "number"} & set([types] if isinstance(types, str) else types):
        yield path, "maximum" in node or "exclusiveMaximum" in node
    for key, sub in node.get("properties", {}).items():
        yield from schema_numbers(sub, schema, f"{path}.{key}".lstrip("."))
    for sub in [node["items"]] if isinstance(node.get("items"), dict) else []:
        yield from schema_numbers(sub, schema, f"{path}[]")
    for sub in node.get("prefixItems", ()):
        yield from schema_numbers(sub, schema, f"{path}[]")


def test_every_number_the_schema_allows_has_an_upper_bound():
    schema = policy_schema()
    patterns = [re.escape(path).replace(r"\*", r"[^.\[]+") for path, _ in FIELDS]
    unbounded = sorted(
        {p for p, bounded in schema_numbers(schema, schema) if not bounded}
        - {p for p, _ in schema_numbers(schema, schema) if any(re.fullmatch(q, p) for q in patterns)}
    )
    assert unbounded == []


def test_every_field_bounded_is_a_field_ppprof_writes():
    # The committed policies predate packed_forwards and load: their fields come from what `ppprof fit` writes.
    docs = [upgraded(json.loads(p.read_text())) for p in FULL] + [with_packed_forwards(policy_dict(MODEL), MODEL)]
    docs.append(nested(with_load(flattened(policy_dict(MODEL)) | {"diagnostics": {}}, PolicyOptions())))
    # a schema 5 rule with a floor and a bound as choose_load writes it, and a schema 4 one as fit wrote it
    chosen = {"num_prompts": 24, "seed": 0, "async_depth": 0, "worst_loss": 0.01, "idle_worst_loss": 0.2}
    docs.append(policy_dict(MODEL) | {"load": LoadRule(4, 2.0, 64, 12.0, 1024, 256).to_dict() | chosen})
    docs.append(upgraded(json.loads((REPO / "results" / "serving-real" / "profile" / "policy.json").read_text())))
    assert [path for path, _ in FIELDS if not any(list(values_at(d, steps(path))) for d in docs)] == []
    assert all(number_error(d) is None for d in docs)


def test_a_bound_takes_its_largest_value_and_refuses_one_more():
    data = policy_dict(MODEL)
    data["settings"]["context_margin"] = MAX_TOKENS
    assert number_error(data) is None
    data["settings"]["context_margin"] = MAX_TOKENS + 1
    assert number_error(data) == (
        f"$.settings.context_margin: {MAX_TOKENS + 1} is outside 0..{MAX_TOKENS}, the range of a token count "
        "(servers index tokens with int32)"
    )


def last(d: dict, key: str, value) -> None:
    d[key][-1] = value


@pytest.mark.parametrize(
    "mutate, where",
    [
        (lambda d: d["settings"].update(context_len=10**30), r"\$\.settings\.context_len: 10{30} is outside"),
        (lambda d: last(d["table"], "chunk_size", 2**31), r"\$\.table\.chunk_size\[\d+\]: 2147483648 is outside"),
        (lambda d: last(d["prompt_table"]["prefix_len"], 0, 2**40), r"\$\.prompt_table\.prefix_len\[\d+\]\[\d+\]"),
        (lambda d: d.update(num_stages=10**6), r"\$\.num_stages: 1000000 is outside 1\.\.1024"),
        (lambda d: d["latency_model"]["coefficients"]["a"].update(value=1e300), r"coefficients\.a\.value: 1e\+300"),
        (lambda d: d["calibration"].update(linear_scale=1e9), r"\$\.calibration\.linear_scale: 1000000000\.0"),
        (lambda d: d["overhead"].update(ms_per_chunk=1e30), r"\$\.overhead\.ms_per_chunk: 1e\+30 is outside 0\.\."),
        (lambda d: d["report"]["provenance"].update(tp_size=1000), r"\$\.report\.provenance\.tp_size: 1000 is outside"),
        (
            lambda d: d["report"]["predicted"].update(gain_vs_fixed_best="x"),
            r"\$\.report\.predicted\.gain_vs_fixed_best: 'x' is not a",
        ),
        (
            lambda d: d["report"]["workload"]["weights"].__setitem__(0, 5.0),
            r"\$\.report\.workload\.weights\[0\]: 5\.0 is outside 0\.\.1",
        ),
        (lambda d: d["report"]["provenance"].update(pp_size=0), r"\$\.report\.provenance\.pp_size: 0 is less than"),
    ],
)
def test_a_number_beyond_its_bound_is_refused_naming_the_field_and_the_fix(mutate, where):
    data = copy.deepcopy(policy_dict(MODEL))
    mutate(data)
    with pytest.raises(ValueError, match=where + r".*; fix that field or regenerate the policy with `ppprof fit`$"):
        from_dict(data)


def test_validate_refuses_a_context_len_of_10_to_the_30_in_one_line(tmp_path):
    data = json.loads((REPO / "tests" / "corpus" / "policies" / "valid.json").read_text())
    data["settings"]["context_len"] = 10**30
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.splitlines() == [
        f"error: policy file {path}: $.settings.context_len: {10**30} is outside 0..{MAX_TOKENS}, the range of a "
        "token count (servers index tokens with int32); fix that field or regenerate the policy with `ppprof fit`"
    ]


def test_a_policy_without_packed_forwards_reads_and_prices_a_batch_additively():
    policy = load(FULL[0])
    assert policy.report.packed_forwards is None and policy.extra_piece_ms == 0.0


@pytest.mark.parametrize(
    "mutate, where",
    [
        (
            lambda p: p.update(extra_piece_ms=-1.0),
            r"\$\.report\.packed_forwards\.extra_piece_ms: -1\.0 is less than the minimum",
        ),
        (
            lambda p: p.update(extra_piece_ms=1e30),
            r"\$\.report\.packed_forwards\.extra_piece_ms: 1e\+30 is outside 0\.\.",
        ),
        (
            lambda p: p["additive"].update(worst_ape=-0.1),
            r"\$\.report\.packed_forwards\.additive\.worst_ape: -0\.1 is less",
        ),
        (
            lambda p: p["additive"].update(mape=1e7),
            r"\$\.report\.packed_forwards\.additive\.mape: 10000000\.0 is outside 0\.\.1e\+06",
        ),
        (
            lambda p: p["additive_on_probes"].update(median_ape="x"),
            r"additive_on_probes\.median_ape: 'x' is not of type",
        ),
        (
            lambda p: p["extra_piece"].update(ms=1e300),
            r"\$\.report\.packed_forwards\.extra_piece\.ms: 1e\+300 is outside",
        ),
        (lambda p: p.update(stage=2000), r"\$\.report\.packed_forwards\.stage: 2000 is outside 0\.\.1023"),
        (lambda p: p.pop("additive"), r"\$\.report\.packed_forwards\.additive: missing; it is required"),
    ],
)
def test_packed_forwards_reads_where_each_number_is_within_its_bound_and_is_refused_beyond(mutate, where):
    data = with_packed_forwards(policy_dict(MODEL), MODEL)
    policy = from_dict(copy.deepcopy(data))
    assert policy.extra_piece_ms == pytest.approx(0.5) and "additive_on_probes" in data["report"]["packed_forwards"]
    mutate(data["report"]["packed_forwards"])
    with pytest.raises(ValueError, match=where + r".*; fix that field or regenerate the policy with `ppprof fit`$"):
        from_dict(data)

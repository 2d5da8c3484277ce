"""The policy contract (issue 12): the JSON Schema shipped in the package, `ppprof validate` through it (one line
naming the field), `validate --schema`, and docs/policy.md's plain-Python reader against Policy.next_chunk_size."""

from __future__ import annotations

import copy
import json
import random
import re
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.policy import LatencyModel, load
from ppprof.policy.schema import FLAT_SCHEMA_FILE, SCHEMA_FILE, policy_schema
from tests.tracked import tracked

from .policy_helpers import policy_dict

REPO = Path(__file__).resolve().parents[2]
COMMITTED = tracked("results/*/policy.json")
MODEL = LatencyModel("pairs", a=2e-6, b=0.01, c=1.5, g=1e-4, h=1e-11)


def test_the_schema_is_draft_2020_12_and_describes_every_field():
    schema = policy_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    defs = schema["$defs"]
    undescribed = []

    def walk(node, where):
        for name, prop in (node.get("properties") or {}).items():
            target = defs[prop["$ref"].split("/")[-1]] if "$ref" in prop else prop
            if "description" not in prop and "description" not in target:
                undescribed.append(f"{where}.{name}")
            walk(target, f"{where}.{name}")
        for branch in node.get("allOf", []) + node.get("oneOf", []):
            walk(defs[branch["$ref"].split("/")[-1]] if "$ref" in branch else branch, where)

    walk(schema, "$")
    assert not undescribed, f"{undescribed=}"
    required = set(schema["required"])
    assert required <= set(schema["properties"]) and {"table", "settings", "schema_version"} <= required


@pytest.mark.parametrize("path", COMMITTED, ids=[p.parent.name for p in COMMITTED])
def test_committed_policies_pass_a_plain_json_schema_validator(path):
    # What a server in another language does: its own validator, jsonschema's standard "integer", on the schema of the
    # file's version (policy-v5.schema.json for the versions before the report's own object).
    data = json.loads(path.read_text())
    schema = policy_schema() if data["schema_version"] >= 6 else json.loads(FLAT_SCHEMA_FILE.read_text())
    jsonschema.validate(data, schema, cls=jsonschema.Draft202012Validator)
    r = CliRunner().invoke(main, ["validate", str(path)])
    assert r.exit_code == 0 and r.output.startswith(f"ok {path}\n"), r.output


def test_validate_schema_prints_the_shipped_schema():
    r = CliRunner().invoke(main, ["validate", "--schema"])
    assert r.exit_code == 0 and json.loads(r.output) == policy_schema() == json.loads(SCHEMA_FILE.read_text())
    r = CliRunner().invoke(main, ["validate", "--schema", str(COMMITTED[0])])
    assert r.exit_code == 2 and "--schema" in r.stderr and r.stderr.count("\n") == 1


def coef(key, **change):
    return lambda d: d["latency_model"]["coefficients"][key].update(**change)


def setitem(column, index, value):
    """Give the prompt-aware rule's first band the table of its last (longest) band, with entry `index` of a column
    set to `value` (the schema and the structure are checked before the rule's sizes are)."""

    def mutate(d):
        rule = d["prompt_table"]
        rule["prefix_len"][0], rule["chunk_size"][0] = list(rule["prefix_len"][-1]), list(rule["chunk_size"][-1])
        rule[column][0][index] = value

    return mutate


BROKEN = [
    (lambda d: d.pop("status"), "$.status: missing"),
    (lambda d: d.update(status="adaptive"), "$.status: 'adaptive' is not one of ['dynamic', 'static']"),
    (lambda d: d.update(reason=7), "$.reason: 7 is not of type 'string'"),
    (lambda d: d["latency_model"].update(name="cubic"), "$.latency_model.name: 'cubic' is not one of"),
    (coef("a", value=-2e-6), "$.latency_model.coefficients.a.value: -2e-06 is less than the minimum of 0"),
    (coef("h", value="1e-11"), "$.latency_model.coefficients.h.value: '1e-11' is not of type 'number'"),
    (coef("g", unit="s/token"), "$.latency_model.coefficients.g.unit: 's/token' given, 'ms/token' expected"),
    (
        lambda d: d["latency_model"]["coefficients"].update(k={"value": 1.0, "unit": "ms"}),
        "$.latency_model.coefficients: Additional properties are not allowed ('k' was unexpected)",
    ),
    (lambda d: d["settings"].update(page_size=0), "$.settings.page_size: 0 is less than the minimum of 1"),
    (lambda d: d["settings"].update(context_len=32768.0), "$.settings.context_len: 32768.0 is not of type 'integer'"),
    (lambda d: d["settings"].pop("base_chunk_size"), "$.settings.base_chunk_size: missing"),
    (lambda d: d.update(target_latency_ms=-1.0), "$.target_latency_ms: -1.0 is less than or equal to the minimum of 0"),
    (lambda d: d.update(target_latency_ms=None), "$.target_latency_ms: None is not of type 'number'"),
    (lambda d: d["table"].update(history_len=[0]), "$.table: Additional properties are not allowed"),
    (setitem("prefix_len", 0, 5), "$.prompt_table.prefix_len[0][0]: 5 given, 0 expected"),
    (setitem("chunk_size", 2, -64), "$.prompt_table.chunk_size[0][2]: -64 is less than the minimum of 1"),
    (setitem("chunk_size", 1, True), "$.prompt_table.chunk_size[0][1]: True is not of type 'integer'"),
    (setitem("prefix_len", 3, 1), "$.prompt_table.band[0].prefix_len[3]: 1 after "),
    (lambda d: d["table"].update(prefix_len=[], chunk_size=[]), "$.table.prefix_len: [] should be non-empty"),
    (lambda d: d["prompt_table"].update(prompt_len=[2]), "$.prompt_table.prompt_len[0]: 2 given, 1 expected"),
    (lambda d: d["overhead"].update(ms_per_chunk=-1.0), "$.overhead.ms_per_chunk: -1.0 is less than the minimum"),
    (
        lambda d: d["report"].update(domain={"prefix_len": [0, 1, 2], "chunk_size": [1, 2]}),
        "$.report.domain.prefix_len: [0, 1, 2] is",
    ),
    (
        lambda d: d["report"]["provenance"].update(layer_partition=[8, 0]),
        "$.report.provenance.layer_partition[1]: 0 is less than",
    ),
    (lambda d: d["table"]["chunk_size"].__setitem__(2, 4096), "$.table: chunk 4096 at prefix_len"),
]


@pytest.mark.parametrize("mutate,message", BROKEN, ids=[m for _, m in BROKEN])
def test_validate_rejects_a_broken_policy_in_one_line_naming_the_field(tmp_path, mutate, message):
    data = copy.deepcopy(policy_dict(MODEL))
    mutate(data)
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    r = CliRunner().invoke(main, ["validate", str(path)])
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: policy file {path}: "), r.stderr
    assert message in r.stderr, f"{message=} {r.stderr=}"
    assert "Traceback" not in r.output


def docs_reader() -> str:
    """The plain-Python policy reader from docs/policy.md (the python block that starts '# policy_reader.py')."""
    text = (REPO / "docs" / "policy.md").read_text()
    match = re.search(r"```python\n(# policy_reader\.py.*?)```", text, re.S)
    assert match, "docs/policy.md lost its '# policy_reader.py' block"
    return match.group(1)


@pytest.mark.parametrize("path", COMMITTED, ids=[p.parent.name for p in COMMITTED])
def test_the_docs_reader_agrees_with_next_chunk_size_on_the_committed_policies(path):
    reader_agrees(path)


def test_the_docs_reader_reads_a_schema_4_policy_as_an_idle_pipeline(tmp_path):
    data = json.loads(COMMITTED[0].read_text())
    unit = data["prompt_table"]["unit"]
    data["schema_version"] = 4
    data["load"] = {
        "pending_requests": [1],
        "bound_ms": [None],
        "chunk_cap": [unit],
        "prefix_len": [[0]],
        "chunk_size": [[unit]],
        "handover_tokens": 0,
    }
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    # its pending-count rule is kept but not read (schema 5): the idle answer at every load
    assert load(path).next_chunk_size(4096, pending_requests=1, pending_tokens=10**6) == load(path).next_chunk_size(
        4096
    )
    reader_agrees(path)


def test_the_docs_reader_reads_a_schema_6_policy_as_ppprof_writes_it(tmp_path):
    data = policy_dict(MODEL)
    assert data["schema_version"] == 6 and "report" in data and "predicted" not in data
    path = tmp_path / "policy.json"
    path.write_text(json.dumps(data))
    reader_agrees(path)


def reader_agrees(path):
    """The docs' reader answers as Policy.next_chunk_size with no load, on the prefixes and prompts around every
    breakpoint and at random."""
    code = docs_reader()
    assert "ppprof" not in code.split("\n", 1)[1] and len(code.strip().splitlines()) <= 25
    reader: dict = {}
    exec(compile(code, "docs/policy.md:policy_reader.py", "exec"), reader)
    data = reader["read_policy"](str(path))
    policy = load(path)
    starts = policy.data["table"]["prefix_len"]
    rng = random.Random(0)
    context = policy.settings.context_len
    lengths = {0, 1, context - 1, context}
    lengths |= {max(0, s + d) for s in starts for d in (-1, 0, 1)}
    lengths |= {rng.randrange(context) for _ in range(2000)}
    for L in sorted(lengths):
        assert reader["next_chunk_size"](data, L) == policy.next_chunk_size(L), f"{path} {L=}"
    bands = policy.data["prompt_table"]["prompt_len"]
    prompts = {b + d for b in bands for d in (-1, 0, 1) if 1 <= b + d <= context} | {1, context}
    prompts |= {rng.randrange(1, context + 1) for _ in range(300)}
    for n in sorted(prompts):
        for L in {0, n - 1, rng.randrange(n)}:
            assert reader["next_chunk_size"](data, L, n) == policy.next_chunk_size(L, n), f"{path} {L=} {n=}"

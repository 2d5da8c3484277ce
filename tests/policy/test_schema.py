"""The policy schema is generated from the contract (ppprof.policy.contract_schema): the shipped file is that output,
the classes and the schema's entries cannot drift, and every policy committed before the contract reads as it did."""

import json
from pathlib import Path

import pytest

import ppprof.policy.contract_schema as contract_schema
from ppprof.chunks import SETTINGS_ORDER
from ppprof.policy.contract import COEF_UNITS, MODEL_NAMES, NESTED_VERSION, READ_VERSIONS, STATUSES
from ppprof.policy.runtime import flattened, from_dict, load, report_of, upgraded
from ppprof.policy.schema import FLAT_SCHEMA_FILE, SCHEMA_FILE, policy_schema, schema_text

REPO = Path(__file__).resolve().parents[2]
VERDICTS = Path(__file__).with_name("data") / "verdicts-before-contract.json"
"""What `ppprof.policy.load` said of every policy document under results/ and tests/ (the committed policies, and the
corpus's and tests' broken ones) before the contract, at main fc17876: "ok" or its exception's one line."""


def test_the_shipped_schema_is_the_generated_one():
    """`python -m ppprof.policy.schema > ppprof/policy/policy.schema.json` after a change to the contract."""
    assert SCHEMA_FILE.read_text() == schema_text()
    assert json.loads(SCHEMA_FILE.read_text()) == policy_schema()
    assert FLAT_SCHEMA_FILE.read_text() == schema_text(NESTED_VERSION - 1)  # `python -m ppprof.policy.schema 5`


def verdict(path: Path) -> str:
    try:
        load(path)
        return "ok"
    except Exception as e:  # noqa: BLE001 - the verdict is the exception's type and one line
        return f"{type(e).__name__}: {str(e).replace(str(REPO) + '/', '')}"


def test_every_policy_reads_as_before_the_contract():
    before = json.loads(VERDICTS.read_text())
    assert sum(v == "ok" for v in before.values()) >= 60 and len(before) >= 150
    read = "this ppprof reads 3, 4, 5;"  # the versions the refusal names: 6 since the report's own object
    now = {f: want.replace(read, "this ppprof reads 3, 4, 5, 6;") for f, want in before.items()}
    changed = {f: (want, got) for f, want in now.items() if (got := verdict(REPO / f)) != want}
    assert changed == {}


def committed_policies() -> list[Path]:
    before = json.loads(VERDICTS.read_text())
    return [REPO / f for f, v in before.items() if v == "ok"]


def test_every_committed_policy_in_schema_6_s_layout_answers_as_it_did():
    """The layout step on the committed policies (schemas 3 to 5): nested and renamed (upgraded), stamped 6, the
    document is one schema 6 takes and its answers are the original's; a schema 4 under-load rule (not read) is
    dropped first, as schema 6 has none of that form."""
    paths = committed_policies()
    versions = set()
    assert len(paths) >= 60
    for path in paths:
        data = json.loads(path.read_text())
        versions.add(data["schema_version"])
        old = load(path)
        if data["schema_version"] < 5:
            data.pop("load", None)
        new = from_dict(upgraded(data) | {"schema_version": 6})
        assert "world_size" not in new.provenance and new.provenance.get("pp_size") == old.provenance.get("pp_size")
        assert new.report == old.report and new.fixed_best_chunk == old.fixed_best_chunk, path
        for n in (1, 700, 3000, old.settings.context_len):
            assert new.plan(n) == old.plan(n) and new.plan_history(n) == old.plan_history(n), path
            assert new.next_chunk_size(0, n, pending_requests=2, pending_tokens=4 * n) == old.next_chunk_size(
                0, n, pending_requests=2, pending_tokens=4 * n
            ), path
    assert {3, 4, 5} <= versions


def test_the_layout_step_is_idempotent_on_an_older_file():
    """A loaded older policy's data is in schema 6's layout under its own version: read again, it stays as it is."""
    path = REPO / "tests/runs/tiny-hybrid/policy.json"
    data = json.loads(path.read_text())
    once = upgraded(data)
    assert once["schema_version"] == data["schema_version"] < 6 and upgraded(once) == once == load(path).data
    flat = flattened(load(path).data)
    assert flat["workload"] == data["workload"] and flat["provenance"]["pp_size"] == data["provenance"]["world_size"]
    assert report_of(data) == report_of(once) == once["report"] and "world_size" not in once["report"]["provenance"]


def test_a_schema_6_file_holds_its_report_in_its_own_object_only():
    data = json.loads((REPO / "tests/runs/tiny-hybrid/policy.json").read_text())
    new = upgraded(data) | {"schema_version": 6}
    from_dict(new)
    with pytest.raises(ValueError, match=r"\$: Additional properties are not allowed \('diagnostics' was unexpected"):
        from_dict(new | {"diagnostics": {}})
    with pytest.raises(ValueError, match=r"\$.report: missing; it is required"):
        from_dict({k: v for k, v in new.items() if k != "report"})
    with pytest.raises(ValueError, match=r"\$.report.provenance.pp_size: 0 is less than the minimum of 1"):
        from_dict(new | {"report": new["report"] | {"provenance": new["report"]["provenance"] | {"pp_size": 0}}})
    with pytest.raises(ValueError, match=r"\$.report: Additional properties are not allowed \('stray'"):
        from_dict(new | {"report": new["report"] | {"stray": 1}})


def test_the_schema_s_enums_and_keys_are_the_contract_s():
    schema = policy_schema()
    flat = policy_schema(NESTED_VERSION - 1)["properties"]["schema_version"]["enum"]
    assert flat + schema["properties"]["schema_version"]["enum"] == list(READ_VERSIONS)
    assert schema["properties"]["status"]["enum"] == list(STATUSES)
    model = schema["$defs"]["latency_model"]["properties"]
    assert model["name"]["enum"] == list(MODEL_NAMES) and list(model["coefficients"]["properties"]) == list(COEF_UNITS)
    assert schema["$defs"]["settings"]["required"] == list(SETTINGS_ORDER)
    assert schema["$defs"]["load"]["required"] == ["slots", "fill", "unit", "full"]  # LoadRule's fields, no default


@pytest.mark.parametrize("part, key", [("table", "chunk_size"), ("load", "floor"), ("calibration", "shift_ms")])
def test_a_field_without_its_entry_or_an_entry_without_its_field_is_refused(monkeypatch, part, key):
    fields = {p: dict(entries) for p, entries in contract_schema.FIELDS.items()}
    del fields[part][key]
    monkeypatch.setattr(contract_schema, "FIELDS", fields)
    with pytest.raises(ValueError, match=rf"{part}: fields without a schema entry \['{key}'\]"):
        contract_schema.contract_schema()
    fields[part] |= {key: {"type": "integer"}, "stray": {"type": "integer"}}
    with pytest.raises(ValueError, match=rf"{part}: .*entries without a field \['stray'\]"):
        contract_schema.contract_schema()

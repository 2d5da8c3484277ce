"""The policy schema is generated from the contract (ppprof.policy.contract_schema): the shipped file is that output,
the classes and the schema's entries cannot drift, and every policy committed before the contract reads as it did."""

import json
from pathlib import Path

import pytest

import ppprof.policy.contract_schema as contract_schema
from ppprof.chunks import SETTINGS_ORDER
from ppprof.policy.contract import COEF_UNITS, MODEL_NAMES, READ_VERSIONS, STATUSES
from ppprof.policy.runtime import load
from ppprof.policy.schema import SCHEMA_FILE, policy_schema, schema_text

REPO = Path(__file__).resolve().parents[2]
VERDICTS = Path(__file__).with_name("data") / "verdicts-before-contract.json"
"""What `ppprof.policy.load` said of every policy document under results/ and tests/ (the committed policies, and the
corpus's and tests' broken ones) before the contract, at main fc17876: "ok" or its exception's one line."""


def test_the_shipped_schema_is_the_generated_one():
    """`python -m ppprof.policy.schema > ppprof/policy/policy.schema.json` after a change to the contract."""
    assert SCHEMA_FILE.read_text() == schema_text()
    assert json.loads(SCHEMA_FILE.read_text()) == policy_schema()


def verdict(path: Path) -> str:
    try:
        load(path)
        return "ok"
    except Exception as e:  # noqa: BLE001 - the verdict is the exception's type and one line
        return f"{type(e).__name__}: {str(e).replace(str(REPO) + '/', '')}"


def test_every_policy_reads_as_before_the_contract():
    before = json.loads(VERDICTS.read_text())
    assert sum(v == "ok" for v in before.values()) >= 60 and len(before) >= 150
    changed = {f: (want, got) for f, want in before.items() if (got := verdict(REPO / f)) != want}
    assert changed == {}


def test_the_schema_s_enums_and_keys_are_the_contract_s():
    schema = policy_schema()
    assert schema["properties"]["schema_version"]["enum"] == list(READ_VERSIONS)
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

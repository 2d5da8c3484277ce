"""The JSON Schema of policy.json, generated: the contract's part from its classes (ppprof.policy.contract_schema)
and the report's from REPORT_FILE; its validator and the one-line account of a document's most relevant violation.
`python -m ppprof.policy.schema` prints it (SCHEMA_FILE, shipped with the package, is that output; `... schema 5`
the older files' layout, FLAT_SCHEMA_FILE)."""

from __future__ import annotations

import json
from pathlib import Path

from ppprof.checks import is_int, short
from ppprof.policy.contract import NESTED_VERSION, READ_VERSIONS, RENAMED, REPORT_ORDER, SCHEMA_VERSION, nested_layout

__all__ = ["READ_VERSIONS", "SCHEMA_FILE", "SCHEMA_VERSION", "policy_schema", "schema_error", "schema_validator"]

SCHEMA_FILE = Path(__file__).with_name("policy.schema.json")
"""The policy schema as `policy_schema()` generates it (a JSON Schema, draft 2020-12), shipped with the package for
servers in other languages, which validate against it; tests/policy/test_schema.py keeps it equal to the generated."""
FLAT_SCHEMA_FILE = Path(__file__).with_name("policy-v5.schema.json")
"""The schema of the versions before the report's own object (3 to 5: its fields beside the contract's, the provenance's
stages named world_size), as `policy_schema(5)` generates it: what a validator of an older file reads."""
REPORT_FILE = Path(__file__).with_name("report.schema.json")
"""The report's part of the schema (diagnostics, provenance, predictions, design, domain, whether the tables are
SGLang's own rule (`parity`); a schema 4 under-load rule): its properties and $defs. No server sizes a chunk from
it (ppprof's SGLang sizer checks the profiled setup in its provenance against its own)."""
CONTRACT_ORDER = ("schema_version", "status", "reason", "latency_model", "settings", "target_latency_ms")
CONTRACT_ORDER += ("overhead", "calibration", "num_stages", "table", "prompt_table", "load")
ORDER = (
    *("schema_version", "status", "reason", "latency_model", "settings", "target_latency_ms"),
    *("target_chunk_latency_ms", "rule", "diagnostics", "provenance", "domain", "design", "table", "overhead"),
    *("calibration", "packed_forwards", "num_stages", "workload", "predicted", "prompt_table", "parity", "load"),
)
DEFS_ORDER = ("count", "coefficient", "latency_model", "settings", "provenance", "domain", "range", "table")
DEFS_ORDER += ("prompt_table", "load_schema4", "load")
"""The outermost properties (CONTRACT_ORDER and the report's object from schema 6 on; ORDER before) and the $defs in
the order the schema has always listed them (a validator meets them in it, and the shipped files read the same)."""
REPORT_DESCRIPTION = (
    "The report beside the contract (schema 6 on): what the fit found and why, where the numbers come from, what the "
    "rules are predicted to give, the probe design; for people and for `ppprof validate`, `compare`, `plan` and the "
    "serving simulation. No server sizes a chunk from it."
)
_validators: dict[bool, object] = {}


def policy_schema(version: int = SCHEMA_VERSION) -> dict:
    """The JSON Schema of policy.json at `version`: contract_schema() with the report's properties and $defs
    (REPORT_FILE), in its own closed object `report` from schema 6 on (NESTED_VERSION), beside the contract's fields
    before, its renamed fields under their old names (ppprof.policy.runtime.RENAMED)."""
    from ppprof.policy.contract_schema import contract_schema

    nested = version >= NESTED_VERSION
    schema, report = contract_schema(), json.loads(REPORT_FILE.read_text())
    versions = [v for v in READ_VERSIONS if (v >= NESTED_VERSION) == nested]
    schema["$id"] = f"urn:ppprof:policy:{max(versions)}"
    schema["title"] = schema["title"].replace(f"schema_version {SCHEMA_VERSION}", f"schema_version {max(versions)}")
    schema["properties"]["schema_version"] = schema["properties"]["schema_version"] | {"enum": versions}
    defs = schema["$defs"] | report["$defs"]
    if set(defs) != set(DEFS_ORDER):
        raise ValueError(f"policy schema: $defs {sorted(set(defs) ^ set(DEFS_ORDER))} are not DEFS_ORDER's")
    if nested:
        fields = report["properties"]
        if set(fields) != set(REPORT_ORDER):
            raise ValueError(f"policy schema: report {sorted(set(fields) ^ set(REPORT_ORDER))} are not REPORT_ORDER's")
        part = {"description": REPORT_DESCRIPTION, "type": "object"}  # each field optional, as before schema 6
        part |= {"properties": {k: fields[k] for k in REPORT_ORDER}, "additionalProperties": False}
        properties, order = schema["properties"] | {"report": part}, (*CONTRACT_ORDER, "report")
        schema["required"] = [*schema["required"], "report"]
        schema["additionalProperties"] = False  # a report field beside the contract is a file of two layouts
    else:
        properties, order = schema["properties"] | report["properties"], ORDER
        defs = defs | {"provenance": renamed_back(defs["provenance"])}
    if set(properties) != set(order):
        raise ValueError(f"policy schema: properties {sorted(set(properties) ^ set(order))} are not the order's")
    schema["properties"] = {key: properties[key] for key in order}
    schema["$defs"] = {key: defs[key] for key in DEFS_ORDER}
    return schema


def renamed_back(provenance: dict) -> dict:
    """The provenance's schema with RENAMED's fields under their old names (the flat layout's)."""
    names = {new: old for part, old, new in RENAMED if part == "provenance"}
    fields = {names.get(k, k): v for k, v in provenance["properties"].items()}
    return provenance | {"properties": fields}


def schema_text(version: int = SCHEMA_VERSION) -> str:
    """The schema as `ppprof validate --schema` prints it and SCHEMA_FILE holds it (FLAT_SCHEMA_FILE: version 5)."""
    return json.dumps(policy_schema(version), indent=2) + "\n"


def schema_validator(nested: bool = True):
    """A jsonschema validator of the policy schema whose "integer" is an int, not a float such as 512.0 (jsonschema's
    own "integer" takes any float without a fraction; a server in C++ or Rust would read 512.0 as a double). jsonschema
    is imported here, not at module import: `import ppprof.policy` stays light."""
    if nested not in _validators:
        import jsonschema

        base = jsonschema.Draft202012Validator
        checker = base.TYPE_CHECKER.redefine("integer", lambda _, value: is_int(value))
        validator_class = jsonschema.validators.extend(base, type_checker=checker)
        schema = policy_schema(SCHEMA_VERSION if nested else NESTED_VERSION - 1)
        base.check_schema(schema)
        _validators[nested] = validator_class(schema)
    return _validators[nested]


def schema_error(data) -> str | None:
    """The most relevant violation of the schema of `data`'s version (schema 6's layout where it says 6 or more),
    one line naming the field by its JSON path ("$.table.chunk_size[3]: 512.0 is not of type 'integer'"), or None."""
    import jsonschema

    error = jsonschema.exceptions.best_match(schema_validator(nested_layout(data)).iter_errors(data))
    if error is None:
        return None
    if error.validator == "required":  # name the missing field itself, not the object that lacks it
        missing = next(k for k in error.validator_value if k not in error.instance)
        return f"{error.json_path}.{missing}: missing; it is required"
    if error.validator == "const":
        return f"{error.json_path}: {short(error.instance)} given, {error.validator_value!r} expected"
    message = error.message
    shown = repr(error.instance)
    if len(shown) > 60:  # keep the line short whatever the field holds
        message = message.replace(shown, short(error.instance))
    return f"{error.json_path}: {message}"


if __name__ == "__main__":
    import sys

    print(schema_text(int(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_VERSION), end="")

"""The JSON Schema of policy.json, generated: the contract's part from its classes (ppprof.policy.contract_schema)
and the report's from REPORT_FILE; its validator and the one-line account of a document's most relevant violation.
`python -m ppprof.policy.schema` prints it (SCHEMA_FILE, shipped with the package, is that output)."""

from __future__ import annotations

import json
from pathlib import Path

from ppprof.checks import is_int, short
from ppprof.policy.contract import READ_VERSIONS, SCHEMA_VERSION

__all__ = ["READ_VERSIONS", "SCHEMA_FILE", "SCHEMA_VERSION", "policy_schema", "schema_error", "schema_validator"]

SCHEMA_FILE = Path(__file__).with_name("policy.schema.json")
"""The policy schema as `policy_schema()` generates it (a JSON Schema, draft 2020-12), shipped with the package for
servers in other languages, which validate against it; tests/policy/test_schema.py keeps it equal to the generated."""
REPORT_FILE = Path(__file__).with_name("report.schema.json")
"""The report's part of the schema (diagnostics, provenance, predictions, design, domain, whether the tables are
SGLang's own rule (`parity`); a schema 4 under-load rule): its properties and $defs. No server sizes a chunk from
it (ppprof's SGLang sizer checks the profiled setup in its provenance against its own)."""
ORDER = (
    *("schema_version", "status", "reason", "latency_model", "settings", "target_latency_ms"),
    *("target_chunk_latency_ms", "rule", "diagnostics", "provenance", "domain", "design", "table", "overhead"),
    *("calibration", "packed_forwards", "num_stages", "workload", "predicted", "prompt_table", "parity", "load"),
)
DEFS_ORDER = ("count", "coefficient", "latency_model", "settings", "provenance", "domain", "range", "table")
DEFS_ORDER += ("prompt_table", "load_schema4", "load")
"""The outermost properties and the $defs in the order the schema has always listed them (a validator meets them in
it, and the shipped file reads the same)."""
_validator = None


def policy_schema() -> dict:
    """The JSON Schema of policy.json: contract_schema() with the report's properties and $defs (REPORT_FILE)."""
    from ppprof.policy.contract_schema import contract_schema

    schema, report = contract_schema(), json.loads(REPORT_FILE.read_text())
    properties = schema["properties"] | report["properties"]
    if set(properties) != set(ORDER):
        raise ValueError(f"policy schema: properties {sorted(set(properties) ^ set(ORDER))} are not ORDER's")
    defs = schema["$defs"] | report["$defs"]
    if set(defs) != set(DEFS_ORDER):
        raise ValueError(f"policy schema: $defs {sorted(set(defs) ^ set(DEFS_ORDER))} are not DEFS_ORDER's")
    schema["properties"] = {key: properties[key] for key in ORDER}
    schema["$defs"] = {key: defs[key] for key in DEFS_ORDER}
    return schema


def schema_text() -> str:
    """The schema as `ppprof validate --schema` prints it and SCHEMA_FILE holds it."""
    return json.dumps(policy_schema(), indent=2) + "\n"


def schema_validator():
    """A jsonschema validator of the policy schema whose "integer" is an int, not a float such as 512.0 (jsonschema's
    own "integer" takes any float without a fraction; a server in C++ or Rust would read 512.0 as a double). jsonschema
    is imported here, not at module import: `import ppprof.policy` stays light."""
    global _validator
    if _validator is None:
        import jsonschema

        base = jsonschema.Draft202012Validator
        checker = base.TYPE_CHECKER.redefine("integer", lambda _, value: is_int(value))
        validator_class = jsonschema.validators.extend(base, type_checker=checker)
        schema = policy_schema()
        base.check_schema(schema)
        _validator = validator_class(schema)
    return _validator


def schema_error(data) -> str | None:
    """The most relevant violation of the schema, one line naming the field by its JSON path
    ("$.table.chunk_size[3]: 512.0 is not of type 'integer'"), or None."""
    import jsonschema

    error = jsonschema.exceptions.best_match(schema_validator().iter_errors(data))
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
    print(schema_text(), end="")

"""The policy contract: the JSON Schema of policy.json (SCHEMA_FILE, shipped with the package), its validator and
the one-line account of a document's most relevant violation."""

from __future__ import annotations

import json
from pathlib import Path

from ppprof.checks import is_int, short
from ppprof.policy.contract import READ_VERSIONS, SCHEMA_VERSION

__all__ = ["READ_VERSIONS", "SCHEMA_FILE", "SCHEMA_VERSION", "policy_schema", "schema_error", "schema_validator"]

SCHEMA_FILE = Path(__file__).with_name("policy.schema.json")
"""The policy contract: a JSON Schema (draft 2020-12) of policy.json, shipped with the package; `ppprof validate
--schema` prints it. Servers in other languages validate against it."""
_validator = None


def policy_schema() -> dict:
    """The JSON Schema of policy.json (SCHEMA_FILE)."""
    return json.loads(SCHEMA_FILE.read_text())


def schema_validator():
    """A jsonschema validator of SCHEMA_FILE whose "integer" is an int, not a float such as 512.0 (jsonschema's
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

"""The checks of a policy document beyond its contract's parts: its schema version and the JSON Schema (generated
from the contract, ppprof.policy.schema) before the parts are read, then the report's numbers and structure (the
domain's ranges, a schema 4 under-load rule kept but not read)."""

from __future__ import annotations

from ppprof.checks import short
from ppprof.policy.contract import (
    FIX,
    LOAD_RULE_VERSION,
    READ_VERSIONS,
    check_breakpoints,
    increasing,
    nested_layout,
    one_a_row,
)
from ppprof.policy.numbers import number_error, report_fields
from ppprof.policy.schema import schema_error


def check_version_and_schema(data) -> None:
    """ValueError (one line naming the field) unless `data` is an object of a version read that follows the policy
    schema, its under-load rule in its version's form; the contract's parts check their numbers' bounds and their
    tables when Policy.of reads them."""
    if not isinstance(data, dict):
        raise ValueError(f"policy must be a JSON object, not a {type(data).__name__}: regenerate it with `ppprof fit`")
    if "schema_version" in data and data["schema_version"] not in READ_VERSIONS:
        raise ValueError(
            f"policy schema_version {short(data['schema_version'])} is not supported: this ppprof reads "
            f"{', '.join(map(str, READ_VERSIONS))}; regenerate it with `ppprof fit`"
        )
    problem = schema_error(data)
    if problem:
        raise ValueError(f"{problem}; {FIX}")
    if data.get("load") is not None:
        check_load(data["load"], data["schema_version"])


def check_load(load: dict, version: int) -> None:
    """The under-load rule: a field of schema 4 on, in the form of its schema (schema 5's full-pipeline rule, which
    ppprof.policy.contract.LoadRule reads and checks; schema 4's pending-count levels, kept but not read, checked here)."""
    if version < 4:
        raise ValueError(f"$.load: the under-load rule is a schema 4 field, in a schema {version} policy; refit it")
    new_form = "slots" in load
    if new_form != (version >= LOAD_RULE_VERSION):
        form = "schema 5's (slots, fill)" if new_form else "schema 4's (pending_requests)"
        raise ValueError(
            f"$.load: {form} under-load rule in a schema {version} policy: refit it with `ppprof fit`, which writes "
            f"schema {LOAD_RULE_VERSION}"
        )
    if new_form:
        return
    steps = load["pending_requests"]  # schema 4's rule: a step a count of pending requests
    one_a_row("$.load", {k: load[k] for k in ("bound_ms", "chunk_cap", "prefix_len", "chunk_size")}, len(steps), "step")
    increasing("$.load.pending_requests", steps, "it")
    for i, (starts, sizes) in enumerate(zip(load["prefix_len"], load["chunk_size"])):
        check_breakpoints(f"$.load.step[{i}]", starts, sizes)


def check_report(data: dict) -> None:
    """Raise ValueError (one line naming the field by its path in `data`'s layout) unless the report's numbers are
    within their bounds (ppprof.policy.numbers.REPORT_FIELDS) and each domain range is min <= max."""
    nested = nested_layout(data)
    problem = number_error(data, report_fields(nested))
    if problem:
        raise ValueError(f"{problem}; {FIX}")
    report, where = (data["report"], "$.report") if nested else (data, "$")
    dom = report.get("domain")
    for key in ("prefix_len", "chunk_size") if dom else ():
        low, high = dom[key]
        if low > high:
            raise ValueError(f"{where}.domain.{key}: [{low}, {high}] must be [min, max] with min <= max")

"""The structural check of a policy document: its schema version, the JSON Schema, the bounds of its numbers, and
the rules a JSON Schema cannot say (columns of one length, breakpoints strictly increasing, domain ranges min <= max,
finite coefficients)."""

from __future__ import annotations

import math

from ppprof.checks import short
from ppprof.policy.numbers import number_error
from ppprof.policy.schema import READ_VERSIONS, schema_error
from ppprof.policy.tables import LOAD_RULE_VERSION

FIX = "fix that field or regenerate the policy with `ppprof fit`"


def check_breakpoints(where: str, starts: list[int], sizes: list[int]) -> None:
    """A breakpoint table's columns have one length, start at prefix 0 and increase strictly."""
    if len(starts) != len(sizes):
        raise ValueError(
            f"{where}: prefix_len has {len(starts)} entries but chunk_size {len(sizes)}: the columns "
            "must have one length"
        )
    if starts[0] != 0:
        raise ValueError(f"{where}.prefix_len[0]: {starts[0]}: a table starts at prefix_len 0")
    increasing(f"{where}.prefix_len", starts, "prefix_len")


def increasing(where: str, values: list, what: str) -> None:
    """ValueError naming the first entry of `values` (the column at `where`) not above the one before it."""
    for i, (a, b) in enumerate(zip(values, values[1:])):
        if b <= a:
            raise ValueError(f"{where}[{i + 1}]: {b} after {a}: {what} must increase strictly")


def one_a_row(where: str, table: dict, keys: tuple[str, ...], rows: int, row: str) -> None:
    """ValueError naming the first column of `table` (at `where`) whose length is not `rows` (one a `row`)."""
    for key in keys:
        if len(table[key]) != rows:
            raise ValueError(f"{where}.{key}: {len(table[key])} entries for {rows} {row}s: give one a {row}")


def check_prompt_table(prompt_table: dict) -> None:
    """The prompt-aware rule's columns: one entry a band, bands from prompts of 1 token strictly increasing, and
    each band's breakpoint table."""
    bands = prompt_table["prompt_len"]
    one_a_row("$.prompt_table", prompt_table, ("bound_ms", "merge_len", "prefix_len", "chunk_size"), len(bands), "band")
    if bands[0] != 1:
        raise ValueError(f"$.prompt_table.prompt_len[0]: {bands[0]}: the first band starts at prompts of 1 token")
    increasing("$.prompt_table.prompt_len", bands, "band starts")
    for i, (starts, sizes) in enumerate(zip(prompt_table["prefix_len"], prompt_table["chunk_size"])):
        check_breakpoints(f"$.prompt_table.band[{i}]", starts, sizes)


def check_load(load: dict, version: int) -> None:
    """The under-load rule: a field of schema 4 on, in the form of its schema (schema 5's full-pipeline rule, whose
    numbers the schema and ppprof.policy.numbers check; schema 4's pending-count levels, kept but not read)."""
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
    levels = load["pending_requests"]
    one_a_row("$.load", load, ("bound_ms", "chunk_cap", "prefix_len", "chunk_size"), len(levels), "level")
    increasing("$.load.pending_requests", levels, "it")
    for i, (starts, sizes) in enumerate(zip(load["prefix_len"], load["chunk_size"])):
        check_breakpoints(f"$.load.level[{i}]", starts, sizes)


def check_structure(data) -> None:
    """Raise ValueError (one line naming the field) unless `data` follows the policy schema (SCHEMA_FILE), its numbers
    are within their bounds (ppprof.policy.numbers) and the structural rules a JSON Schema cannot say hold: the
    tables' columns of one length, prefix_len strictly increasing, each domain range min <= max, coefficients
    finite."""
    if not isinstance(data, dict):
        raise ValueError(f"policy must be a JSON object, not a {type(data).__name__}: regenerate it with `ppprof fit`")
    if "schema_version" in data and data["schema_version"] not in READ_VERSIONS:
        raise ValueError(
            f"policy schema_version {short(data['schema_version'])} is not supported: this ppprof reads "
            f"{', '.join(map(str, READ_VERSIONS))}; regenerate it with `ppprof fit`"
        )
    problem = schema_error(data) or number_error(data)
    if problem:
        raise ValueError(f"{problem}; {FIX}")
    check_breakpoints("$.table", data["table"]["prefix_len"], data["table"]["chunk_size"])
    check_prompt_table(data["prompt_table"])
    if data.get("load") is not None:
        check_load(data["load"], data["schema_version"])
    dom = data.get("domain")
    for key in ("prefix_len", "chunk_size") if dom else ():
        low, high = dom[key]
        if low > high:
            raise ValueError(f"$.domain.{key}: [{low}, {high}] must be [min, max] with min <= max")
    for key, entry in ((data.get("latency_model") or {}).get("coefficients") or {}).items():
        if not math.isfinite(entry["value"]):
            raise ValueError(f"$.latency_model.coefficients.{key}.value: {entry['value']} is not finite: refit")

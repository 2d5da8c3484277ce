"""The JSON Schema of the policy contract, generated from its classes (ppprof.policy.contract, ChunkSettings, Policy):
each part's keys are its class's fields, in the file's layout, with the few the file keeps beside them (FILE_KEYS);
which are required follows the fields without a default; the enums are the contract's own (MODEL_NAMES, COEF_UNITS,
READ_VERSIONS, STATUSES). FIELDS (ppprof.policy.schema_fields) gives each key's JSON type, lower bound and description; `contract_schema()` refuses
a field with no entry or an entry with no field, so the classes and the schema cannot drift. ppprof.policy.schema adds
the report's part."""

from __future__ import annotations

from dataclasses import MISSING, fields

from ppprof.chunks import SETTINGS_ORDER, ChunkSettings
from ppprof.policy.contract import (
    COEF_UNITS,
    MODEL_COEFS,
    MODEL_NAMES,
    READ_VERSIONS,
    SCHEMA_VERSION,
    STATUSES,
    Calibration,
    HistoryTable,
    LoadRule,
    Overhead,
    PromptRule,
)
from ppprof.policy.schema_fields import (
    COEFFICIENT,
    COEFFICIENTS,
    COUNT,
    DESCRIPTIONS,
    FIELDS,
    FORM,
    META,
    NAME,
    TOP,
    TOP_DESCRIPTIONS,
)

FULL_KEYS = ("bound_ms", "chunk_cap")
"""LoadRule's fields the file nests under load.full."""
FILE_KEYS = {
    "table": (("bound_ms", "chunk_cap"), ()),
    "prompt_table": (("unit", "max_prompt_len"), ("unit", "max_prompt_len")),
    "load": (("full", "worst_loss", "worst_at", "idle_worst_loss", "num_prompts", "seed", "async_depth"), ("full",)),
}
"""Per part, the keys the file keeps beside its class's fields, and which of them are required: the rule's bound and
cap (table), the domain's unit and longest prompt (prompt_table), and the under-load rule's full-pipeline bound and
the figures it was chosen on (load)."""
REQUIRED_TOP = ("schema_version", "status", "reason", "latency_model", "overhead", "settings", "target_latency_ms")
REQUIRED_TOP += ("table", "prompt_table")
CONDITIONS = [
    {
        "if": {"properties": {"status": {"const": "dynamic"}}, "required": ["status"]},
        "then": {
            "properties": {
                "latency_model": {"$ref": "#/$defs/latency_model"},
                "target_latency_ms": {"type": "number", "exclusiveMinimum": 0},
            }
        },
    }
]
"""A dynamic policy has a latency model and a positive target."""


def layout(part: str, cls) -> tuple[list[str], list[str]]:
    """(the part's keys in the file, those required) from `cls`'s fields: every field without a default is required
    (ChunkSettings' every setting, resolved in the file), LoadRule's bound and cap under `full`."""
    if cls is ChunkSettings:
        names = {f.name for f in fields(cls)}
        if names != set(SETTINGS_ORDER):
            raise ValueError(f"ChunkSettings' fields {sorted(names ^ set(SETTINGS_ORDER))} are not SETTINGS_ORDER's")
        return list(SETTINGS_ORDER), list(SETTINGS_ORDER)
    keys, required = [], []
    for f in fields(cls):
        if cls is LoadRule and f.name in FULL_KEYS:
            continue
        keys.append(f.name)
        if f.default is MISSING and f.default_factory is MISSING:
            required.append(f.name)
    extra, extra_required = FILE_KEYS.get(part, ((), ()))
    return keys + list(extra), required + list(extra_required)


def part_schema(part: str, keys: list[str], required: list[str], closed: bool = True, **nested: dict) -> dict:
    """An object of `keys` (each FIELDS[part]'s entry, or a `nested` object's schema), `required` of them; ValueError
    where the keys and the entries differ."""
    entries = FIELDS[part] | nested
    if set(keys) != set(entries):
        raise ValueError(
            f"{part}: fields without a schema entry {sorted(set(keys) - set(entries))}, entries "
            f"without a field {sorted(set(entries) - set(keys))}"
        )
    order = list(entries)  # the file's order of its keys
    out = {"description": DESCRIPTIONS[part], "type": "object", "required": sorted(required, key=order.index)}
    if closed:
        out["additionalProperties"] = False
    return out | {"properties": {key: entries[key] for key in order}}


def latency_model_schema() -> dict:
    """A latency model: its name (MODEL_NAMES) and coefficients (COEF_UNITS; those of every model required)."""
    if set(COEFFICIENTS) != set(COEF_UNITS):
        raise ValueError(f"COEFFICIENTS {sorted(COEFFICIENTS)} are not COEF_UNITS' {sorted(COEF_UNITS)}")
    coefs = {}
    for key, unit in COEF_UNITS.items():
        value = COEFFICIENTS[key]["value"]
        own = ({"value": value} if value else {}) | {"unit": {"description": f"Always {unit}.", "const": unit}}
        coefs[key] = {"description": COEFFICIENTS[key]["description"], "allOf": [{"$ref": "#/$defs/coefficient"}]}
        coefs[key]["properties"] = own
    every = [k for k in COEF_UNITS if all(k in MODEL_COEFS[name] for name in MODEL_NAMES)]
    coefficients = {"description": DESCRIPTIONS["coefficients"], "type": "object", "required": every}
    coefficients |= {"additionalProperties": False, "properties": coefs}
    properties = {"name": NAME | {"enum": list(MODEL_NAMES)}, "form": FORM, "coefficients": coefficients}
    out = {"description": DESCRIPTIONS["latency_model"], "type": "object", "required": ["name", "coefficients"]}
    return out | {"additionalProperties": False, "properties": properties}


def contract_schema() -> dict:
    """The contract's part of the policy schema: its outermost properties, required keys and conditions, and the
    $defs they refer to."""
    parts = {part: layout(part, cls) for part, cls in CLASSES.items()}
    full = part_schema("full", list(FULL_KEYS), list(FULL_KEYS), closed=False)
    defs = {
        "count": COUNT,
        "coefficient": COEFFICIENT,
        "latency_model": latency_model_schema(),
        **{part: part_schema(part, *parts[part]) for part in ("settings", "table", "prompt_table")},
        "load": part_schema("load", *parts["load"], closed=False, full=full),
    }
    properties = {
        "schema_version": TOP["schema_version"] | {"enum": list(READ_VERSIONS)},
        "status": TOP["status"] | {"enum": list(STATUSES)},
        "reason": TOP["reason"],
        "latency_model": {
            "description": TOP_DESCRIPTIONS["latency_model"],
            "oneOf": [{"type": "null"}, {"$ref": "#/$defs/latency_model"}],
        },
        **{part: {"$ref": f"#/$defs/{part}"} for part in ("settings", "table", "prompt_table")},
        "target_latency_ms": TOP["target_latency_ms"],
        **{part: part_schema(part, *parts[part], closed=False) for part in ("overhead", "calibration")},
        "num_stages": TOP["num_stages"],
        "load": {
            "description": TOP_DESCRIPTIONS["load"],
            "oneOf": [{"$ref": "#/$defs/load"}, {"$ref": "#/$defs/load_schema4"}],
        },
    }
    meta = {"$schema": META["$schema"], "$id": f"urn:ppprof:policy:{SCHEMA_VERSION}"}
    meta |= {"title": f"{META['title']}, schema_version {SCHEMA_VERSION}", "description": META["description"]}
    return meta | {
        "type": "object",
        "required": list(REQUIRED_TOP),
        "properties": properties,
        "allOf": CONDITIONS,
        "$defs": defs,
    }


CLASSES = {
    "settings": ChunkSettings,
    "table": HistoryTable,
    "prompt_table": PromptRule,
    "load": LoadRule,
    "overhead": Overhead,
    "calibration": Calibration,
}
"""Each part of the contract by its key in the file, and its class."""

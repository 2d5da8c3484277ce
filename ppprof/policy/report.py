"""The report beside the contract: what a policy file holds for people and for `ppprof validate`, `compare`, `plan`
and the serving simulation, in its own typed part of the file (`report`, schema 6 on), and the layout step that reads
a policy of schema 3, 4 or 5 (its report's fields beside the contract's, one of them by its old name) in schema 6's
(`upgraded`). No server sizes a chunk from the report; ppprof's SGLang sizer checks the profiled setup in its
provenance against its own. Standard library only, as the contract."""

from __future__ import annotations

from dataclasses import dataclass

NESTED_VERSION = 6
"""The first schema version whose report is its own object (`report`); 3 to 5 hold its fields at the top level."""
REPORT_ORDER = (
    "target_chunk_latency_ms",
    "rule",
    "diagnostics",
    "provenance",
    "domain",
    "workload",
    "predicted",
    "parity",
    "design",
    "packed_forwards",
)
"""The report's fields in the order the fit writes them (design and packed_forwards where recorded)."""
OPTIONAL = ("design", "packed_forwards")
RENAMED = (("provenance", "world_size", "pp_size"),)
"""The report's fields schema 6 renamed, (part, old name, new name): the provenance's count of stages was
`world_size`, the word for ranks elsewhere."""


@dataclass(frozen=True, slots=True)
class Report:
    """The report, each field as the file holds it: the fitted model's whole predicted chunk latency, the rule's
    words, what the fit found and why (diagnostics), where the numbers come from (provenance), the profiled domain,
    the workload the rules were chosen on, what they are predicted to give (with the gain interval and the best fixed
    chunk; None for a static or parity policy), the parity rule's name, and where recorded, the probe design and the
    packed forwards' score."""

    target_chunk_latency_ms: float | None
    rule: str
    diagnostics: dict
    provenance: dict
    domain: dict | None
    workload: dict | None
    predicted: dict | None
    parity: str | None
    design: dict | None = None
    packed_forwards: dict | None = None

    def to_dict(self) -> dict:
        """The report's object in the file, in REPORT_ORDER (design and packed_forwards absent where None)."""
        return {k: getattr(self, k) for k in REPORT_ORDER if getattr(self, k) is not None or k not in OPTIONAL}

    @classmethod
    def from_dict(cls, report: dict) -> Report:
        """The report of a schema 6 file's `report` object (the schema checked it; a field it lacks reads None)."""
        return cls(**{k: report.get(k) for k in REPORT_ORDER})

    @property
    def fixed_best_chunk(self) -> int | None:
        """The best fixed chunk on the policy's workload, where its rules were chosen (None for a static policy)."""
        return (self.predicted or {}).get("fixed_best_chunk")

    @property
    def extra_piece_ms(self) -> float:
        """d: what a packed forward of n pieces costs beyond the additive form, d (n - 1), as the profile's packed
        forwards measured it (0, the additive form, where it timed none or the form held)."""
        return float((self.packed_forwards or {}).get("extra_piece_ms", 0.0))


def nested(flat: dict) -> dict:
    """A document whose report's fields stand beside the contract's (schema 3 to 5, or the fit's working form) in
    schema 6's layout: the contract's fields in their order, then `report` with the report's in REPORT_ORDER."""
    contract = {k: v for k, v in flat.items() if k not in REPORT_ORDER}
    return contract | {"report": {k: flat[k] for k in REPORT_ORDER if k in flat}}


def flattened(data: dict) -> dict:
    """A policy of any version read with its report's fields beside the contract's (the fit's working form; `nested`
    undoes it), under their new names."""
    doc = upgraded(data)
    return {k: v for k, v in doc.items() if k != "report"} | doc["report"]


def upgraded(data: dict) -> dict:
    """`data` (a policy the schema of its version took) in schema 6's layout, its schema_version kept (a schema 4
    under-load rule stays unread): a schema 6 document as it is; one of schema 3 to 5 nested (`nested`) with its
    renamed fields under their new names (RENAMED)."""
    if data.get("schema_version", NESTED_VERSION) >= NESTED_VERSION:
        return data
    out = nested(data)
    report = out["report"] = dict(out["report"])
    for part, old, new in RENAMED:
        if isinstance(report.get(part), dict) and old in report[part]:
            report[part] = {(new if k == old else k): v for k, v in report[part].items()}
    return out


def report_of(data: dict) -> dict:
    """The report object of a policy document of any version read (`upgraded`'s)."""
    return upgraded(data)["report"]

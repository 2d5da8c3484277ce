"""What the fit reads and what it returns, typed: `RunSamples` in (a profile's timed rows, what its run.json says and
its packed forwards' rows: held in memory by the profile that measured them, or read from its checkpoint files by
`ppprof fit`), and out the contract a server reads (ppprof.policy.runtime.Policy) beside the `Report`, the rest of
policy.json (diagnostics, provenance, domain, workload, predictions with the gain interval, design, the packed
forwards' score). `document` joins the two in policy.json's field order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ppprof.fit.packed import PackedRows, read_packed
from ppprof.fit.samples import Samples, read_run, read_samples
from ppprof.policy.runtime import Policy
from ppprof.runfiles import RunFolder


@dataclass(frozen=True, slots=True)
class RunSamples:
    """A profile's measurements as the fit reads them: the timed rows (`samples`), run.json's record (`run`: its
    config, stages, pipeline overhead, provenance and design; None for a plain CSV) and the packed forwards' rows
    (`packed`: None where none were timed)."""

    samples: Samples
    run: dict | None = None
    packed: PackedRows | None = None

    @classmethod
    def read(cls, samples_path: str | Path) -> RunSamples:
        """The checkpoint files (`ppprof fit`, `ppprof calibrate`): the samples CSV, and the run.json and packed.csv
        beside it where they exist. ValueError (one line) naming the file on bad input."""
        samples = read_samples(samples_path)
        run = read_run(samples_path)
        packed_path = RunFolder.of(samples_path).packed
        return cls(samples, run, read_packed(packed_path) if packed_path.is_file() else None)


DOCUMENT_ORDER = (
    "schema_version",
    "status",
    "reason",
    "latency_model",
    "settings",
    "target_latency_ms",
    "target_chunk_latency_ms",
    "rule",
    "diagnostics",
    "provenance",
    "domain",
    "overhead",
    "calibration",
    "num_stages",
    "workload",
    "table",
    "prompt_table",
    "predicted",
    "parity",
    "design",
    "packed_forwards",
    "load",
)
"""policy.json's fields in the order the fit writes them (absent ones skipped)."""


@dataclass(frozen=True, slots=True)
class Report:
    """policy.json beside the contract, each field as the file holds it: what the fit found and why (diagnostics),
    where the numbers come from (provenance), the profiled domain, the workload the rules were chosen on, what they
    are predicted to give (with the gain interval and the best fixed chunk; None for a static or parity policy), the
    parity rule's name, and where recorded, the probe design (run.json's) and the packed forwards' score."""

    target_chunk_latency_ms: float | None
    rule: str
    diagnostics: dict
    provenance: dict
    domain: dict
    workload: dict
    predicted: dict | None
    parity: str | None
    design: dict | None = None
    packed_forwards: dict | None = None

    def to_dict(self) -> dict:
        """The report's fields of policy.json (design and packed_forwards absent where None, as the file has them)."""
        fields = {name: getattr(self, name) for name in self.__slots__}
        return {k: v for k, v in fields.items() if v is not None or k not in ("design", "packed_forwards")}

    @classmethod
    def of(cls, data: dict) -> Report:
        """The report part of a policy document."""
        return cls(**{name: data.get(name) for name in cls.__slots__})


CONTRACT_KEYS = tuple(k for k in DOCUMENT_ORDER if k not in Report.__slots__)
"""policy.json's top-level fields a server reads (ppprof.policy.contract, through Policy.of): every field the Report
does not hold."""


def document(contract: Policy, report: Report) -> dict:
    """policy.json's document: the contract's fields and the report's, in DOCUMENT_ORDER."""
    parts = {k: contract.data[k] for k in CONTRACT_KEYS if k in contract.data} | report.to_dict()
    return {k: parts[k] for k in DOCUMENT_ORDER if k in parts}

"""What the fit reads and what it returns, typed: `RunSamples` in (a profile's timed rows, what its run.json says and
its packed forwards' rows: held in memory by the profile that measured them, or read from its checkpoint files by
`ppprof fit`), and out the contract a server reads (ppprof.policy.runtime.Policy) beside the `Report`, the rest of
policy.json (diagnostics, provenance, domain, workload, predictions with the gain interval, design, the packed
forwards' score; ppprof.policy.runtime.Report). `document` joins the two in policy.json's layout."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ppprof.fit.packed import PackedRows, read_packed
from ppprof.fit.samples import Samples, read_run, read_samples
from ppprof.policy.runtime import Policy, Report
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


def document(contract: Policy, report: Report) -> dict:
    """policy.json's document (schema 6): the contract's fields as the Policy read them, then the report's object."""
    return {k: v for k, v in contract.data.items() if k != "report"} | {"report": report.to_dict()}

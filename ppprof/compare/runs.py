"""`ppprof compare` behind its click command: resolve two run folders or policy files, compare the policies
(ppprof.compare.policies) and, where both have samples, their cells (ppprof.compare.cells); draw the comparison
(ppprof.compare.plot)."""

from __future__ import annotations

from pathlib import Path

from ppprof.compare.cells import samples_drift
from ppprof.compare.plot import write_compare_plot
from ppprof.compare.policies import compare_policies
from ppprof.fit.samples import read_samples
from ppprof.policy.policy_file import load
from ppprof.runfiles import POLICY_FILE, RunFolder


def resolve(path: str | Path, label: str) -> tuple[Path, Path | None]:
    """(policy file, samples file or None) of a run folder (its policy.json and samples.csv) or a policy file."""
    path = Path(path)
    if path.is_dir():
        folder = RunFolder(path)
        if not folder.policy.is_file():
            raise ValueError(
                f"{label} run folder {path} has no {POLICY_FILE}: fit it first with `ppprof fit {folder.samples}`"
            )
        return folder.policy, folder.samples if folder.samples.is_file() else None
    if not path.exists():
        raise ValueError(
            f"{label} {path} does not exist: pass a run folder (policy.json, samples.csv) or a policy file"
        )
    return path, None


def compare(
    baseline: str | Path,
    candidate: str | Path,
    tolerances: dict[str, float],
    *,
    prompt_lens: list[int] | None = None,
    pp_size: int | None = None,
    plot: str | Path | None = None,
) -> dict:
    """The comparison report (ppprof.compare.policies.compare_policies) of two run folders or policy files, with
    the samples' drift where both are run folders with samples; the PNG `plot` is written last, only when every
    input was good."""
    (bp, bs), (cp, cs) = resolve(baseline, "baseline"), resolve(candidate, "candidate")
    base, cand = load(bp), load(cp)
    samples = (read_samples(bs), read_samples(cs)) if bs and cs else None
    report = compare_policies(
        base,
        cand,
        tolerances,
        prompt_lens=prompt_lens,
        pp_size=pp_size,
        samples=samples_drift(*samples) if samples else None,
        labels=(str(baseline), str(candidate)),
    )
    report["baseline"].update(policy=str(bp), samples=str(bs) if bs else None)
    report["candidate"].update(policy=str(cp), samples=str(cs) if cs else None)
    if plot:
        report["plot"] = str(write_compare_plot(base, cand, samples, plot))
    return report

"""`ppprof compare`: two run folders or policies side by side (ppprof.compare.runs), or a forward trace against a
policy (ppprof.compare.forwards); exit 0 within tolerance, 1 on drift."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass

import click

from ppprof.checks import require_int
from ppprof.compare.forwards import check_trace, judge_text
from ppprof.compare.render import render
from ppprof.compare.runs import compare
from ppprof.compare.verdict import DEFAULT_TOLERANCES
from ppprof.forwards.reader import is_trace
from ppprof.io import atomic_write_json

OLD_TOLERANCE_NAMES = {"level": "pace"}
"""The old name of the pace tolerance, read for scripts written before it was renamed (`--tolerance level=1.5`)."""


def parse_tolerances(specs) -> dict[str, float]:
    """DEFAULT_TOLERANCES updated by NAME=VALUE items ('ttft=0.05', 'table=15%', 'coef=none'; commas separate
    several; an old name, OLD_TOLERANCE_NAMES, read as its new one); ValueError naming the item otherwise."""
    tol = dict(DEFAULT_TOLERANCES)
    for spec in specs or ():
        for item in filter(None, (s.strip() for s in str(spec).split(","))):
            name, sep, text = item.partition("=")
            name = OLD_TOLERANCE_NAMES.get(name.strip(), name.strip())
            if not sep or name not in tol:
                raise ValueError(
                    f"--tolerance {item!r} is invalid: use NAME=VALUE with NAME one of "
                    f"{', '.join(tol)} (e.g. ttft=0.1 or ttft=10%)"
                )
            text = text.strip()
            try:
                value = (
                    math.inf
                    if text.lower() in ("none", "inf")
                    else (float(text[:-1]) / 100 if text.endswith("%") else float(text))
                )
            except ValueError:
                value = math.nan
            if not value >= 0:
                raise ValueError(
                    f"--tolerance {item!r} is invalid: the value must be a number >= 0, a percentage or none"
                )
            tol[name] = value
    return tol


@click.command("compare", epilog="Example: ppprof compare results/baseline results/my-run --plot compare.png")
@click.argument("baseline", type=click.Path())
@click.argument("candidate", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the whole comparison as JSON.")
@click.option(
    "--tolerance",
    "tolerances",
    multiple=True,
    metavar="NAME=VALUE",
    help="Override a tolerance (repeat, or separate with commas); NAME [default]: "
    + ", ".join(f"{k} [{'none' if v == float('inf') else f'{v:g}'}]" for k, v in DEFAULT_TOLERANCES.items())
    + ". Values are fractions (0.1), percentages (10%) or none; level is read as pace (its old name).",
)
@click.option(
    "--prompt-len",
    "prompt_lens",
    type=int,
    multiple=True,
    help="Prompt length whose predicted TTFT is compared (repeat)  [default: 4, 16 and 64 x B]",
)
@click.option(
    "--pp-size",
    "--pp",
    "pp_size",
    type=int,
    default=None,
    help="Pipeline stages of the predicted TTFT  [default: the baseline's profiled stages]",
)
@click.option(
    "--plot",
    type=click.Path(dir_okay=False),
    default=None,
    help="PNG of both chunk-size tables and both latency models.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also write the JSON comparison to this file (written even when the policy drifted).",
)
def compare_command(baseline, candidate, **options) -> None:
    """Compare CANDIDATE with BASELINE (run folders or policy files): coefficients, target, chunk-size table,
    predicted TTFT, status and, for run folders, the samples; or a forward trace (*.jsonl) against POLICY per stage
    and prefix band. Exit 0 within tolerance, 1 on drift, 2 on bad input."""
    opts = CompareOptions.from_cli(**options)
    if is_trace(candidate):  # POLICY TRACE: the server's own forwards against the policy's predictions
        sys.exit(compare_trace(baseline, candidate, opts))
    sys.exit(compare_runs(baseline, candidate, opts))


@dataclass(frozen=True)
class CompareOptions:
    """The options of `ppprof compare`, the tolerances parsed (parse_tolerances)."""

    tolerances: dict[str, float]
    prompt_lens: tuple[int, ...]
    pp_size: int | None
    plot: str | None
    out: str | None
    as_json: bool

    @classmethod
    def from_cli(cls, tolerances, prompt_lens, **rest) -> CompareOptions:
        return cls(parse_tolerances(tolerances), tuple(prompt_lens), **rest)


def compare_runs(baseline, candidate, opts: CompareOptions) -> int:
    """`ppprof compare BASELINE CANDIDATE` (ppprof.compare.runs.compare): the report, and 1 on drift, else 0."""
    for n in opts.prompt_lens:
        require_int("--prompt-len", n, 1)
    report = compare(
        baseline,
        candidate,
        opts.tolerances,
        prompt_lens=sorted(set(opts.prompt_lens)) or None,
        pp_size=opts.pp_size,
        plot=opts.plot,
    )
    if opts.out:
        atomic_write_json(opts.out, report)
    click.echo(json.dumps(report, indent=2) if opts.as_json else render(report))
    return 1 if report["drifted"] else 0


def compare_trace(policy, trace, opts: CompareOptions) -> int:
    """`ppprof compare POLICY TRACE` (ppprof.compare.forwards.check_trace): the report, and 1 on drift, else 0."""
    report = check_trace(policy, trace, opts.tolerances)
    if opts.out:
        atomic_write_json(opts.out, report)
    click.echo(json.dumps(report, indent=2) if opts.as_json else "\n".join(judge_text(report)))
    return 1 if report["drifted"] else 0

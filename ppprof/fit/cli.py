"""`ppprof fit`: the click command; the work is in ppprof.fit.build (imported when the command runs)."""

from __future__ import annotations

import click

from ppprof.checks import require_int
from ppprof.io import atomic_write_json
from ppprof.fit.settings import DEFAULT_CONTEXT_LEN, DEFAULT_SMOOTH_FACTOR, LATENCY_MODEL_CHOICES
from ppprof.policy.compare import DEFAULT_TOLERANCES


@click.command("fit", epilog="Example: ppprof fit results/my-run/samples.csv -o policy.json")
@click.argument("samples", type=click.Path(dir_okay=False))
@click.option("--latency-model", type=click.Choice(LATENCY_MODEL_CHOICES), default="auto", show_default=True,
              help="quadratic (SGLang), prefix (ATOM), pairs (prefix + h L x^2) or auto (best on held-out prefix bands).")
@click.option("--base-chunk-size", type=int, default=None, help="B; default from run.json (required without it).")
@click.option("--smooth-factor", type=float, default=None, help=f"s in (0, 1]  [default: {DEFAULT_SMOOTH_FACTOR:g}]")
@click.option("--page-size", type=int, default=None, help="KV page size; default from run.json, else 1.")
@click.option("--alignment", type=int, default=None, help="Chunk alignment  [default: max(page_size, 64)]")
@click.option("--min-chunk-size", type=int, default=None, help="Floor of a chunk  [default: B // 4]")
@click.option("--max-chunk-size", type=int, default=None,
              help="Cap of each chunk after the first (max prefill tokens; may be below B)  [default: B]")
@click.option("--context-len", type=int, default=None,
              help=f"Context length; default from run.json, else {DEFAULT_CONTEXT_LEN}.")
@click.option("-o", "--out", type=click.Path(dir_okay=False), default=None,
              help="Policy file  [default: policy.json beside SAMPLES]")
@click.option("--parity", type=click.Choice(["sglang"]), default=None,
              help="With --latency-model quadratic: SGLang's own fit, nothing else (no trimming, no gates but a > 0).")
def fit_command(samples, latency_model, out, parity, **options) -> None:
    """Fit a latency model to SAMPLES (a CSV with prefix_len, chunk_size, latency_ms) and write a policy."""
    from ppprof.fit.build import fit
    from ppprof.fit.summary import summary

    for name in ("alignment", "min_chunk_size", "max_chunk_size"):
        if options[name] is not None:
            require_int(f"--{name.replace('_', '-')}", options[name], 1)
    path, policy = fit(samples, out, latency_model, parity=parity, **options)
    click.echo(summary(path, policy))


@click.command("compare", epilog="Example: ppprof compare results/baseline results/my-run --plot compare.png")
@click.argument("baseline", type=click.Path())
@click.argument("candidate", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the whole comparison as JSON.")
@click.option("--tolerance", "tolerances", multiple=True, metavar="NAME=VALUE",
              help="Override a tolerance (repeat, or separate with commas); NAME [default]: " + ", ".join(
                  f"{k} [{'none' if v == float('inf') else f'{v:g}'}]" for k, v in DEFAULT_TOLERANCES.items())
              + ". Values are fractions (0.1), percentages (10%) or none.")
@click.option("--prompt-len", "prompt_lens", type=int, multiple=True,
              help="Prompt length whose predicted TTFT is compared (repeat)  [default: 4, 16 and 64 x B]")
@click.option("--pp", "num_stages", type=int, default=None,
              help="Pipeline stages of the predicted TTFT  [default: the baseline's profiled stages]")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="PNG of both chunk-size tables and both latency models.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Also write the JSON comparison to this file (written even when the policy drifted).")
def compare_command(baseline, candidate, as_json, tolerances, prompt_lens, num_stages, plot, out) -> None:
    """Compare CANDIDATE with BASELINE (run folders or policy files): coefficients, target, chunk-size table,
    predicted TTFT, status and, for run folders, the samples. Exit 0 within tolerance, 1 on drift, 2 on bad input."""
    import json
    import sys

    from ppprof.fit.compare import compare
    from ppprof.policy.compare import parse_tolerances, render

    for n in prompt_lens:
        require_int("--prompt-len", n, 1)
    report = compare(baseline, candidate, parse_tolerances(tolerances), prompt_lens=sorted(set(prompt_lens)) or None,
                     num_stages=num_stages, plot=plot)
    if out:
        atomic_write_json(out, report)
    click.echo(json.dumps(report, indent=2) if as_json else render(report))
    if report["drifted"]:
        sys.exit(1)

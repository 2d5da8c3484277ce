"""`ppprof fit`: the click command; the work is in ppprof.fit.build (imported when the command runs)."""

from __future__ import annotations

from pathlib import Path

import click

from ppprof.checks import require_int
from ppprof.fit.settings import DEFAULT_CONTEXT_LEN, DEFAULT_SMOOTH_FACTOR, LATENCY_MODEL_CHOICES


@click.command("fit")
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
    note = incomplete_run_note(samples)
    if note:
        click.echo(f"warning: {note}", err=True)
    click.echo(summary(path, policy))


def incomplete_run_note(samples_path: str) -> str | None:
    """One line when the run that wrote SAMPLES did not complete (run.json's status): what the fit stands on."""
    import pandas as pd

    from ppprof.fit.samples import read_run
    from ppprof.runfiles import COMPLETE

    run = read_run(samples_path)
    if run is None or run["status"] == COMPLETE:
        return None
    frame = pd.read_csv(samples_path)
    probes = frame["probe"].nunique() if "probe" in frame.columns else None
    total = run.get("num_probes")
    kept = f"the {len(frame)} samples of {probes} of {total} probes" if probes and total else f"its {len(frame)} samples"
    return (f"the run in {Path(samples_path).parent} is {run['status']} (run.json), not complete: fitted {kept}; "
            f"`ppprof profile --resume {Path(samples_path).parent}` finishes it")

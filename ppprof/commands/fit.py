"""`ppprof fit`: fit a latency model to a profile's samples and write a policy (ppprof.fit.build)."""

from __future__ import annotations

import click

from ppprof.checks import require_int
from ppprof.commands.options import policy_options
from ppprof.config import DEFAULT_CONTEXT_LEN, DEFAULT_SMOOTH_FACTOR
from ppprof.fit.build import fit
from ppprof.fit.settings import LATENCY_MODEL_CHOICES
from ppprof.fit.summary import fit_summary, incomplete_run_note
from ppprof.servers.sglang import PARITY


@click.command("fit", epilog="Example: ppprof fit results/my-run/samples.csv -o policy.json")
@click.argument("samples", type=click.Path(dir_okay=False))
@click.option(
    "--latency-model",
    type=click.Choice(LATENCY_MODEL_CHOICES),
    default="auto",
    show_default=True,
    help="quadratic (SGLang), prefix (ATOM), pairs (prefix + h L x^2) or auto (best on held-out prefix bands).",
)
@click.option("--base-chunk-size", type=int, default=None, help="B; default from run.json (required without it).")
@click.option("--smooth-factor", type=float, default=None, help=f"s in (0, 1]  [default: {DEFAULT_SMOOTH_FACTOR:g}]")
@click.option("--page-size", type=int, default=None, help="KV page size; default from run.json, else 1.")
@click.option("--alignment", type=int, default=None, help="Chunk alignment  [default: max(page_size, 64)]")
@click.option("--min-chunk-size", type=int, default=None, help="Floor of a chunk  [default: B // 4]")
@click.option(
    "--max-chunk-size",
    type=int,
    default=None,
    help="Cap of each chunk after the first (max prefill tokens; may be below B)  [default: B]",
)
@click.option(
    "--context-len", type=int, default=None, help=f"Context length; default from run.json, else {DEFAULT_CONTEXT_LEN}."
)
@click.option(
    "-o",
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="Policy file  [default: policy.json beside SAMPLES]",
)
@click.option(
    "--parity",
    type=click.Choice([PARITY]),
    default=None,
    help="With --latency-model quadratic: SGLang's own fit and rule, nothing else (no trimming, no gates but a > 0).",
)
@policy_options
def fit_command(samples, latency_model, out, parity, **options) -> None:
    """Fit a latency model to SAMPLES (a CSV with prefix_len, chunk_size, latency_ms) and write a policy: the
    prompt-aware rule, the history-only table for the workload, and its status."""
    for name in ("alignment", "min_chunk_size", "max_chunk_size"):
        if options[name] is not None:
            require_int(f"--{name.replace('_', '-')}", options[name], 1)
    names = ("prompt_lens", "min_gain", "overhead_ms", "pp_size", "extrapolate", "async_depth", "load_rule")
    chosen = {name: options.pop(name) for name in names}  # the policy options (ppprof.config.PolicyOptions)
    chosen["extrapolate"] = chosen["extrapolate"] or None
    pp_size = chosen["pp_size"]
    path, policy = fit(samples, out, latency_model, parity=parity, policy_options=chosen, **options)
    for line in notes(samples, policy, pp_size):
        click.echo(line, err=True)
    click.echo(fit_summary(path, policy))


def notes(samples: str, policy: dict, pp_size: int | None) -> list[str]:
    """What the fit's output line does not say: a run that did not finish, the stage count taken from the samples."""
    out = []
    note = incomplete_run_note(samples)
    if note:
        out.append(f"warning: {note}")
    no_run = policy["report"]["provenance"].get("pp_size") is None  # fit() found no run.json that says
    if pp_size is None and no_run and policy["num_stages"] > 1:
        out.append(
            f"note: no run.json beside {samples}: the rules are chosen for its {policy['num_stages']} stage columns; "
            "give --pp-size to choose them for another depth"
        )
    return out

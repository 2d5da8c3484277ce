"""`ppprof plan`: the chunk plans of one prompt under a policy, with predicted latencies and TTFT, and a timeline."""

from __future__ import annotations

import json
from itertools import groupby
from pathlib import Path

import click

from ppprof.commands.options import with_options
from ppprof.policy.planners import STRATEGIES, Plan, default_pp_size, plan_prompt
from ppprof.policy.policy_file import load
from ppprof.policy.summary import calibration_text, extrapolation, gain_text
from ppprof.policy.timeline import write_timeline


def run_length(values, fmt="{}") -> str:
    """'8192x12 1696': runs of equal values."""
    parts = []
    for value, run in groupby(values):
        n = len(list(run))
        parts.append(fmt.format(value) + (f"x{n}" if n > 1 else ""))
    return " ".join(parts)


def echo_side_by_side(plans: list[Plan]) -> None:
    """One line a strategy: chunks, predicted TTFT and its ratio to the optimal plan's (where planned)."""
    best = next((p.ttft_ms for p in plans if p.strategy == "optimal"), None)
    click.echo(f"  {'strategy':<15}{'chunks':>7}{'TTFT ms':>11}" + ("   / optimal" if best else ""))
    for p in plans:
        ratio = f"{p.ttft_ms / best:>12.3f}" if best else ""
        click.echo(f"  {p.strategy:<15}{len(p.chunk_sizes):>7}{p.ttft_ms:>11.2f}{ratio}")


def echo_plan(p: Plan) -> None:
    """A plan's lines: chunk count and TTFT, chunks, latencies and, for the optimal plan, how exact its search was."""
    click.echo(
        f"{p.strategy}: {len(p.chunk_sizes)} chunks, predicted TTFT {p.ttft_ms:.2f} ms "
        f"(sum {sum(p.latencies_ms):.2f} ms, max {max(p.latencies_ms):.2f} ms)"
    )
    click.echo(f"  chunks: {run_length(p.chunk_sizes)}")
    click.echo(f"  latency_ms: {run_length([round(t, 2) for t in p.latencies_ms], '{:.2f}')}")
    if p.search:
        search, where = p.search, f"on the {p.search['grid_tokens']}-token grid"
        quality = (
            f"exact {where}" if search["exact_on_grid"] else f"within {search['gap_ms']:.2f} ms of the optimum {where}"
        )
        click.echo(
            f"  search: {quality} ({search['bounds_evaluated']} of {search['num_chunk_costs']} chunk-latency bounds)"
        )


PLAN_OPTIONS = (
    (("--prompt-len",), dict(type=int, required=True), "Prompt length in tokens."),
    (
        ("--pp-size", "--pp", "pp_size"),
        dict(type=int, default=None),
        "Pipeline stages  [default: the policy's profiled stages, else 1]",
    ),
    (
        ("--strategy",),
        dict(type=click.Choice(STRATEGIES + ("all",)), default="all", show_default=True),
        "policy (the prompt-aware rule), policy-history (its history-only table), greedy (SGLang's rule "
        "on the fitted model), fixed (B), fixed-best (the best fixed chunk for this prompt), optimal (DP).",
    ),
    (
        ("--extrapolate",),
        dict(is_flag=True, default=False),
        "Plan a prompt beyond the policy's profiled domain, and chunks up to 4 B, on the latency model.",
    ),
    (("--json", "as_json"), dict(is_flag=True), "Print JSON instead of text."),
    (
        ("--png",),
        dict(type=click.Path(dir_okay=False), default=None),
        "Timeline PNG  [default: <policy>.plan-<N>-pp<P>.png beside the policy]",
    ),
)
"""The options of `ppprof plan`, in the order --help shows them."""


@click.command("plan", epilog="Example: ppprof plan results/my-run/policy.json --prompt-len 32768 --pp 4")
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False))
@with_options(*PLAN_OPTIONS)
def plan_command(policy_path, prompt_len, pp_size, strategy, extrapolate, as_json, png) -> None:
    """Chunk plans of one prompt with predicted per-chunk latency and TTFT = sum t + (P - 1) max t (t: the fitted
    latency plus the per-chunk pipeline overhead), side by side."""
    policy = load(policy_path)
    pp_size = default_pp_size(policy) if pp_size is None else pp_size
    strategies = STRATEGIES if strategy == "all" else (strategy,)
    plans = plan_prompt(policy, prompt_len, pp_size, strategies, extrapolate)
    path = Path(policy_path)
    png = Path(png) if png else path.with_name(f"{path.stem}.plan-{prompt_len}-pp{pp_size}.png")
    write_timeline(plans, pp_size, png, f"{path.name}: prompt {prompt_len} tokens, {pp_size} stages")
    notes = [n for n in (extrapolation(policy, prompt_len, p.chunk_sizes) for p in plans) if n]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "policy": str(path),
                    "prompt_len": prompt_len,
                    "num_stages": pp_size,
                    "png": str(png),
                    "extrapolation": notes[0] if notes else None,
                    "plans": [p.to_dict() for p in plans],
                },
                indent=2,
            )
        )
        return
    if notes:
        click.echo(f"warning: {notes[0]}", err=True)
    click.echo(
        f"policy {path} ({policy.status}{gain_text(policy)}, rules chosen for {policy.pp_size} stages, overhead "
        f"{policy.overhead_ms:.3g} ms a chunk{calibration_text(policy.calibration)}), prompt {prompt_len} tokens, "
        f"{pp_size} stages"
    )
    echo_side_by_side(plans)
    for p in plans:
        echo_plan(p)
    click.echo(f"timeline: {png}")

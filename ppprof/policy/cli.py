"""`ppprof plan`, `ppprof export`, `ppprof validate`: the click commands over a policy file and what they print; the
work is in planners, timeline, export and schema."""

from __future__ import annotations

import json
from itertools import groupby
from pathlib import Path

import click

from ppprof.policy.export import FORMATS, export, export_data
from ppprof.policy.planners import STRATEGIES, Plan, default_num_stages, plan_prompt
from ppprof.policy.schema import extrapolation, load, validate
from ppprof.policy.servers import LABELS, SERVERS
from ppprof.policy.timeline import write_timeline
from ppprof.policy.tune import draw, parse_prompt_spec, tune


def run_length(values, fmt="{}") -> str:
    """'8192x12 1696': runs of equal values."""
    parts = []
    for value, run in groupby(values):
        n = len(list(run))
        parts.append(fmt.format(value) + (f"x{n}" if n > 1 else ""))
    return " ".join(parts)


def echo_plan(p: Plan) -> None:
    """A plan's lines: chunk count and TTFT, chunks, latencies and, for the optimal plan, how exact its search was."""
    click.echo(f"{p.strategy}: {len(p.chunk_sizes)} chunks, predicted TTFT {p.ttft_ms:.2f} ms "
               f"(sum {sum(p.latencies_ms):.2f} ms, max {max(p.latencies_ms):.2f} ms)")
    click.echo(f"  chunks: {run_length(p.chunk_sizes)}")
    click.echo(f"  latency_ms: {run_length([round(t, 2) for t in p.latencies_ms], '{:.2f}')}")
    if p.search:
        search, where = p.search, f"on the {p.search['grid_tokens']}-token grid"
        quality = f"exact {where}" if search["exact_on_grid"] else \
            f"within {search['gap_ms']:.2f} ms of the optimum {where}"
        click.echo(f"  search: {quality} ({search['bounds_evaluated']} of {search['num_chunk_costs']} "
                   f"chunk-latency bounds)")


@click.command("plan")
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False))
@click.option("--prompt-len", type=int, required=True, help="Prompt length in tokens.")
@click.option("--pp", "num_stages", type=int, default=None,
              help="Pipeline stages  [default: the policy's profiled stages, else 1]")
@click.option("--strategy", type=click.Choice(STRATEGIES + ("all",)), default="all", show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@click.option("--png", type=click.Path(dir_okay=False), default=None,
              help="Timeline PNG  [default: <policy>.plan-<N>-pp<P>.png beside the policy]")
def plan_command(policy_path, prompt_len, num_stages, strategy, as_json, png) -> None:
    """Chunk plans of one prompt with predicted per-chunk latency and TTFT = sum t + (P - 1) max t."""
    policy = load(policy_path)
    num_stages = default_num_stages(policy) if num_stages is None else num_stages
    strategies = STRATEGIES if strategy == "all" else (strategy,)
    plans = plan_prompt(policy, prompt_len, num_stages, strategies)
    path = Path(policy_path)
    png = Path(png) if png else path.with_name(f"{path.stem}.plan-{prompt_len}-pp{num_stages}.png")
    write_timeline(plans, num_stages, png, f"{path.name}: prompt {prompt_len} tokens, {num_stages} stages")
    notes = [n for n in (extrapolation(policy, prompt_len, p.chunk_sizes) for p in plans) if n]
    if as_json:
        click.echo(json.dumps({"policy": str(path), "prompt_len": prompt_len, "num_stages": num_stages,
                               "png": str(png), "extrapolation": notes[0] if notes else None,
                               "plans": [p.to_dict() for p in plans]}, indent=2))
        return
    if notes:
        click.echo(f"warning: {notes[0]}", err=True)
    click.echo(f"policy {path} ({policy.status}), prompt {prompt_len} tokens, {num_stages} stages")
    for p in plans:
        echo_plan(p)
    click.echo(f"timeline: {png}")


@click.command("export")
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True, help="Target server.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON: flags, comments and where the server's rule differs.")
def export_command(policy_path, fmt, as_json) -> None:
    """Print the server settings that carry POLICY (SGLang, vllm-ascend or ATOM), and where that server's own rule
    would size chunks differently with them."""
    policy = load(policy_path)
    if as_json:
        click.echo(json.dumps(export_data(policy, fmt, policy_path), indent=2))
    else:
        click.echo(export(policy, fmt, policy_path))


@click.command("validate")
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False))
def validate_command(policy_path) -> None:
    """Check POLICY's schema and sanity; print 'ok ...' (exit 0) or one line (exit 2)."""
    click.echo(f"ok {policy_path}: {validate(load(policy_path))}")


@click.command("tune")
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False))
@click.option("--prompt-lens", "spec", required=True, metavar="SPEC",
              help="Prompt lengths: a list (8192,32768; weights as 8192:3,32768:1) or a file (one a line, or a CSV "
                   "with a prompt_len column and an optional weight column; a trace's rows count once each).")
@click.option("--pp", "num_stages", type=int, default=None,
              help="Pipeline stages  [default: the policy's profiled stages, else 1]")
@click.option("--server", type=click.Choice(SERVERS), default="sglang", show_default=True,
              help="The server whose flags, boot fit and chunk rule are tuned.")
@click.option("--current", default=None, metavar="FLAGS",
              help="Your current flags in the server's syntax, as one string  [default: the server's defaults]")
@click.option("--extrapolate", is_flag=True,
              help="Search chunk sizes beyond the profiled ones (the latency model is extrapolated there).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (every setting's TTFT per prompt, and its plans).")
@click.option("--png", type=click.Path(dir_okay=False), default=None,
              help="Plot of TTFT versus base chunk and smoothing factor  [default: <policy>.tune-<server>.png "
                   "beside the policy]")
def tune_command(policy_path, spec, num_stages, server, current, extrapolate, as_json, png) -> None:
    """Recommend server flags (base chunk, smoothing factor, floor or cap) that minimise the predicted TTFT of your
    prompt lengths, as that server would chunk them; compare with your current flags, the best fixed chunk and the
    DP-optimal bound.

    Example: ppprof tune results/<run>/policy.json --prompt-lens 8192,32768,131072 --pp 4 --server sglang
    """
    policy = load(policy_path)
    workload = parse_prompt_spec(spec, policy.settings.context_len)
    num_stages = default_num_stages(policy) if num_stages is None else num_stages
    result = tune(policy, workload, num_stages, server, current, extrapolate)
    path = Path(policy_path)
    png = Path(png) if png else path.with_name(f"{path.stem}.tune-{server}.png")
    draw(result, png, f"{path.name}: {LABELS[server]}, {num_stages} stages, {len(workload.prompt_lens)} prompt "
                      f"lengths")
    result["png"] = str(png)
    if as_json:
        click.echo(json.dumps(result, indent=2))
        return
    for note in result["notes"]:
        click.echo(f"note: {note}", err=True)
    echo_tune(result, path)


def echo_tune(result: dict, path: Path) -> None:
    """The recommendation, then predicted TTFT per prompt length for each setting and the DP bound."""
    label = LABELS[result["server"]]
    click.echo(f"policy {path} ({result['latency_model']} model), {label}, {result['num_stages']} stages")
    click.echo(f"recommended {label} flags:")
    click.echo(f"  {result['recommended']['command']}")
    settings = result["settings"]
    names = list(settings) + ["optimal"]
    click.echo("predicted TTFT (ms):")
    click.echo(f"  {'prompt_len':>10} {'weight':>6} " + " ".join(f"{n:>14}" for n in names))
    optimal = result["optimal"]["per_prompt"]
    for i, (n, w) in enumerate(zip(result["workload"]["prompt_lens"], result["workload"]["weights"])):
        cells = [settings[k]["per_prompt"][i]["ttft_ms"] for k in settings] + [optimal[i]["ttft_ms"]]
        click.echo(f"  {n:>10} {w:>6.3f} " + " ".join(f"{c:>14.2f}" for c in cells))
    for key, name in (("mean_ttft_ms", "mean"), ("p90_ttft_ms", "p90")):
        cells = [settings[k][key] for k in settings] + [result["optimal"][key]]
        click.echo(f"  {name:>10} {'':>6} " + " ".join(f"{c:>14.2f}" for c in cells))
    for k in settings:
        s = settings[k]["setting"]
        mode = (f"dynamic, B {s['base_chunk_size']}, s {s['smooth_factor']:g}, floor {s['min_chunk_size']}, "
                f"cap {s['max_chunk_size']}") if s["dynamic"] else \
            f"fixed {s['max_chunk_size'] if s['server'] == 'atom' else s['base_chunk_size']}"
        click.echo(f"  {k}: {mode}")
    gain = result["gain"]
    click.echo(f"recommended vs {list(settings)[0]}: {gain['vs_current']:+.1%} mean TTFT saved; vs the policy's "
               f"settings {gain['vs_policy']:+.1%}; vs the best fixed chunk {gain['vs_best_fixed']:+.1%}; "
               f"{result['gap_to_optimal']:.1%} above the DP-optimal bound")
    click.echo(f"plot: {result['png']}")

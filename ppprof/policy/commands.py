"""`ppprof plan`, `ppprof export`, `ppprof validate` over a policy file, with what they print and draw: server
settings (the servers re-profile their own model at start, so an export carries the settings; the policy's
coefficients only inform them) and the predicted pipeline timeline PNG (matplotlib, Agg, imported when drawing)."""

from __future__ import annotations

import json
import shlex
from itertools import groupby
from pathlib import Path

import click
import numpy as np

from ppprof.plotting import pyplot, save_figure
from ppprof.policy.planners import STRATEGIES, Plan, plan_prompt
from ppprof.policy.schema import Policy, load, validate

FORMATS = ("sglang", "vllm-ascend", "atom")
MAX_DRAWN_STAGES = 16  # stage rows in a timeline PNG; beyond, the first 15 and the last are drawn


def default_num_stages(policy) -> int:
    prov = policy.data.get("provenance") or {}
    partition = prov.get("layer_partition")
    if isinstance(partition, list) and partition:
        return len(partition)
    world = prov.get("world_size")
    return world if isinstance(world, int) and world > 0 else 1


def run_length(values, fmt="{}") -> str:
    """'8192x12 1696': runs of equal values."""
    parts = []
    for value, run in groupby(values):
        n = len(list(run))
        parts.append(fmt.format(value) + (f"x{n}" if n > 1 else ""))
    return " ".join(parts)


def header(policy: Policy, server: str, source: str) -> list[str]:
    lines = [f"# {server} re-profiles its own latency model at start; these settings come from {source}",
             f"# (policy {policy.status}: {policy.reason});",
             "# the policy's coefficients inform them, they are not loaded."]
    if policy.model is not None:
        coefs = ", ".join(f"{k}={getattr(policy.model, k):.4g}" for k in ("a", "b", "c", "g"))
        lines.append(f"# ppprof model {policy.model.name}: {coefs} (ms, tokens); target {policy.target_ms:.4g} ms")
    return lines


def export(policy: Policy, fmt: str, source: str = "the policy") -> str:
    """Lines for `fmt` (one of FORMATS): comment lines, then environment and command-line arguments."""
    s = policy.settings
    dynamic = policy.status == "dynamic"
    if fmt == "sglang":
        lines = header(policy, "SGLang", source)
        if s.min_chunk_size != s.base_chunk_size // 4:
            lines.append(f"# note: SGLang floors chunks at B // 4 = {s.base_chunk_size // 4}, not at "
                         f"min_chunk_size {s.min_chunk_size}")
        args = ["--chunked-prefill-size", str(s.base_chunk_size), "--max-prefill-tokens", str(s.max_chunk_size)]
        if dynamic:
            lines.append(f"export SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR={s.smooth_factor:g}")
            args = ["--enable-dynamic-chunking"] + args
    elif fmt == "vllm-ascend":
        lines = header(policy, "vllm-ascend", source)
        config = {"profiling_chunk_config": {"enabled": dynamic, "smooth_factor": s.smooth_factor,
                                             "min_chunk": s.min_chunk_size}}
        args = ["--max-num-batched-tokens", str(s.base_chunk_size),
                "--additional-config", json.dumps(config, separators=(",", ":"))]
    elif fmt == "atom":
        lines = header(policy, "ATOM", source)
        args = ["--max-num-batched-tokens", str(s.base_chunk_size)]
        if dynamic:
            args = ["--enable-dynamic-chunking", "--dynamic-chunking-smooth-factor", f"{s.smooth_factor:g}",
                    "--dynamic-chunking-min-chunk-size", str(s.min_chunk_size)] + args
    else:
        raise ValueError(f"--format {fmt} is unknown: use one of {', '.join(FORMATS)}")
    lines.append(" ".join(shlex.quote(a) for a in args))
    return "\n".join(lines)


def schedule(latencies_ms, num_stages: int) -> np.ndarray:
    """Start times (num_chunks, num_stages): chunk i enters stage s when it left stage s-1 and chunk i-1 left s.

    Every stage takes the bottleneck latency t_i, so the last end is sum t + (P - 1) max t (the TTFT formula).
    One stage at a time: with T_i = t_0 + ... + t_{i-1}, start[i, s] = T_i + max over k <= i of
    (start[k, s-1] + t_k - T_k), a running maximum (stage 0: start[i, 0] = T_i).
    """
    t = np.asarray(latencies_ms, dtype=float)
    before = np.concatenate([[0.0], np.cumsum(t)[:-1]])  # T_i
    start = np.zeros((len(t), num_stages))
    start[:, 0] = before
    for s in range(1, num_stages):
        start[:, s] = before + np.maximum.accumulate(start[:, s - 1] + t - before)
    return start


def drawn_stages(num_stages: int) -> list[int]:
    """At most MAX_DRAWN_STAGES rows: all stages, or the first ones and the last."""
    if num_stages <= MAX_DRAWN_STAGES:
        return list(range(num_stages))
    return list(range(MAX_DRAWN_STAGES - 1)) + [num_stages - 1]


def write_timeline(plans: list[Plan], num_stages: int, path: str | Path, title: str = "") -> Path:
    plt = pyplot()
    stages = drawn_stages(num_stages)
    if len(stages) < num_stages:
        title += (f"{'; ' if title else ''}stages {stages[-2] + 1}..{num_stages - 2} of {num_stages} not drawn")
    rows = len(stages)
    fig, axes = plt.subplots(len(plans), 1, figsize=(10, 1.0 + 0.9 * len(plans) + 0.25 * rows * len(plans)),
                             squeeze=False, sharex=True)
    cmap = plt.get_cmap("tab20")
    for ax, plan in zip(axes[:, 0], plans):
        start = schedule(plan.latencies_ms, num_stages)
        for row, s in enumerate(stages):
            bars = [(start[i, s], plan.latencies_ms[i]) for i in range(len(plan.latencies_ms))]
            ax.broken_barh(bars, (row - 0.4, 0.8), facecolors=[cmap(i % 20) for i in range(len(bars))],
                           edgecolor="black", linewidth=0.2)
        ax.set_yticks(range(rows), [f"stage {s}" for s in stages])
        ax.invert_yaxis()
        ax.set_title(f"{plan.strategy}: {len(plan.chunk_sizes)} chunks, predicted TTFT {plan.ttft_ms:.1f} ms",
                     fontsize=9)
    axes[-1, 0].set_xlabel("time (ms)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)


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
    if as_json:
        click.echo(json.dumps({"policy": str(path), "prompt_len": prompt_len, "num_stages": num_stages,
                               "png": str(png), "plans": [p.to_dict() for p in plans]}, indent=2))
        return
    click.echo(f"policy {path} ({policy.status}), prompt {prompt_len} tokens, {num_stages} stages")
    for p in plans:
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
    click.echo(f"timeline: {png}")


@click.command("export")
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False))
@click.option("--format", "fmt", type=click.Choice(FORMATS), required=True, help="Target server.")
def export_command(policy_path, fmt) -> None:
    """Print the server settings that carry POLICY (SGLang, vllm-ascend or ATOM)."""
    click.echo(export(load(policy_path), fmt, policy_path))


@click.command("validate")
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False))
def validate_command(policy_path) -> None:
    """Check POLICY's schema and sanity; print 'ok ...' (exit 0) or one line (exit 2)."""
    click.echo(f"ok {policy_path}: {validate(load(policy_path))}")

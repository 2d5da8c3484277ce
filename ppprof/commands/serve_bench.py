"""`ppprof serve-bench`: a serving benchmark of arriving requests under each arm (ppprof.serving): through the ranks
(ppprof.run.serve_job), with the simulation of the same prompts beside it, or (`--simulate`) the simulation alone on
the policy's planning model."""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass, fields
from pathlib import Path

import click

from ppprof.bounds import DEVICES, MAX_ASYNC_DEPTH, MAX_STAGES, MAX_TOKENS
from ppprof.checks import require_int
from ppprof.commands.options import (
    TORCHRUN_PARAMS,
    TieredCommand,
    forward_trace_option,
    resolved_config_option,
    taken,
    timeout_option,
    torchrun_options,
    verbose_option,
    with_options,
)
from ppprof.config.workload import Workload, parse_prompt_spec
from ppprof.distributed.launch import TORCHRUN_OPTIONS
from ppprof.io import append_lines
from ppprof.manifest import write_result
from ppprof.policy.planners import default_pp_size
from ppprof.policy.policy_file import load
from ppprof.run.job import JobFlags, start
from ppprof.run.resolve import check_output_file, resolve_serve
from ppprof.run.serve_job import serve_rank
from ppprof.run.serve_trace import trace_rank
from ppprof.serving.arms import SERVING_ARMS
from ppprof.serving.levels import ServingPlan, parse_arms, parse_levels, simulate_levels
from ppprof.serving.plots import write_plots
from ppprof.serving.replay import replay
from ppprof.serving.report import levels_text, trace_text
from ppprof.serving.serve_config import ServeBenchConfig
from ppprof.traces.mooncake import parse_window, read_trace

PROFILES = "[the profile's]"
NUM_PROMPTS = 64
"""Prompts a level serves by default."""
SERVE_BENCH_OPTIONS = (
    (("--simulate",), dict(is_flag=True), "Simulate on the policy's planning model alone, no ranks."),
    (("--concurrency",), dict(metavar="LIST"), "Closed-loop levels: requests in flight, e.g. 1,2,4,8,16."),
    (("--request-rate",), dict(metavar="LIST"), "Poisson levels: requests a second, e.g. 0.5,1,2."),
    (
        ("--num-prompts",),
        dict(type=int, default=None),
        f"Prompts served at each level (--trace: its first N). [{NUM_PROMPTS}; --trace: the whole part]",
    ),
    (
        ("--prompt-lens", "spec"),
        dict(metavar="SPEC"),
        "Prompt lengths drawn with their weights (tune's SPEC: 8192:3,32768:1 or a file)  [default: the policy's "
        "workload]",
    ),
    (("--strategies",), dict(), f"Comma-separated subset of {','.join(SERVING_ARMS)}. [all]"),
    (
        ("--trace",),
        dict(type=click.Path(dir_okay=False)),
        "Replay a Mooncake JSONL trace (arrivals, lengths, prefix reuse) instead of levels: through the ranks (a "
        "window of it: --trace-window, --num-prompts, --time-scale) or with --simulate.",
    ),
    (
        ("--length-scale",),
        dict(type=float, default=1.0, show_default=True),
        "--trace: lengths (and blocks) times this.",
    ),
    (("--time-scale",), dict(type=float, default=1.0, show_default=True), "--trace: arrival times times this."),
    (
        ("--output-file",),
        dict(type=click.Path(dir_okay=False)),
        "--trace: append each arm's run as one JSON line, in SGLang bench_serving's metric names.",
    ),
    (("--trace-window",), dict(metavar="START:END"), "--trace: its requests in these seconds of its clock."),
    (
        ("--cache-tokens",),
        dict(type=int, default=None),
        "--trace: the prefix cache's tokens (0: none, every prefill cold). [the simulated KV pool's]",
    ),
    (("--output-details",), dict(is_flag=True), "--trace: add per-request arrays to --output-file's lines."),
    (
        ("--pp-size", "--pp", "pp_size"),
        dict(type=int, default=None),
        "Pipeline stages  [default: the policy's profiled stages, else 1]",
    ),
    (
        ("--async-depth",),
        dict(type=int, default=0, show_default=True),
        "Micro-batches in flight beyond pp_size (SGLang's --pp-async-batch-depth).",
    ),
    (("--seed",), dict(type=int, default=0, show_default=True), "Seed of the prompt lengths and the arrivals."),
    (
        ("--repeats",),
        dict(type=int, default=3, show_default=True),
        "Through the ranks: runs of every (level, arm), interleaved; the medians are reported.",
    ),
    (
        ("--out",),
        dict(type=click.Path(dir_okay=False)),
        "serving.json's path  [default: --simulate: beside POLICY; else results/<time>-serve-<model>/]",
    ),
    forward_trace_option,
    (("--nproc-per-node",), dict(type=int), f"Ranks on this node. {PROFILES}"),
    (("--device",), dict(type=click.Choice(DEVICES)), PROFILES),
    (("--torch-threads",), dict(type=int), f"Intra-op threads per rank. {PROFILES}"),
    timeout_option,
    torchrun_options,
    resolved_config_option,
    verbose_option,
)
"""The options of `ppprof serve-bench`, in the order --help shows them."""
SERVE_BENCH_ADVANCED = TORCHRUN_PARAMS | {
    "seed",
    "nproc_per_node",
    "device",
    "torch_threads",
    "timeout",
    "trace_window",
    "cache_tokens",
    "output_details",
}
"""What --help-all alone lists: the seed, where and how the ranks run (the profile's by default), torchrun's options."""


@click.command(
    "serve-bench",
    cls=TieredCommand,
    advanced=SERVE_BENCH_ADVANCED,
    epilog="Example: ppprof serve-bench results/my-run/policy.json --concurrency 1,2,4,8",
)
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False), required=False)
@with_options(*SERVE_BENCH_OPTIONS)
def serve_bench_command(policy_path, simulate, resolved_config, **flags) -> None:
    """Serve arriving requests (closed-loop concurrency, Poisson rates, or a request trace's with --trace) under each
    arm, as SGLang's PP scheduler batches them: through the pipeline's ranks, each batch one packed forward, with the simulation of the same
    prompts on the policy's model beside it, or with --simulate the simulation alone. Reports per level and arm the
    input throughput, TTFT mean / p50 / p90 / p99, the stages' idle fraction, chunks per request and requests per
    batch. Writes serving.json (through the ranks also serving.csv, every batch on every stage) and beside it
    serving.png (throughput and mean TTFT against the load, an arm a line) and serving-ttft.png (the TTFT
    distribution at the heaviest level)."""
    torchrun = {name: flags.pop(name) for name, _ in TORCHRUN_OPTIONS}
    if resolved_config is not None:  # a rank the launcher started
        serve = ServeBenchConfig.from_dict(json.loads(resolved_config))
        rank = serve_rank if serve.trace is None else trace_rank
        sys.exit(start("serve-bench", rank, serve, torchrun, JobFlags(resolved=True)))
    if policy_path is None:
        raise click.UsageError("Missing argument 'POLICY': give the policy.json of a profile")
    trace_flags = {k: flags.pop(k) for k in TRACE_FLAGS}
    trace = trace_flags if trace_flags["trace"] is not None else None
    if trace is not None:
        if flags["concurrency"] is not None or flags["request_rate"] is not None:
            raise ValueError("--trace sets the arrivals: drop --concurrency and --request-rate")
        if flags["spec"] is not None:
            raise ValueError("--trace sets the prompt lengths: drop --prompt-lens")
    else:
        for name, value in trace_flags.items():
            if value not in (None, False, 1.0):
                raise ValueError(f"--{name.replace('_', '-')} needs --trace FILE: give the trace it applies to")
        flags["num_prompts"] = NUM_PROMPTS if flags["num_prompts"] is None else flags["num_prompts"]
    if simulate:
        if flags["forward_trace"] is not None:
            raise ValueError("--forward-trace with --simulate: the simulation runs no forwards; drop one of them")
        levels = taken(SimulateOptions, dict(flags))  # the rest: the ranks' options, which a simulation has none of
        if trace is not None:
            trace_command(policy_path, TraceOptions(**trace_flags), levels)
        else:
            simulate_command(policy_path, levels)
        return
    profile = {k: flags.pop(k) for k in ("nproc_per_node", "device", "torch_threads", "timeout")}
    serve, policy = resolve_serve(policy_path, {**flags, "profile": profile}, trace)
    rank = serve_rank if trace is None else trace_rank
    sys.exit(start("serve-bench", functools.partial(rank, policy=policy), serve, torchrun))


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """`ppprof serve-bench`'s --trace options as click hands them, in one value (TRACE_FLAGS)."""

    trace: str | None
    length_scale: float
    time_scale: float
    """The Mooncake trace replayed, and its lengths' and arrival times' scales."""
    output_file: str | None
    """Where each arm's bench_serving-style line is appended."""
    trace_window: str | None
    cache_tokens: int | None
    output_details: bool
    """The window of the trace taken, the prefix cache's tokens, per-request arrays in the lines."""


TRACE_FLAGS = tuple(f.name for f in fields(TraceOptions))


@dataclass(frozen=True, slots=True)
class SimulateOptions:
    """The options of `ppprof serve-bench --simulate` as click hands them, in one value (a simulation runs no ranks:
    their options are not read)."""

    concurrency: str | None
    request_rate: str | None
    num_prompts: int | None
    spec: str | None
    strategies: str | None
    """The load levels (closed loops, Poisson rates), the prompts a level serves, their lengths, the arms."""
    pp_size: int | None
    async_depth: int
    seed: int
    """The pipeline's stages, its micro-batches in flight beyond them, the seed of the lengths and arrivals."""
    out: str | None
    """serving.json's path (None: beside the policy)."""


def trace_command(policy_path, trace: TraceOptions, opts: SimulateOptions) -> None:
    """`ppprof serve-bench --simulate --trace FILE`: every arm replays the trace's part on the policy's planning
    model; serving.json and (--output-file) one bench_serving-style JSON line an arm."""
    arms = parse_arms(opts.strategies)
    policy = load(policy_path)
    pp_size = default_pp_size(policy) if opts.pp_size is None else opts.pp_size
    require_int("--pp-size", pp_size, 1, MAX_STAGES)
    require_int("--async-depth", opts.async_depth, 0, MAX_ASYNC_DEPTH)
    cache_tokens, output_file = trace.cache_tokens, trace.output_file
    if cache_tokens is not None:
        require_int("--cache-tokens", cache_tokens, 0, MAX_TOKENS)
    check_output_file(output_file)
    part = read_trace(
        trace.trace,
        window_s=parse_window(trace.trace_window),
        num_prompts=opts.num_prompts,
        time_scale=trace.time_scale,
        length_scale=trace.length_scale,
        context_len=policy.settings.context_len,
    )
    runs = replay(policy, part, arms, pp_size, opts.async_depth, cache_tokens, trace.output_details)
    result = {
        "mode": "simulated trace",
        "pp_size": pp_size,
        "async_depth": opts.async_depth,
        "trace": part.to_dict(),
        "runs": [{k: v for k, v in run.items() if k != "details"} for run in runs],
    }
    path = write_result(Path(opts.out) if opts.out else Path(policy_path).with_name("serving.json"), result)
    if output_file:
        append_lines(Path(output_file), runs)
    click.echo(trace_text(result))
    click.echo(f"serving.json: {path}" + (f"; {output_file}: {len(runs)} lines appended" if output_file else ""))


def simulate_command(policy_path, opts: SimulateOptions) -> None:
    """`ppprof serve-bench --simulate`: every arm at every level on the policy's planning model, no ranks."""
    levels = parse_levels(opts.concurrency, opts.request_rate)
    arms = parse_arms(opts.strategies)
    policy = load(policy_path)
    workload = policy.report.workload
    workload = parse_prompt_spec(opts.spec, policy.settings.context_len) if opts.spec else Workload.from_dict(workload)
    plan = ServingPlan(
        tuple(levels),
        arms,
        workload,
        opts.num_prompts,
        default_pp_size(policy) if opts.pp_size is None else opts.pp_size,
        opts.async_depth,
        opts.seed,
    )
    result = simulate_levels(policy, plan)
    out = opts.out
    path = write_result(Path(out) if out else Path(policy_path).with_name("serving.json"), result)
    plots = write_plots(result, path.parent, f"{Path(policy_path).name}: simulated, {plan.pp_size} stages")
    click.echo(levels_text(result))
    click.echo(f"serving.json: {path}; plots: {', '.join(str(p) for p in plots)}")

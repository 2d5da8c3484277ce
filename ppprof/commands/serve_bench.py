"""`ppprof serve-bench`: a serving benchmark of arriving requests under each arm (ppprof.serving). This version runs
the simulation (`--simulate`) on the policy's planning model; the run through the ranks is being built."""

from __future__ import annotations

from pathlib import Path

import click

from ppprof.commands.options import with_options
from ppprof.config.workload import Workload, parse_prompt_spec
from ppprof.manifest import write_result
from ppprof.policy.planners import default_pp_size
from ppprof.policy.policy_file import load
from ppprof.serving.arms import SERVING_ARMS
from ppprof.serving.levels import ServingPlan, parse_arms, parse_levels, simulate_levels
from ppprof.serving.plots import write_plots
from ppprof.serving.report import levels_text

SERVE_BENCH_OPTIONS = (
    (("--simulate",), dict(is_flag=True), "Simulate on the policy's planning model, no ranks (required for now)."),
    (("--concurrency",), dict(metavar="LIST"), "Closed-loop levels: requests in flight, e.g. 1,2,4,8,16."),
    (("--request-rate",), dict(metavar="LIST"), "Poisson levels: requests a second, e.g. 0.5,1,2."),
    (("--num-prompts",), dict(type=int, default=64, show_default=True), "Prompts served at each level."),
    (
        ("--prompt-lens", "spec"),
        dict(metavar="SPEC"),
        "Prompt lengths drawn with their weights (tune's SPEC: 8192:3,32768:1 or a file)  [default: the policy's "
        "workload]",
    ),
    (("--strategies",), dict(), f"Comma-separated subset of {','.join(SERVING_ARMS)}. [all]"),
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
    (("--out",), dict(type=click.Path(dir_okay=False)), "serving.json's path  [default: serving.json beside POLICY]"),
)
"""The options of `ppprof serve-bench`, in the order --help shows them."""


@click.command(
    "serve-bench", epilog="Example: ppprof serve-bench results/my-run/policy.json --simulate --concurrency 1,2,4,8,16"
)
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False))
@with_options(*SERVE_BENCH_OPTIONS)
def serve_bench_command(
    policy_path, simulate, concurrency, request_rate, num_prompts, spec, strategies, pp_size, async_depth, seed, out
) -> None:
    """Serve arriving requests (closed-loop concurrency or Poisson rates) under each arm, as SGLang's PP scheduler
    batches them, and report per level and arm the input throughput, TTFT mean / p50 / p90 / p99, the stages' idle
    fraction, chunks per request and requests per batch. Writes serving.json, and beside it serving.png (throughput and
    mean TTFT against the load, an arm a line) and serving-ttft.png (the TTFT distribution at the heaviest level)."""
    levels = parse_levels(concurrency, request_rate)
    arms = parse_arms(strategies)
    if not simulate:
        raise ValueError("serve-bench runs the simulation only in this version: add --simulate")
    policy = load(policy_path)
    workload = policy.data.get("workload")
    workload = parse_prompt_spec(spec, policy.settings.context_len) if spec else Workload.from_dict(workload)
    plan = ServingPlan(
        tuple(levels),
        arms,
        workload,
        num_prompts,
        default_pp_size(policy) if pp_size is None else pp_size,
        async_depth,
        seed,
    )
    result = simulate_levels(policy, plan)
    path = write_result(Path(out) if out else Path(policy_path).with_name("serving.json"), result)
    plots = write_plots(result, path.parent, f"{Path(policy_path).name}: simulated, {plan.pp_size} stages")
    click.echo(levels_text(result))
    click.echo(f"serving.json: {path}; plots: {', '.join(str(p) for p in plots)}")

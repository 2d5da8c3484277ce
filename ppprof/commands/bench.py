"""`ppprof bench`: parse, resolve the bench's settings from the profile's run.json (ppprof.run.settings), then start
the job (ppprof.run.job)."""

from __future__ import annotations

import functools
import json
import sys

import click

from ppprof.bounds import ATTENTION_BACKENDS, DEVICES
from ppprof.commands.options import (
    TORCHRUN_PARAMS,
    TieredCommand,
    forward_trace_option,
    resolved_config_option,
    shown,
    timeout_option,
    torchrun_options,
    verbose_option,
    with_options,
)
from ppprof.config import BENCH_STRATEGIES, DEFAULT_STRATEGIES, BenchConfig
from ppprof.distributed.launch import TORCHRUN_OPTIONS
from ppprof.run.bench_job import bench_rank
from ppprof.run.checks import bench_world_check
from ppprof.run.job import JobFlags, start
from ppprof.run.settings import resolve_bench

PROFILES = "[the profile's]"


BENCH_OPTIONS = (
    (("--prompt-len", "prompt_lens"), dict(type=int, multiple=True), "Prompt length in tokens (repeatable)."),
    (
        ("--strategies",),
        dict(),
        f"Comma-separated subset of {','.join(BENCH_STRATEGIES)}. [{','.join(DEFAULT_STRATEGIES)}]",
    ),
    (
        ("--plans", "plans"),
        dict(),
        "JSON of extra chunk plans to run as arms plan-<name> (e.g. `ppprof tune "
        "--json` output); its prompt lengths are the default --prompt-len.",
    ),
    (
        ("--repeats",),
        dict(type=int),
        f"Prompts per strategy and prompt length, interleaved. {shown('repeats', settings=BenchConfig)}",
    ),
    (
        ("--pp-size", "--pp", "pp_size"),
        dict(type=int),
        f"Pipeline stages (--pp: the same); more than the profile's: replay only. {PROFILES}",
    ),
    (("--out",), dict(), "Run folder. [results/<time>-bench-<model>]"),
    forward_trace_option,
    (("--nproc-per-node",), dict(type=int), f"Ranks on this node. {PROFILES}"),
    (("--device",), dict(type=click.Choice(DEVICES)), PROFILES),
    (("--dtype",), dict(), PROFILES),
    (("--attention-backend",), dict(type=click.Choice(ATTENTION_BACKENDS)), PROFILES),
    (("--torch-threads",), dict(type=int), f"Intra-op threads per rank. {PROFILES}"),
    timeout_option,
    (
        ("--overwrite",),
        dict(is_flag=True, default=False),
        "Let --out name a folder that holds files: an older bench's results there are replaced.",
    ),
    torchrun_options,
    resolved_config_option,
    verbose_option,
)
"""The options of `ppprof bench`, in the order --help shows them."""
BENCH_ADVANCED = TORCHRUN_PARAMS | {
    "nproc_per_node",
    "device",
    "dtype",
    "attention_backend",
    "torch_threads",
    "timeout",
}
"""What --help-all alone lists: where and how the ranks run (the profile's by default) and torchrun's options."""


@click.command(
    "bench",
    cls=TieredCommand,
    advanced=BENCH_ADVANCED,
    epilog="Example: ppprof bench results/my-run/policy.json --prompt-len 8192",
)
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False), required=False)
@with_options(*BENCH_OPTIONS)
def bench(
    policy_path,
    prompt_lens,
    strategies,
    plans,
    repeats,
    pp_size,
    out,
    forward_trace,
    resolved_config,
    overwrite,
    **options,
) -> None:
    """Run real chunked prefills of synthetic prompts through the pipeline under each strategy (fixed, fixed-best,
    sglang, greedy, optimal) and compare measured TTFT with the policy's prediction. Writes bench.csv, bench.json
    and a timeline PNG per prompt length.

    Example: ppprof bench results/<run>/policy.json --prompt-len 8192 --prompt-len 32768 --pp 4
    """
    torchrun = {name: options.pop(name) for name, _ in TORCHRUN_OPTIONS}
    policy = None  # loaded where this process resolves the settings; a rank the launcher started loads it itself
    if resolved_config is not None:
        cfg = BenchConfig.from_dict(json.loads(resolved_config))
    elif policy_path is None:
        raise click.UsageError("Missing argument 'POLICY': give the policy.json of a profile")
    else:
        cfg, policy = resolve_bench(
            policy_path,
            {
                "profile": options,
                "strategies": strategies,
                "out": out,
                "pp_size": pp_size,
                "repeats": repeats,
                "prompt_lens": tuple(prompt_lens),
                "plans": plans,
                "forward_trace": forward_trace,
            },
        )
    sys.exit(
        start(
            "bench",
            functools.partial(bench_rank, overwrite=overwrite, policy=policy),
            cfg,
            torchrun,
            JobFlags(resolved=resolved_config is not None, overwrite=overwrite, world_check=bench_world_check(cfg)),
        )
    )

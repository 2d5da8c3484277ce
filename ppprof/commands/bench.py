"""`ppprof bench`: parse, resolve the bench's settings from the profile's run.json (ppprof.run.resolve), then start
the job (ppprof.run.job)."""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass

import click

from ppprof.bounds import ATTENTION_BACKENDS, DEVICES
from ppprof.commands.options import (
    TORCHRUN_PARAMS,
    TieredCommand,
    forward_trace_option,
    resolved_config_option,
    shown,
    taken,
    timeout_option,
    torchrun_options,
    verbose_option,
    with_options,
)
from ppprof.config import BENCH_STRATEGIES, DEFAULT_STRATEGIES, BenchConfig
from ppprof.distributed.launch import TORCHRUN_OPTIONS
from ppprof.run.bench_job import bench_rank
from ppprof.run.job import JobFlags, start
from ppprof.run.prelaunch import bench_world_check
from ppprof.run.resolve import resolve_bench

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


@dataclass(frozen=True, slots=True)
class BenchOptions:
    """`ppprof bench`'s own options as click hands them, in one value; the profile's (where and how the ranks run)
    and torchrun's stay flags."""

    prompt_lens: tuple[int, ...]
    strategies: str | None
    plans: str | None
    repeats: int | None
    pp_size: int | None
    """What is benched: the prompt lengths, the strategies, extra plans, the repeats, the stages."""
    out: str | None
    forward_trace: str | None
    overwrite: bool
    """Where it goes: the run folder, the forward trace, whether --out may hold files."""
    resolved_config: str | None
    """The settings the launcher hands a rank it started (RESOLVED_CONFIG); None in the command a user runs."""

    def bench_flags(self, profile: dict) -> dict:
        """What resolve_bench resolves BenchConfig from: these options and the profile's."""
        return {
            "profile": profile,
            "strategies": self.strategies,
            "out": self.out,
            "pp_size": self.pp_size,
            "repeats": self.repeats,
            "prompt_lens": tuple(self.prompt_lens),
            "plans": self.plans,
            "forward_trace": self.forward_trace,
        }


@click.command(
    "bench",
    cls=TieredCommand,
    advanced=BENCH_ADVANCED,
    epilog="Example: ppprof bench results/my-run/policy.json --prompt-len 8192",
)
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False), required=False)
@with_options(*BENCH_OPTIONS)
def bench(policy_path, **options) -> None:
    """Run real chunked prefills of synthetic prompts through the pipeline under each strategy (fixed, fixed-best,
    sglang, greedy, optimal) and compare measured TTFT with the policy's prediction. Writes bench.csv, bench.json
    and a timeline PNG per prompt length.

    Example: ppprof bench results/<run>/policy.json --prompt-len 8192 --prompt-len 32768 --pp 4
    """
    torchrun = {name: options.pop(name) for name, _ in TORCHRUN_OPTIONS}
    opts = taken(BenchOptions, options)  # what is left: the profile's options
    resolved_config, overwrite = opts.resolved_config, opts.overwrite
    policy = None  # loaded where this process resolves the settings; a rank the launcher started loads it itself
    if resolved_config is not None:
        cfg = BenchConfig.from_dict(json.loads(resolved_config))
    elif policy_path is None:
        raise click.UsageError("Missing argument 'POLICY': give the policy.json of a profile")
    else:
        cfg, policy = resolve_bench(policy_path, opts.bench_flags(options))
    sys.exit(
        start(
            "bench",
            functools.partial(bench_rank, overwrite=overwrite, policy=policy),
            cfg,
            torchrun,
            JobFlags(resolved=resolved_config is not None, overwrite=overwrite, world_check=bench_world_check(cfg)),
        )
    )

"""`ppprof profile`: the click command that starts a distributed job: resolve and check the settings before any rank
starts, then launch this node's ranks, or, started by torchrun, be one of them."""

from __future__ import annotations

import json
import os
import sys
from typing import Callable

import click

from ppprof.config import ATTENTION_BACKENDS, ProfileConfig
from ppprof.dist.launch import TORCHRUN_OPTIONS, in_worker, launch, num_nodes
from ppprof.probe.loop import FAULTS
from ppprof.run.options import check_before_launch, resolve_config, warnings
from ppprof.run.profile import profile_rank

RESOLVED_CONFIG = "--resolved-config"


def start(command: str, rank_main: Callable[[ProfileConfig, str | None], int], cfg: ProfileConfig, torchrun: dict,
          resolved: bool, fault: str | None) -> int:
    """Run `ppprof COMMAND` as a job: under torchrun this process is one rank (each rank checks the input before it
    joins the group, so each exits 2 alike and none waits); otherwise check once and launch this node's ranks, each
    running `ppprof COMMAND --resolved-config JSON`. Returns the exit code."""
    if in_worker():
        if not resolved:
            check_before_launch(cfg, int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_WORLD_SIZE", 1)),
                                torchrun)
        return rank_main(cfg, fault)
    world_size = num_nodes(torchrun.get("nnodes")) * cfg.nproc_per_node
    check_before_launch(cfg, world_size, cfg.nproc_per_node, torchrun)
    for line in warnings(cfg):
        click.echo(f"warning: {line}", err=True)
    worker_args = [command, RESOLVED_CONFIG, json.dumps(cfg.to_dict())] + (["--inject-fault", fault] if fault else [])
    return launch(cfg.nproc_per_node, torchrun, worker_args, job=command)


def torchrun_options(f):
    """Add torchrun's options (passed to the launcher unchanged) to a command."""
    for name, takes_value in reversed(TORCHRUN_OPTIONS):
        flag = "--" + name.replace("_", "-")
        if takes_value:
            f = click.option(flag, name, default=None, help=f"torchrun's {flag}.")(f)
        else:
            f = click.option(flag, name, is_flag=True, default=False, help=f"torchrun's {flag}.")(f)
    return f


@click.command("profile")
@click.option("--config", "config_path", type=click.Path(dir_okay=False), help="YAML file of settings (flags win).")
@click.option("--model", help="Preset name, YAML spec, or HuggingFace config.json / folder. [tiny-hybrid]")
@click.option("--num-layers", type=int, help="Keep the layer pattern with this many layers.")
@click.option("--nproc-per-node", type=int, help="Ranks on this node, one pipeline stage each. [2]")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), help="cpu (gloo) or cuda (NCCL). [cpu]")
@click.option("--dtype", help="float32, bfloat16 or float16 (or fp32, bf16, fp16). [bf16 on cuda, fp32 on cpu]")
@click.option("--base-chunk-size", type=int, help="Base chunk B; the sweep runs from 1.25 B down to ~B/128. [512]")
@click.option("--requests-per-probe", type=int, help="Synthetic prefill requests per probe, 8..128. [128]")
@click.option("--page-size", type=int, help="KV cache page size in tokens. [1]")
@click.option("--max-mamba-cache-size", type=int, help="Mamba state slots per stage. [128]")
@click.option("--max-running-requests", type=int, help="Request pool entries per stage. [128]")
@click.option("--max-total-tokens", type=int, help="KV cache slots per stage. [the longest probe request]")
@click.option("--context-len", type=int, help="Context length of the served model. [32768]")
@click.option("--prefix-lens", help="Prefix lengths of the prefix probes, e.g. 512,1024,2048. [B,2B,4B]")
@click.option("--warmup", type=int, help="Untimed warm-up forwards. [3]")
@click.option("--layer-partition", help="Layers per stage, e.g. 3,5. [even split]")
@click.option("--seed", type=int, help="Seed of the synthetic requests and weights. [0]")
@click.option("--out", help="Run folder. [results/<run-id>]")
@click.option("--fit/--no-fit", default=None, help="Fit and write policy.json and plots at the end. [--fit]")
@click.option("--attention-backend", type=click.Choice(ATTENTION_BACKENDS),
              help="auto (flashinfer on CUDA when installed, else sdpa), sdpa, flashinfer or reference. [auto]")
@torchrun_options
@click.option("--resolved-config", hidden=True, help="Internal: the launcher hands each rank the resolved settings.")
@click.option("--inject-fault", type=click.Choice(FAULTS), hidden=True, help="Testing only: a deliberate fault.")
def profile(config_path, resolved_config, inject_fault, **options) -> None:
    """Profile prefill chunks on every stage of a pipeline and write samples.csv, run.json and policy.json.

    Without torchrun it starts its own ranks (--nproc-per-node per node; torchrun's multi-node options work too).
    Started by torchrun (`torchrun --nproc-per-node 2 -m ppprof profile ...`) it runs as one rank.
    """
    torchrun = {name: options.pop(name) for name, _ in TORCHRUN_OPTIONS}
    if resolved_config is not None:
        cfg = resolve_config(None, json.loads(resolved_config))
    else:
        cfg = resolve_config(config_path, options)
    sys.exit(start("profile", profile_rank, cfg, torchrun, resolved_config is not None, inject_fault))

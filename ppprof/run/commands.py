"""`ppprof profile` and `ppprof bench`: the click commands that start distributed jobs: resolve and check the settings before any rank
starts, then launch this node's ranks, or, started by torchrun, be one of them."""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Callable

import click

from ppprof.bounds import ATTENTION_BACKENDS
from ppprof.config import BENCH_STRATEGIES, DESIGNS, BenchConfig, ProfileConfig
from ppprof.dist.launch import TORCHRUN_OPTIONS, in_worker, launch, num_nodes
from ppprof.policy.schema import load_policy
from ppprof.probe.loop import FAULTS
from ppprof.run.bench import bench_rank
from ppprof.run.options import CONFIG_FIELDS, check_before_launch, resolve_config, warnings
from ppprof.run.options import resume_config
from ppprof.run.profile import profile_rank
from ppprof.runfiles import LOCK_HELD_ENV, RUN_FILE, read_run_json, release_lock, take_lock

RESOLVED_CONFIG = "--resolved-config"
resolved_config_option = click.option(RESOLVED_CONFIG, hidden=True,
                                      help="Internal: the launcher hands each rank the resolved settings.")


def start(command: str, rank_main: Callable, settings, profile: ProfileConfig, torchrun: dict, resolved: bool,
          fault: str | None, world_check: Callable[[int], None] | None = None, *, overwrite: bool = False,
          resume: bool = False) -> int:
    """Run `ppprof COMMAND` as a job: under torchrun this process is one rank (each rank checks the input before it
    joins the group, so each exits 2 alike and none waits); otherwise check once, take the run folder's lock and
    launch this node's ranks, each running `ppprof COMMAND --resolved-config JSON`. `settings` is the job's config
    (ProfileConfig or BenchConfig), `profile` the profile settings in it; `world_check(world_size)` checks what
    depends on the ranks; `overwrite` lets --out hold files, `resume` finishes the run there. Returns the exit
    code."""
    if in_worker():
        if not resolved:
            world_size = int(os.environ["WORLD_SIZE"])
            (world_check or (lambda n: None))(world_size)
            local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
            # Across nodes a rank may start after rank 0 wrote into --out: rank 0 checks it (ppprof.run.profile).
            check_before_launch(profile, world_size, local, torchrun, overwrite, resume, folder=world_size == local)
        return rank_main(settings, fault)
    world_size = num_nodes(torchrun.get("nnodes")) * profile.nproc_per_node
    one_node = world_size == profile.nproc_per_node
    (world_check or (lambda n: None))(world_size)
    check_before_launch(profile, world_size, profile.nproc_per_node, torchrun, overwrite, resume, folder=one_node)
    for line in warnings(profile):
        click.echo(f"warning: {line}", err=True)
    worker_args = ([command, RESOLVED_CONFIG, json.dumps(settings.to_dict())] + (["--inject-fault", fault] if fault
                                                                                 else [])
                   + (["--resume", profile.out] if resume else []) + (["--overwrite"] if overwrite else []))
    if not profile.out or not one_node:  # rank 0 names a new folder, or checks and locks it for every node
        return launch(profile.nproc_per_node, torchrun, worker_args, job=command)
    Path(profile.out).mkdir(parents=True, exist_ok=True)
    take_lock(profile.out)
    os.environ[LOCK_HELD_ENV] = "1"  # the ranks inherit it: their launcher holds the lock
    try:
        return launch(profile.nproc_per_node, torchrun, worker_args, job=command)
    finally:
        release_lock(profile.out)


timeout_option = click.option(
    "--timeout", type=float, help="Seconds a rank waits on another at least before the run stops with \"rank N did "
    "not answer\"; more where requests are slow (20 x the slowest so far). [60]")


def torchrun_options(f):
    """Add torchrun's options (passed to the launcher unchanged) to a command."""
    for name, takes_value in reversed(TORCHRUN_OPTIONS):
        flag = "--" + name.replace("_", "-")
        if takes_value:
            f = click.option(flag, name, default=None, help=f"torchrun's {flag}.")(f)
        else:
            f = click.option(flag, name, is_flag=True, default=False, help=f"torchrun's {flag}.")(f)
    return f


@click.command("profile", epilog="Example: ppprof profile --model tiny-dense --out results/my-run")
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
@click.option("--prefix-lens", help="Prefix lengths of the prefix probes, e.g. 512,1024,2048. [log-spaced, B..context]")
@click.option("--num-prefix-lens", type=int, help="Default prefix lengths, log-spaced from B to the context. [6]")
@click.option("--warmup", type=int, help="Untimed warm-up forwards. [3]")
@click.option("--layer-partition", help="Layers per stage, e.g. 3,5. [even split]")
@click.option("--seed", type=int, help="Seed of the synthetic requests and weights. [0]")
@click.option("--out", help="Run folder. [results/<run-id>]")
@click.option("--fit/--no-fit", default=None, help="Fit and write policy.json and plots at the end. [--fit]")
@click.option("--attention-backend", type=click.Choice(ATTENTION_BACKENDS),
              help="auto (flashinfer on CUDA when installed, else sdpa), sdpa, flashinfer or reference. [auto]")
@click.option("--torch-threads", type=int, help="Intra-op threads per rank. [cores of the node / its ranks]")
@click.option("--design", type=click.Choice(DESIGNS),
              help="grid: the sweep and a probe per prefix length; adaptive: a small D-optimal design, then the "
                   "requests that most reduce the policy's uncertainty, until its table is stable. [grid]")
@click.option("--max-requests", type=int, help="Adaptive design: at most this many timed requests. [no limit]")
@click.option("--max-seconds", type=float, help="Adaptive design: stop adding probes after this much probing. "
                                                 "[no limit]")
@timeout_option
@click.option("--overwrite", is_flag=True, default=False,
              help="Let --out name a folder that holds files: an older run's results there are replaced.")
@click.option("--resume", "resume_dir", metavar="DIR",
              help="Finish the interrupted run in DIR from its last complete probe, with its recorded settings.")
@torchrun_options
@resolved_config_option
@click.option("--inject-fault", type=click.Choice(FAULTS), hidden=True, help="Testing only: a deliberate fault.")
def profile(config_path, resolved_config, inject_fault, overwrite, resume_dir, **options) -> None:
    """Profile prefill chunks on every stage of a pipeline and write samples.csv, run.json and policy.json.

    Without torchrun it starts its own ranks (--nproc-per-node per node; torchrun's multi-node options work too).
    Started by torchrun (`torchrun --nproc-per-node 2 -m ppprof profile ...`) it runs as one rank.
    """
    torchrun = {name: options.pop(name) for name, _ in TORCHRUN_OPTIONS}
    if resolved_config is not None:
        cfg = resolve_config(None, json.loads(resolved_config))
    elif resume_dir is not None:
        if options.get("out") is not None and Path(options["out"]) != Path(resume_dir):
            raise ValueError(f"--out {options['out']} with --resume {resume_dir}: a resumed run writes into the "
                             "folder it resumes; drop --out")
        if overwrite:
            raise ValueError(f"--overwrite with --resume {resume_dir}: a resumed run keeps the samples it has; drop "
                             "--overwrite (or start anew with --out DIR --overwrite)")
        cfg = resume_config(resume_dir, config_path, options)
    else:
        cfg = resolve_config(config_path, options)
    rank_main = functools.partial(profile_rank, resume=resume_dir is not None, overwrite=overwrite)
    sys.exit(start("profile", rank_main, cfg, cfg, torchrun, resolved_config is not None, inject_fault,
                   overwrite=overwrite, resume=resume_dir is not None))


def resolve_bench(policy_path: str, flags: dict) -> BenchConfig:
    """The bench's settings: the profile's (run.json beside the policy), the flags winning."""
    run_file = Path(policy_path).parent / RUN_FILE
    if not Path(policy_path).is_file():
        raise ValueError(f"policy file {policy_path} does not exist: give a policy.json written by `ppprof profile`")
    load_policy(policy_path)  # checked as `ppprof validate` checks it, before any rank starts
    if not run_file.is_file():
        raise ValueError(f"{run_file} does not exist: `ppprof bench` needs the run.json of the profile that wrote "
                         f"{policy_path} (the model, split and device come from it)")
    run = read_run_json(run_file)
    profile = {k: v for k, v in run["config"].items() if k in CONFIG_FIELDS}
    profile["torch_threads"] = run.get("torch_threads")  # measure under the profile's conditions
    profile.update({k: v for k, v in flags.pop("profile").items() if v is not None})
    profile["out"] = flags.get("out")
    profile = resolve_config(None, profile)
    strategies = flags.pop("strategies")
    strategies = tuple(s.strip() for s in strategies.split(",") if s.strip()) if strategies else BENCH_STRATEGIES
    if flags.get("plans") is not None:
        flags["plans"] = read_plans(flags["plans"])
        if not flags.get("prompt_lens") and isinstance(flags["plans"], dict):
            flags["prompt_lens"] = tuple(sorted(int(n) for n in flags["plans"] if n.isdigit()))
    stages = run.get("layer_partition") or [None] * run.get("world_size", 1)
    return BenchConfig(policy=str(policy_path), profile=profile, strategies=strategies,
                       profiled_stages=len(stages), **{k: v for k, v in flags.items() if v is not None})


def read_plans(path: str) -> dict:
    """The plans of a `--plans` file: `ppprof tune --json` output (its "plans") or {"<prompt_len>": {name: chunks}}."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ValueError(f"--plans file {path} does not exist: write it with `ppprof tune ... --json > {path}`") \
            from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"--plans file {path} is not readable JSON ({e.__class__.__name__}): give the JSON of "
                         f"`ppprof tune --json`") from None
    return data.get("plans", data) if isinstance(data, dict) else data


def bench_world_check(bench: BenchConfig) -> Callable[[int], None]:
    def check(world_size: int) -> None:
        if bench.num_stages % world_size:
            raise ValueError(f"--pp {bench.num_stages} is not a multiple of the {world_size} ranks: use a multiple of "
                             f"{world_size} (each rank runs --pp / ranks stages), or change --nproc-per-node")
    return check


@click.command("bench", epilog="Example: ppprof bench results/my-run/policy.json --prompt-len 8192")
@click.argument("policy_path", metavar="POLICY", type=click.Path(dir_okay=False), required=False)
@click.option("--prompt-len", "prompt_lens", type=int, multiple=True, help="Prompt length in tokens (repeatable).")
@click.option("--strategies", help=f"Comma-separated subset of {','.join(BENCH_STRATEGIES)}. [all]")
@click.option("--plans", "plans", help="JSON of extra chunk plans to run as arms plan-<name> (e.g. `ppprof tune "
              "--json` output); its prompt lengths are the default --prompt-len.")
@click.option("--repeats", type=int, help="Prompts per strategy and prompt length, interleaved. [5]")
@click.option("--pp", type=int, help="Pipeline stages; more than the ranks: replay only. [the profile's]")
@click.option("--out", help="Run folder. [results/<time>-bench-<model>]")
@click.option("--nproc-per-node", type=int, help="Ranks on this node. [the profile's]")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), help="[the profile's]")
@click.option("--dtype", help="[the profile's]")
@click.option("--attention-backend", type=click.Choice(ATTENTION_BACKENDS), help="[the profile's]")
@click.option("--torch-threads", type=int, help="Intra-op threads per rank. [the profile's]")
@timeout_option
@click.option("--overwrite", is_flag=True, default=False,
              help="Let --out name a folder that holds files: an older bench's results there are replaced.")
@torchrun_options
@resolved_config_option
def bench(policy_path, prompt_lens, strategies, plans, repeats, pp, out, resolved_config, overwrite,
          **options) -> None:
    """Run real chunked prefills of synthetic prompts through the pipeline under each strategy (fixed, fixed-best,
    sglang, greedy, optimal) and compare measured TTFT with the policy's prediction. Writes bench.csv, bench.json
    and a timeline PNG per prompt length.

    Example: ppprof bench results/<run>/policy.json --prompt-len 8192 --prompt-len 32768 --pp 4
    """
    torchrun = {name: options.pop(name) for name, _ in TORCHRUN_OPTIONS}
    if resolved_config is not None:
        cfg = BenchConfig.from_dict(json.loads(resolved_config))
    elif policy_path is None:
        raise click.UsageError("Missing argument 'POLICY': give the policy.json of a profile")
    else:
        cfg = resolve_bench(policy_path, {"profile": options, "strategies": strategies, "out": out, "pp": pp,
                                          "repeats": repeats, "prompt_lens": tuple(prompt_lens),
                                          "plans": plans})
    sys.exit(start("bench", functools.partial(bench_rank, overwrite=overwrite), cfg, cfg.profile, torchrun,
                   resolved_config is not None, None, bench_world_check(cfg), overwrite=overwrite))

"""`ppprof profile`: parse, resolve the settings once (ppprof.run.resolve), then start the job (ppprof.run.job)."""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import click

from ppprof.commands.dry_run import show_dry_run
from ppprof.commands.options import (
    TORCHRUN_PARAMS,
    TieredCommand,
    resolved_config_option,
    shown,
    sizing_options,
    timeout_option,
    torchrun_options,
    verbose_option,
    with_options,
)
from ppprof.config import DESIGNS
from ppprof.distributed.launch import TORCHRUN_OPTIONS
from ppprof.probe.loop import FAULTS
from ppprof.run.job import JobFlags, start
from ppprof.run.profile_job import profile_rank
from ppprof.run.resolve import resolve_config, resume_config

PROFILE_OPTIONS = (
    (("--model",), dict(), f"Preset name, YAML spec, or HuggingFace config.json / folder. {shown('model')}"),
    (("--num-layers",), dict(type=int), "Keep the layer pattern with this many layers."),
    (
        ("--nproc-per-node",),
        dict(type=int),
        "Ranks on this node; nnodes x nproc-per-node = pp-size x tp-size. [pp-size x tp-size]",
    ),
    (("--pp-size",), dict(type=int), "Pipeline stages (SGLang's --pp-size). [the ranks / tp-size; 2 on one node]"),
    (
        ("--tp-size",),
        dict(type=int),
        f"Tensor-parallel ranks of each stage, adjacent on one node (SGLang's --tp-size). {shown('tp_size')}",
    ),
    (("--dtype",), dict(), "float32, bfloat16 or float16 (or fp32, bf16, fp16). [bf16 on cuda, fp32 on cpu]"),
    sizing_options,
    (
        ("--num-prefix-lens",),
        dict(type=int),
        f"Default prefix lengths, log-spaced from B to the context. {shown('num_prefix_lens')}",
    ),
    (("--warmup",), dict(type=int), f"Untimed warm-up forwards. {shown('warmup')}"),
    (("--layer-partition",), dict(), "Layers per stage, e.g. 3,5. [even split]"),
    (("--seed",), dict(type=int), f"Seed of the synthetic requests and weights. {shown('seed')}"),
    (("--out",), dict(), "Run folder. [results/<run-id>]"),
    (
        ("--overhead-repeats",),
        dict(type=int),
        "Rounds of fixed plans at B/4, B and 2B run pipelined before the probes to measure the per-chunk "
        f"pipeline overhead; 0: not measured. {shown('overhead_repeats')}",
    ),
    (
        ("--packed-forwards",),
        dict(type=int),
        "Timed forwards of 2 to 8 requests' chunks packed in one, after the probes, to score the additive "
        f"latency of a packed forward; 0: none. {shown('packed_forwards')}",
    ),
    (("--fit/--no-fit",), dict(default=None), f"Fit and write policy.json and plots at the end. {shown('fit')}"),
    (("--torch-threads",), dict(type=int), "Intra-op threads per rank. [cores of the node / its ranks]"),
    (
        ("--design",),
        dict(type=click.Choice(DESIGNS)),
        "adaptive: a small D-optimal design, then the requests that most reduce the uncertainty of the policy's "
        "decision, until its status is sure and its tables stable; grid: the sweep and a probe per prefix length. "
        f"{shown('design')}",
    ),
    (
        ("--max-requests",),
        dict(type=int),
        "Adaptive design: at most this many timed requests. [as many as the grid design runs]",
    ),
    (("--max-seconds",), dict(type=float), "Adaptive design: stop adding probes after this much probing. [no limit]"),
    (
        ("--prompt-lens",),
        dict(),
        "Workload the policy's history-only table and status are chosen on (8192:3,32768:1 "
        "or a file, as `ppprof tune` takes them). [log-spaced over the profiled domain]",
    ),
    (
        ("--min-gain",),
        dict(type=float),
        "Least predicted gain of the prompt-aware rule over the best fixed chunk "
        f"for a dynamic policy. {shown('min_gain')}",
    ),
    timeout_option,
    (
        ("--overwrite",),
        dict(is_flag=True, default=False),
        "Let --out name a folder that holds files: an older run's results there are replaced.",
    ),
    (
        ("--resume", "resume_dir"),
        dict(metavar="DIR"),
        "Finish the interrupted run in DIR from its last complete probe, with its recorded settings.",
    ),
    (
        ("--dry-run",),
        dict(is_flag=True, default=False),
        "Start no rank: build every rank's stage at its real size on meta tensors, run the largest probe request "
        "through it, and print per rank its parameters, weights, pools, activation peak and collectives.",
    ),
    (
        ("--device-memory",),
        dict(),
        "With --dry-run: each device's memory (80GiB, 141GB, or cuda for this machine's GPU); a layout with a "
        "rank that does not fit is refused, naming the smallest that fits.",
    ),
    (("--json", "as_json"), dict(is_flag=True, default=False), "With --dry-run: print one JSON object."),
    torchrun_options,
    resolved_config_option,
    (("--inject-fault",), dict(type=click.Choice(FAULTS), hidden=True), "Testing only: a deliberate fault."),
    verbose_option,
)
"""The options of `ppprof profile`, in the order --help shows them."""

PROFILE_ADVANCED = TORCHRUN_PARAMS | {
    "nproc_per_node",
    "requests_per_probe",
    "page_size",
    "max_probe_chunk_multiple",
    "max_mamba_cache_size",
    "max_running_requests",
    "max_total_tokens",
    "prefix_lens",
    "attention_backend",
    "num_prefix_lens",
    "warmup",
    "layer_partition",
    "seed",
    "overhead_repeats",
    "packed_forwards",
    "fit",
    "torch_threads",
    "min_gain",
    "timeout",
    "device_memory",
    "as_json",
}
"""What --help-all alone lists: measurement internals, the pools' sizes, torchrun's options, the dry run's details."""


@click.command(
    "profile",
    cls=TieredCommand,
    advanced=PROFILE_ADVANCED,
    epilog="Example: ppprof profile --model tiny-dense --out results/my-run\n\n"
    "Example: ppprof profile --dry-run --model config.json --pp-size 4 --tp-size 8 --device-memory 80GiB",
)
@with_options(*PROFILE_OPTIONS)
def profile(**options) -> None:
    """Profile prefill chunks on every stage of a pipeline and write samples.csv, run.json and policy.json.

    Without torchrun it starts its own ranks (--nproc-per-node per node, by default --pp-size x --tp-size;
    torchrun's multi-node options work too). Started by torchrun (`torchrun --nproc-per-node 2 -m ppprof profile
    ...`) it runs as one rank. The ranks form a (pp, tp) mesh: rank = stage x tp-size + TP rank.
    """
    given = ProfileFlags.of(options)
    if given.dry_run or given.device_memory is not None or given.as_json:
        check_dry_run_flags(given)
        cfg = resolve_config(given.config_path, given.settings)
        return show_dry_run(cfg, given.device_memory, given.as_json, given.torchrun.get("nnodes"))
    resume = given.resume_dir is not None
    if given.resolved_config is not None:
        cfg = resolve_config(None, json.loads(given.resolved_config))
    elif resume:
        check_resume_flags(given.resume_dir, given.settings.get("out"), given.overwrite)
        cfg = resume_config(given.resume_dir, given.config_path, given.settings)
    else:
        cfg = resolve_config(given.config_path, given.settings)
    rank_main = functools.partial(profile_rank, resume=resume, overwrite=given.overwrite)
    flags = JobFlags(
        resolved=given.resolved_config is not None, fault=given.inject_fault, overwrite=given.overwrite, resume=resume
    )
    sys.exit(start("profile", rank_main, cfg, given.torchrun, flags))


@dataclass(frozen=True, slots=True)
class ProfileFlags:
    """`ppprof profile`'s options, split once: what selects the run (--config, --resolved-config, --inject-fault,
    --overwrite, --resume, the dry run's --dry-run, --device-memory and --json), torchrun's options, and the
    settings (`settings`: the flags ppprof.run.resolve resolves, as given)."""

    config_path: str | None
    resolved_config: str | None
    inject_fault: str | None
    overwrite: bool
    resume_dir: str | None
    dry_run: bool
    device_memory: str | None
    as_json: bool
    torchrun: dict
    settings: dict

    @classmethod
    def of(cls, options: dict) -> ProfileFlags:
        settings = dict(options)
        torchrun = {name: settings.pop(name) for name, _ in TORCHRUN_OPTIONS}
        own = {name: settings.pop(name) for name in RUN_FLAGS}
        return cls(**own, torchrun=torchrun, settings=settings)


RUN_FLAGS = (
    "config_path",
    "resolved_config",
    "inject_fault",
    "overwrite",
    "resume_dir",
    "dry_run",
    "device_memory",
    "as_json",
)
"""ProfileFlags' own fields: the options that are not settings."""


def check_dry_run_flags(given: ProfileFlags) -> None:
    """--device-memory and --json go with --dry-run, which resumes nothing."""
    if not given.dry_run:
        flag = "--device-memory" if given.device_memory is not None else "--json"
        raise ValueError(f"{flag} is a setting of the dry run: add --dry-run")
    if given.resume_dir is not None:
        raise ValueError(f"--dry-run with --resume {given.resume_dir}: a dry run starts no rank; drop --resume")


def check_resume_flags(resume_dir: str, out: str | None, overwrite: bool) -> None:
    """--resume writes into the folder it resumes and keeps its samples: --out elsewhere and --overwrite are refused."""
    if out is not None and Path(out) != Path(resume_dir):
        raise ValueError(
            f"--out {out} with --resume {resume_dir}: a resumed run writes into the folder it resumes; drop --out"
        )
    if overwrite:
        raise ValueError(
            f"--overwrite with --resume {resume_dir}: a resumed run keeps the samples it has; drop "
            "--overwrite (or start anew with --out DIR --overwrite)"
        )

"""`ppprof profile`: resolve and check the settings (flags > --config YAML > defaults) before any rank starts, then
launch the ranks, or, started by torchrun, be one of them."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path

import click
import yaml

from ppprof.config import ProfileConfig
from ppprof.dist.launch import TORCHRUN_OPTIONS, launch, num_nodes
from ppprof.specs.partition import parse_partition, split_layers
from ppprof.probe.loop import FAULTS

CONFIG_FIELDS = {f.name for f in dataclasses.fields(ProfileConfig)}


def read_config_file(path: str) -> dict:
    """Settings from a YAML file; keys are ProfileConfig fields (dashes or underscores)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise ValueError(f"--config {path}: cannot read it ({e.strerror}); give an existing YAML file") from None
    except yaml.YAMLError as e:
        raise ValueError(f"--config {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    data = data or {}
    if not isinstance(data, dict):
        raise ValueError(f"--config {path} must hold a mapping of settings, e.g. 'base_chunk_size: 512'")
    out = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in CONFIG_FIELDS:
            raise ValueError(f"--config {path}: unknown setting {key!r}; known: {', '.join(sorted(CONFIG_FIELDS))}")
        out[name] = value
    return out


def resolve_config(config_path: str | None, flags: dict) -> ProfileConfig:
    merged = read_config_file(config_path) if config_path else {}
    merged.update({k: v for k, v in flags.items() if v is not None})
    for key in ("layer_partition", "prefix_lens"):
        value = merged.get(key)
        if isinstance(value, (str, int)):
            merged[key] = parse_partition(str(value)) if key == "layer_partition" else _int_list(str(value), key)
        if merged.get(key) is not None:
            merged[key] = tuple(int(v) for v in merged[key])
    try:
        return ProfileConfig(**merged)
    except TypeError as e:  # a YAML value of the wrong type
        raise ValueError(f"bad setting: {e}") from None


def _int_list(text: str, key: str) -> list[int]:
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ValueError(f"--{key.replace('_', '-')} {text!r} must be comma-separated integers, e.g. 512,1024") from None


def check_output_folder(out: str | None) -> None:
    """The run folder (or, by default, results/) can be created and written."""
    path = Path(out) if out else Path("results")
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out or path}: exists and is not a folder; give a folder path")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out or path}: {parent} is not a writable folder; choose another --out")


def check_before_launch(cfg: ProfileConfig, world_size: int, local_ranks: int) -> None:
    """What can be checked without any rank: the output folder, the model resolves and splits over the stages, the
    device exists."""
    from ppprof.specs import load_spec

    check_output_folder(cfg.out)
    spec = load_spec(cfg.model, num_layers=cfg.num_layers, dtype=cfg.dtype)
    split_layers(spec.num_layers, world_size, cfg.layer_partition)
    if cfg.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("--device cuda: no CUDA device is visible; use --device cpu")
        if torch.cuda.device_count() < local_ranks:
            raise ValueError(f"{local_ranks} ranks on this node exceed the {torch.cuda.device_count()} visible GPUs: "
                             "one rank a GPU; lower --nproc-per-node")


def _torchrun_options(f):
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
@_torchrun_options
@click.option("--resolved-config", hidden=True, help="Internal: the launcher hands each rank the resolved settings.")
@click.option("--inject-fault", type=click.Choice(FAULTS), hidden=True, help="Testing only: a deliberate fault.")
def profile(config_path, resolved_config, inject_fault, **options) -> None:
    """Profile prefill chunks on every stage of a pipeline and write samples.csv, run.json and policy.json.

    Without torchrun it starts its own ranks (--nproc-per-node per node; torchrun's multi-node options work too).
    Started by torchrun (`torchrun --nproc-per-node 2 -m ppprof profile ...`) it runs as one rank.
    """
    from ppprof.dist.worker import in_worker, work

    torchrun = {name: options.pop(name) for name, _ in TORCHRUN_OPTIONS}
    if resolved_config is not None:
        cfg = resolve_config(None, json.loads(resolved_config))
    else:
        cfg = resolve_config(config_path, options)
    if in_worker():
        # Under torchrun every rank checks before joining the process group: each exits 2 alike, none waits.
        if resolved_config is None:
            check_before_launch(cfg, int(os.environ["WORLD_SIZE"]), int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
        sys.exit(work(cfg, fault=inject_fault))
    world_size = num_nodes(torchrun.get("nnodes")) * cfg.nproc_per_node
    check_before_launch(cfg, world_size, cfg.nproc_per_node)
    sys.exit(launch(cfg, torchrun, fault=inject_fault))

"""Settings of a distributed job, resolved and checked before any rank starts: flags > --config YAML > defaults;
the output folder, the model and its split over the stages, and the device."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import yaml

from ppprof.config import ProfileConfig
from ppprof.model.attention_kernels import resolve_attention_backend
from ppprof.specs import load_spec, parse_partition, split_layers

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


def check_before_launch(cfg: ProfileConfig, world_size: int, local_ranks: int,
                        torchrun: dict | None = None) -> None:
    """What can be checked without any rank: the output folder, the model resolves and splits over the stages, the
    device exists, the attention backend runs there, and the start method suits it."""
    check_output_folder(cfg.out)
    spec = load_spec(cfg.model, num_layers=cfg.num_layers, dtype=cfg.dtype)
    split_layers(spec.num_layers, world_size, cfg.layer_partition)
    resolve_attention_backend(cfg.attention_backend, cfg.device)
    if cfg.device == "cuda":
        check_cuda(local_ranks, (torchrun or {}).get("start_method"))


def warnings(cfg: ProfileConfig) -> list[str]:
    """Settings that run but do not measure what a server does, one line each."""
    out = []
    if cfg.max_mamba_cache_size < cfg.requests_per_probe:
        out.append(f"--max-mamba-cache-size {cfg.max_mamba_cache_size} is below --requests-per-probe "
                   f"{cfg.requests_per_probe}: a probe's Mamba slots cannot be taken in one grouped window (where the "
                   "model has Mamba layers), so every request takes its slot one by one; raise it to "
                   f"{cfg.requests_per_probe} to profile the grouped path")
    return out


def check_cuda(local_ranks: int, start_method: str | None) -> None:
    """CUDA is visible with a GPU per local rank, and the ranks are not forked from a process that may hold CUDA."""
    if start_method == "fork":
        raise ValueError("--start-method fork cannot be used with --device cuda: a forked child cannot use CUDA "
                         "once the parent touched it; use spawn (the default)")
    import torch  # only here: input errors should not wait for torch

    if not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible; use --device cpu")
    if torch.cuda.device_count() < local_ranks:
        raise ValueError(f"{local_ranks} ranks on this node exceed the {torch.cuda.device_count()} visible GPUs: "
                         "one rank a GPU; lower --nproc-per-node")

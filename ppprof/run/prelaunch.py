"""What is checked before any rank starts, beyond the settings' own checks (ppprof.config): the output folder, the
master port, the adaptive design, the model and its split over the stages, the device and the start method, and
whether this node's stages fit in its memory (ppprof.run.memory_check)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from pathlib import Path

from ppprof.adaptive import check as check_adaptive_design
from ppprof.config import BenchConfig, ProfileConfig
from ppprof.config.workload import parse_prompt_spec
from ppprof.distributed.coords import mesh_problem
from ppprof.distributed.launch import in_worker
from ppprof.model.attention_kernels import resolve_attention_backend
from ppprof.run.memory_check import check_memory
from ppprof.runfiles import RunFolder, check_lock
from ppprof.specs import load_spec, split_layers
from ppprof.specs.tp import check_tp


def check_output_folder(out: str | None, overwrite: bool = False, resume: bool = False, folder: bool = True) -> None:
    """The run folder (or, by default, results/) can be created and written and (unless not `folder`) no live run
    holds it, and it holds no files unless `overwrite` (replace its run) or `resume` (finish its run)."""
    path = Path(out) if out else Path("results")
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out or path}: exists and is not a folder; give a folder path")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out or path}: {parent} is not a writable folder; choose another --out")
    if not out or not path.is_dir() or not folder:
        return
    check_lock(path)
    held = sorted(p.name for p in path.iterdir() if p != RunFolder(path).lock)
    if held and not (overwrite or resume):
        shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        raise ValueError(
            f"--out {out} is not empty (it holds {shown}): choose a new folder, add --overwrite to "
            f"replace its run, or finish an interrupted run with --resume {out}"
        )


def check_before_launch(
    cfg: ProfileConfig,
    world_size: int,
    local_ranks: int,
    torchrun: dict | None = None,
    overwrite: bool = False,
    resume: bool = False,
    folder: bool = True,
) -> None:
    """What can be checked without any rank: the output folder (check_output_folder; what it holds only where
    `folder`), the ranks form a pp_size x tp_size mesh with whole TP groups on a node, the model splits over the TP
    ranks (ppprof.specs.tp) and its layers over the stages, the device exists, the attention backend runs there,
    the start method suits it, the policy's workload reads, and this node's stages fit in its memory
    (check_memory)."""
    check_output_folder(cfg.job.out, overwrite, resume, folder)
    check_master_port(torchrun or {})
    check_adaptive_design(cfg)
    if (
        cfg.fit.prompt_lens is not None and cfg.fit.fit
    ):  # the fit at the end reads it: a bad workload fails now, not then
        parse_prompt_spec(cfg.fit.prompt_lens, cfg.probes.context_len)
    problem = mesh_problem(world_size, cfg.parallelism.tp_size, cfg.parallelism.pp_size, local_ranks)
    if problem:
        raise ValueError(problem)
    spec = load_spec(cfg.model.model, num_layers=cfg.model.num_layers, dtype=cfg.model.dtype)
    check_tp(spec, cfg.parallelism.tp_size)
    pp_size = world_size // cfg.parallelism.tp_size
    split_layers(spec.num_layers, pp_size, cfg.parallelism.layer_partition)
    resolve_attention_backend(cfg.job.attention_backend, cfg.job.device)
    if cfg.job.device == "cuda":
        check_cuda(local_ranks, (torchrun or {}).get("start_method"))
    check_memory(cfg, world_size, local_ranks, torchrun, spec=spec)  # per rank: its stage as its TP rank holds it


LOCAL_HOSTS = (None, "", "localhost", "127.0.0.1", "::1", "0.0.0.0")


MAX_PORT = 65535


def check_master_port(torchrun: dict) -> None:
    """--master-port is a port number and, where this launcher's node 0 hosts the rendezvous store on this host, free
    (else every rank fails later on a bind error). Not under torchrun, which holds the port itself."""
    port = torchrun.get("master_port")
    if port is None or in_worker():
        return
    try:
        number = int(str(port))
    except ValueError:
        number = -1
    if not 1 <= number <= MAX_PORT:
        raise ValueError(f"--master-port {port} must be a port number in 1..{MAX_PORT}")
    if torchrun.get("master_addr") not in LOCAL_HOSTS or str(torchrun.get("node_rank") or 0) != "0":
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store binds it
        try:
            sock.bind(("", number))
        except OSError as e:
            raise ValueError(
                f"--master-port {number} is in use on this host ({e.strerror}): choose a free port, or "
                "leave --master-port out for a one-node run"
            ) from None


def warnings(cfg: ProfileConfig) -> list[str]:
    """Settings that run but do not measure what a server does, one line each."""
    out = []
    if cfg.pools.max_mamba_cache_size < cfg.probes.requests_per_probe:
        out.append(
            f"--max-mamba-cache-size {cfg.pools.max_mamba_cache_size} is below --requests-per-probe "
            f"{cfg.probes.requests_per_probe}: a probe's Mamba slots cannot be taken in one grouped window (where the "
            "model has Mamba layers), so every request takes its slot one by one; raise it to "
            f"{cfg.probes.requests_per_probe} to profile the grouped path"
        )
    return out


def check_cuda(local_ranks: int, start_method: str | None) -> None:
    """CUDA is visible with a GPU per local rank, and the ranks are not forked from a process that may hold CUDA."""
    if start_method == "fork":
        raise ValueError(
            "--start-method fork cannot be used with --device cuda: a forked child cannot use CUDA "
            "once the parent touched it; use spawn (the default)"
        )
    import torch  # only here: input errors should not wait for torch

    if not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible; use --device cpu")
    if torch.cuda.device_count() < local_ranks:
        raise ValueError(
            f"{local_ranks} ranks on this node exceed the {torch.cuda.device_count()} visible GPUs: "
            "one rank a GPU; lower --nproc-per-node"
        )


def bench_world_check(bench: BenchConfig) -> Callable[[int], None]:
    def check(world_size: int) -> None:
        tp = bench.profile.parallelism.tp_size
        if world_size % tp:
            return  # check_before_launch names the mesh that does not fit
        ranks = world_size // tp  # the pipeline's stages on ranks: every TP group one
        if bench.pp_size % ranks:
            raise ValueError(
                f"--pp-size {bench.pp_size} is not a multiple of the {ranks} stages the ranks run "
                f"({world_size} ranks over --tp-size {tp}): use a multiple of {ranks} (each runs "
                "--pp-size / stages of the pipeline), or change --nproc-per-node"
            )

    return check

"""One rank of a profile: join the process group, build this rank's stage and cache, run the probes in lockstep
with the other ranks; rank 0 collects every stage's timings and writes the run folder."""

from __future__ import annotations

import datetime as _dt
import logging
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ppprof.config import ProfileConfig
from ppprof.dist.pipe import Pipe
from ppprof.model.stage import Stage, build_stage_cache
from ppprof.specs.partition import split_layers
from ppprof.probe.malloc import steady_malloc
from ppprof.probe.loop import ProbeRunner, ProfileError, stop_if_any_failed
from ppprof.probe.output import default_run_dir, git_revision, hardware, samples_frame, write_run_json, write_samples
from ppprof.probe.synth import make_probes, warmup_requests
from ppprof.runfiles import RUN_FILE, SAMPLES_FILE, stage_column
from ppprof.specs import load_spec
from ppprof.specs.dtypes import AUTO_DTYPE_CPU, AUTO_DTYPE_GPU

log = logging.getLogger("ppprof")


def in_worker() -> bool:
    """True when started by torchrun or torch's elastic launcher (the rank's environment is set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def setup_logging(rank: int, level: int = logging.INFO) -> None:
    fmt = logging.Formatter(f"[rank {rank}] %(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    root = logging.getLogger("ppprof")
    root.setLevel(level)
    root.handlers.clear()
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(fmt)
    root.addHandler(h)
    root.propagate = False


def add_log_file(path: Path) -> None:
    root = logging.getLogger("ppprof")
    h = logging.FileHandler(path)
    h.setFormatter(root.handlers[0].formatter)
    root.addHandler(h)


def resolve_dtype(cfg: ProfileConfig, spec_dtype: str | None) -> torch.dtype:
    """--dtype, else the spec's, else bf16 on GPU and fp32 on CPU (all names already normalised)."""
    return getattr(torch, cfg.dtype or spec_dtype or (AUTO_DTYPE_GPU if cfg.device == "cuda" else AUTO_DTYPE_CPU))


def work(cfg: ProfileConfig, fault: str | None = None) -> int:
    """The body of one rank. Returns the process exit code (0, or 1 when the profile failed on any rank)."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    setup_logging(rank)
    if cfg.device == "cpu" and not steady_malloc():
        log.warning("could not fix malloc's thresholds (not glibc?): CPU timings may be noisier")
    if cfg.device == "cuda":
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=_dt.timedelta(seconds=int(os.environ.get("PPPROF_DIST_TIMEOUT", 600))))
    try:
        return _profile(cfg, rank, world_size, device, backend, fault)
    except ProfileError as e:
        log.error("%s", e)
        print(f"error: [rank {rank}] {e}", file=sys.stderr, flush=True)
        return 1
    finally:
        dist.destroy_process_group()


def _profile(cfg: ProfileConfig, rank: int, world_size: int, device: torch.device, backend: str,
             fault: str | None) -> int:
    t_start = time.perf_counter()
    spec = load_spec(cfg.model, num_layers=cfg.num_layers, dtype=cfg.dtype)
    dtype = resolve_dtype(cfg, spec.dtype)
    ranges = split_layers(spec.num_layers, world_size, cfg.layer_partition)
    layer_ids = ranges[rank]
    pipe = Pipe(rank=rank, world_size=world_size, device=device, hidden_size=spec.hidden_size, dtype=dtype)

    # Rank 0 names the run folder and synthesizes the probes; every rank gets both from it. Failures up to the first
    # probe are agreed on like failures inside it, so that no rank waits in a collective for one that has died.
    run_dir, probes, error = None, None, None
    if rank == 0:
        try:
            run_dir = Path(cfg.out) if cfg.out else default_run_dir(cfg.model)
            run_dir.mkdir(parents=True, exist_ok=True)
            probes = make_probes(cfg)
        except Exception as e:
            error = f"cannot prepare the run folder {run_dir}: {e}"
    run_dir, probes = pipe.broadcast((str(run_dir), probes))
    stop_if_any_failed(pipe, error)
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        add_log_file(run_dir / f"rank{rank}.log")
    except OSError as e:
        error = f"cannot write the log into {run_dir}: {e}"
    stop_if_any_failed(pipe, error)
    log.info("stage %d/%d: layers %d..%d (%s) of %s on %s, %s, backend %s, %d threads", rank, world_size, layer_ids.start,
             layer_ids.stop - 1, spec.pattern[layer_ids.start:layer_ids.stop], spec.name, device,
             str(dtype).removeprefix("torch."), backend, torch.get_num_threads())

    stage = cache = None
    try:
        stage = Stage(spec, layer_ids, dtype=dtype, device=device, seed=cfg.seed)
        stage.eval()
        cache = build_stage_cache(spec, layer_ids, kv_slots=cfg.kv_tokens, page_size=cfg.page_size,
                                  mamba_slots=cfg.max_mamba_cache_size, max_requests=cfg.max_running_requests,
                                  max_context_len=cfg.context_len, dtype=dtype, device=device)
    except (RuntimeError, ValueError, MemoryError) as e:  # e.g. out of memory for the weights or the pools
        error = f"cannot build stage {rank} (layers {layer_ids.start}..{layer_ids.stop - 1}): {type(e).__name__}: {e}"
    stop_if_any_failed(pipe, error)
    pool_mib = [0.0 if p is None else p.nbytes() / 2**20 for p in (cache.kv_pool, cache.mamba_pool)]
    log.info("pools: KV %.1f MiB (%d slots, page %d), Mamba %.1f MiB (%s slots), %d request entries", pool_mib[0],
             cache.kv_alloc.size, cfg.page_size, pool_mib[1],
             "no" if cache.mamba_alloc is None else cache.mamba_alloc.size, cfg.max_running_requests)
    runner = ProbeRunner(stage=stage, cache=cache, pipe=pipe, seed=cfg.seed, fault=fault)

    num_timed = sum(len(p.requests) for p in probes)
    bar = None
    if rank == 0:
        from tqdm import tqdm
        bar = tqdm(total=num_timed, desc="profile", unit="req", file=sys.stderr, disable=None, dynamic_ncols=True)
    t_probes = time.perf_counter()
    warmup = warmup_requests(probes, cfg.warmup)
    runner.warm_up(warmup)
    stage_ms, e2e_ms = [], []
    for probe in probes:
        timings = runner.run_probe(probe, on_request=bar.update if bar is not None else None)
        stage_ms.append(pipe.all_gather(timings.stage_ms))  # [stage][request]
        e2e_ms.append(timings.e2e_ms)
        log.info("probe %d (%s, %d requests, prefix %d): pools back to full capacity", probe.index, probe.kind,
                 len(probe.requests), probe.requests[0].prefix_len)
    probe_wall_s = time.perf_counter() - t_probes
    forward_tokens = pipe.all_gather(runner.forward_tokens)
    if bar is not None:
        bar.close()
    if rank != 0:
        return 0

    frame = samples_frame(probes, stage_ms, e2e_ms)
    write_samples(run_dir / SAMPLES_FILE, frame)
    wall_s = time.perf_counter() - t_start
    write_run_json(
        run_dir / RUN_FILE,
        config=cfg.to_dict(), model=spec.to_dict(), hardware=hardware(device), torch_version=torch.__version__,
        backend=backend, world_size=world_size, layer_partition=[len(r) for r in ranges],
        git_revision=git_revision(), dtype=str(dtype).removeprefix("torch."),
        profile_wall_s=round(wall_s, 3), probe_wall_s=round(probe_wall_s, 3),
        forward_tokens=int(forward_tokens[0]), forward_tokens_per_stage=[int(t) for t in forward_tokens],
        timed_requests=num_timed, warmup_requests=len(warmup), warmup_tokens=sum(r.chunk_len for r in warmup),
    )
    _log_summary(frame, world_size, wall_s, forward_tokens[0], run_dir)
    if cfg.fit:
        from ppprof.fit import fit_run
        policy_path = fit_run(run_dir)
        log.info("policy: %s", policy_path)
    return 0


def _log_summary(frame, world_size: int, wall_s: float, forward_tokens: int, run_dir: Path) -> None:
    sweep = frame[frame["kind"] == "sweep"]
    big, small = sweep.loc[sweep["chunk_len"].idxmax()], sweep.loc[sweep["chunk_len"].idxmin()]
    for s in range(world_size):
        col = stage_column(s)
        log.info("stage %d: chunk %d -> %.3f ms, chunk %d -> %.3f ms", s, big["chunk_len"], big[col],
                 small["chunk_len"], small[col])
    log.info("profile wall time %.2f s, %d forward tokens a stage; wrote %s", wall_s, forward_tokens, run_dir)

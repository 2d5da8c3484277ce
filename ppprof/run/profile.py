"""The profile job, one rank's view: prepare the run folder and the probes, build the stage, warm up, run the probes
in lockstep, measure the per-chunk pipeline overhead, then (rank 0) write samples.csv and run.json and fit the
policy."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ppprof.adaptive import initial_probes
from ppprof.adaptive.loop import probe_sequence
from ppprof.adaptive.step import DesignState, design_record
from ppprof.bench.executor import WARMUP_REPEAT, BenchPrompt, BenchStage, PromptRunner
from ppprof.bench.overhead import overhead_chunk_sizes, overhead_plans, pipeline_overhead
from ppprof.config import ProfileConfig
from ppprof.distributed.agree import RunError, agreed
from ppprof.distributed.stop import Stop
from ppprof.fit.plots import CHUNKS_PLOT, FIT_PLOT
from ppprof.manifest import git_revision, write_manifest
from ppprof.model.stage import Stage, build_stage_cache
from ppprof.probe.loop import ProbeRunner
from ppprof.probe.output import append_samples, complete_probes, samples_frame
from ppprof.probe.synth import Probe, ProbeRequest, warmup_requests
from ppprof.run.memory import profile_memory
from ppprof.run.provenance import default_run_dir, hardware, peak_memory_bytes
from ppprof.run.rank import (
    Phase,
    RankRun,
    claim_folder,
    enter_folder,
    release_folder,
    run_phases,
    run_rank,
    run_status,
    set_up,
    tp_comm,
    tp_shard,
)
from ppprof.runfiles import COMPLETE, FAILED, RunFolder, RunRecord, stage_column
from ppprof.specs.spec import layers_pattern
from ppprof.specs.tp import rank_spec


def run_outputs(folder: RunFolder) -> tuple[Path, ...]:
    """What a profile writes in its run folder besides the rank logs; an older run's are removed when --overwrite."""
    return folder.samples, folder.run_json, folder.policy, folder.path / FIT_PLOT, folder.path / CHUNKS_PLOT


log = logging.getLogger("ppprof")


@dataclass(slots=True)
class ProfileState:
    """What the profile job's phases hand on, in the order they fill it (rank 0 only: record, probes_done)."""

    resume: bool = False
    """--resume: finish the interrupted run in cfg.out."""
    overwrite: bool = False
    """--overwrite: cfg.out may hold files."""
    probes: list[Probe] = field(default_factory=list)
    """Every probe of the run, in order; the adaptive design appends each one it chooses."""
    first_probe: int = 0
    """The first probe not yet complete: where a resumed run starts (0 otherwise)."""
    record: RunRecord | None = None
    """Rank 0: run.json, written with status running before the first probe."""
    probes_done: int = 0
    """Rank 0: probes whose rows samples.csv holds (named when the run is interrupted)."""
    runner: ProbeRunner | None = None
    """This rank's probe loop, built at the warm-up."""
    warmup: list[ProbeRequest] = field(default_factory=list)
    """The untimed requests run before the first probe."""
    t_probes: float = 0.0
    """time.perf_counter() when the warm-up began: the probing time counts from there."""
    attention_kernel: str | None = None
    """The attention kernel the stages ran (the first stage with attention), for run.json."""
    probe_wall_s: float = 0.0
    """Warm-up, probes and the adaptive design's choices, in seconds."""
    forward_tokens: list[int] = field(default_factory=list)
    """Per stage: tokens run forward, warm-up included."""
    peak_memory: list[int | None] = field(default_factory=list)
    """Per stage: peak device memory in bytes (None where the device does not tell)."""
    design: DesignState = field(default_factory=DesignState)
    """The probe design's stopping reason, last uncertainty and history."""
    overhead: dict | None = None
    """Rank 0: run.json's pipeline_overhead (None: not measured, overhead_repeats 0)."""
    overhead_wall_s: float = 0.0
    """The pipeline overhead's prompts, warm-up included, in seconds."""
    tp_ranks: dict = field(default_factory=dict)
    """Under TP, run.json's per-TP-rank figures (per stage, per TP rank)."""


def prepare_run_folder(run: RankRun[ProfileState]) -> None:
    """Rank 0 names and creates the run folder (its lock, where no launcher holds it), synthesizes the probes, and
    writes run.json (status running); resuming, it keeps the probes samples.csv holds whole. Every rank gets the
    folder, the probes and the first probe to run, and logs there."""
    run_dir = probes = None
    first = 0
    with agreed(run.pipe, "prepare the run folder and the probes"):
        if run.rank == 0:
            run_dir = Path(run.cfg.out) if run.cfg.out else default_run_dir(run.cfg.model)
            run_dir.mkdir(parents=True, exist_ok=True)
            claim_folder(run, run_dir, run.cfg.out, run.state.overwrite, run.state.resume)
            folder = RunFolder(run_dir)
            probes = initial_probes(run.cfg)
            if run.state.resume:
                first = complete_probes(folder.samples, probes)
            else:
                for path in run_outputs(folder):  # --overwrite: none of an older run's results stays beside this one's
                    path.unlink(missing_ok=True)
            start_record(run, folder, probes, first)
    run_dir, run.state.probes, run.state.first_probe = run.pipe.broadcast((str(run_dir), probes, first))
    enter_folder(run, run_dir)
    if first:
        log.info("resuming %s: probes 0..%d are complete, %d to run", run_dir, first - 1, len(run.state.probes) - first)


def start_record(run: RankRun[ProfileState], folder: RunFolder, probes: list, first: int) -> None:
    """Rank 0: run.json with status running, and what records the status when the rank is stopped (a signal, a rank
    that does not answer)."""
    record = RunRecord(
        folder.run_json,
        config=run.cfg.to_dict(),
        model=run.spec.to_dict(),
        hardware=hardware(run.info.device),
        torch_version=torch.__version__,
        dist_backend=run.info.backend,
        world_size=run.info.world_size,
        pp_size=run.num_stages,
        tp_size=run.tp_size,
        layer_partition=[len(r) for r in run.stage_ranges],
        git_revision=git_revision(),
        dtype=str(run.dtype).removeprefix("torch."),
        num_probes=len(probes),
        **({"resumed_from_probe": first} if run.state.resume else {}),
    )
    record.write()
    write_manifest(folder.path)
    run.state.record, run.state.probes_done = record, first

    def on_stop(stop: Stop, signal_name: str | None) -> None:
        record.write(status=run_status(stop))
        if signal_name is not None:
            print(
                f"interrupted by {signal_name}: {folder.path} keeps the samples of {run.state.probes_done} of "
                f"{len(probes)} probes; finish it with: ppprof profile --resume {folder.path}",
                file=sys.stderr,
                flush=True,
            )

    if run.pipe.watchdog is not None:
        run.pipe.watchdog.on_stop.append(on_stop)


def build_stage(run: RankRun[ProfileState]) -> None:
    """This rank's layers (random weights) and its pools: KV, Mamba state and request entries."""
    cfg, spec, layer_ids = run.cfg, run.spec, run.layer_ids
    log.info(
        "stage %d/%d%s: layers %d..%d (%s) of %s on %s, %s, backend %s, %d threads",
        run.stage_idx,
        run.num_stages,
        f" (TP rank {run.pipe.tp.rank} of {run.tp_size})" if run.tp_size > 1 else "",
        layer_ids.start,
        layer_ids.stop - 1,
        layers_pattern(spec.layers[layer_ids.start : layer_ids.stop]),
        spec.name,
        run.info.device,
        str(run.dtype).removeprefix("torch."),
        run.info.backend,
        torch.get_num_threads(),
    )
    tp = tp_comm(run)
    run.stage = Stage(
        spec,
        layer_ids,
        dtype=run.dtype,
        device=run.info.device,
        seed=cfg.seed,
        attention_backend=cfg.attention_backend,
        **tp,
    )
    run.stage.eval()
    run.cache = build_stage_cache(
        spec,
        layer_ids,
        max_total_tokens=cfg.max_total_tokens,
        page_size=cfg.page_size,
        max_mamba_cache_size=cfg.max_mamba_cache_size,
        max_running_requests=cfg.max_running_requests,
        context_len=cfg.context_len,
        dtype=run.dtype,
        device=run.info.device,
        **tp_shard(run),
    )
    cache = run.cache
    pool_mib = [0.0 if p is None else p.nbytes() / 2**20 for p in (cache.kv_pool, cache.mamba_pool)]
    log.info(
        "pools: KV %.1f MiB (%d slots, page %d), Mamba %.1f MiB (%s slots), %d request entries",
        pool_mib[0],
        cache.kv_alloc.size,
        cfg.page_size,
        pool_mib[1],
        "no" if cache.mamba_alloc is None else cache.mamba_alloc.size,
        cfg.max_running_requests,
    )


def warm_up(run: RankRun[ProfileState]) -> None:
    """Untimed forwards shaped like the first timed ones, so that no timed request is the first of its kind."""
    run.state.runner = ProbeRunner(stage=run.stage, cache=run.cache, pipe=run.pipe, seed=run.cfg.seed, fault=run.fault)
    run.state.warmup = warmup_requests(run.state.probes, run.cfg.warmup)
    run.state.t_probes = time.perf_counter()
    run.state.runner.warm_up(run.state.warmup)
    # What each stage's attention ran (None on a stage without attention), gathered for run.json.
    kernels = run.pipe.all_gather(run.stage.attention_kernel.kernel)
    run.state.attention_kernel = next((k for k in kernels if k is not None), None)
    log.info(
        "attention %s (%s), mamba %s",
        run.stage.attention_kernel.backend,
        run.state.attention_kernel,
        run.stage.mamba_kernel.kernel,
    )


def run_probes(run: RankRun[ProfileState]) -> None:
    """Every probe in lockstep (from the first not yet complete, for --resume); after each, every stage's latencies
    are gathered (stage_ms[probe][stage][request]) and rank 0 appends the probe's rows to samples.csv. The adaptive
    design chooses each next probe from the rows samples.csv holds so far (probe_sequence)."""
    first, runner = run.state.first_probe, run.state.runner
    bar = None
    if run.rank == 0:
        from tqdm import tqdm

        total = (
            sum(len(p.requests) for p in run.state.probes[first:])
            if run.cfg.design == "grid"
            else run.cfg.request_budget
        )
        bar = tqdm(total=total, desc="profile", unit="req", file=sys.stderr, disable=None, dynamic_ncols=True)
    e2e_ms = []
    for probe in probe_sequence(
        run.pipe, run.cfg, run.state.probes, run.state.design, run.folder.samples, e2e_ms, run.state.t_probes, first
    ):
        timings = runner.run_probe(probe, on_request=bar.update if bar is not None else None)
        stage_ms = run.pipe.all_gather(timings.stage_ms)
        e2e_ms.append(timings.e2e_ms)
        if run.rank == 0:
            keep_samples(run, probe, stage_ms, timings.e2e_ms)
        log.info(
            "probe %d (%s, %d requests, prefix %d): pools back to full capacity",
            probe.index,
            probe.kind,
            len(probe.requests),
            probe.requests[0].prefix_len,
        )
    run.state.probe_wall_s = time.perf_counter() - run.state.t_probes
    run.state.forward_tokens = run.pipe.all_gather(runner.forward_tokens)
    run.state.peak_memory = run.pipe.all_gather(peak_memory_bytes(run.info.device))
    if run.tp_size > 1:  # per TP rank: its own median forward (before the slowest is taken) and peak memory
        own = (
            round(float(np.median(runner.tp_rank_ms)), 4) if runner.tp_rank_ms else None,
            peak_memory_bytes(run.info.device),
        )
        everyone = run.pipe.all_gather_ranks(own)
        tp = run.tp_size
        run.state.tp_ranks = {
            "median_forward_ms_per_tp_rank": [
                [o[0] for o in everyone[s * tp : (s + 1) * tp]] for s in range(run.num_stages)
            ],
            "peak_memory_bytes_per_tp_rank": [
                [o[1] for o in everyone[s * tp : (s + 1) * tp]] for s in range(run.num_stages)
            ],
        }
    if bar is not None:
        bar.close()


def measure_overhead(run: RankRun[ProfileState]) -> None:
    """The per-chunk pipeline overhead (ppprof.bench.overhead), unless overhead_repeats is 0: one warm-up prompt,
    then overhead_repeats rounds of fixed plans at B/4, B and 2B, pipelined through the profile's own stages by the
    bench executor (every pool checked after every prompt); rank 0 solves each prompt's overhead from its TTFT and
    the replay of every stage's forwards of it."""
    cfg = run.cfg
    if not cfg.overhead_repeats:
        return
    start = time.perf_counter()
    sizes = overhead_chunk_sizes(cfg.base_chunk_size, cfg.chunk_unit, cfg.max_probe_chunk_size)
    capacity = min(cfg.max_total_tokens, cfg.context_len)
    warmup, timed = overhead_plans(sizes, capacity, cfg.overhead_repeats, cfg.base_chunk_size)
    if not timed:  # the same on every rank: nothing to agree on
        log.warning(
            "pipeline overhead not measured: a request holds %d tokens, under two chunks of %d", capacity, sizes[0]
        )
        return
    runner = PromptRunner(stages=[BenchStage(run.stage_idx, run.stage, run.cache)], pipe=run.pipe, seed=cfg.seed)
    rows, ttft = [], {}
    for index, (repeat, chunks) in enumerate([(WARMUP_REPEAT, warmup)] + timed):  # the warm-up is prompt 0
        result = runner.run(BenchPrompt(index, f"overhead-{chunks[-1]}", repeat, sum(chunks), chunks))
        rows += result.rows
        ttft[index] = result.ttft_ms
    rows = [row for per_rank in run.pipe.all_gather(rows) for row in per_rank]
    run.state.overhead_wall_s = time.perf_counter() - start
    if run.rank != 0:
        return
    o = run.state.overhead = pipeline_overhead(timed, rows, ttft, run.num_stages)
    log.info(
        "pipeline overhead: %.3f +- %.3f ms a chunk (median of %d runs; by chunk size %s), measured in %.1f s",
        o["ms_per_chunk"],
        o["stderr_ms"],
        len(o["runs"]),
        ", ".join(f"{n}: {v:.3f}" for n, v in o["by_chunk_size"].items()),
        run.state.overhead_wall_s,
    )


def keep_samples(run: RankRun[ProfileState], probe, stage_ms: list[list[float]], e2e_ms: list[float]) -> None:
    """Rank 0: one probe's rows (stage_ms[stage][request]) appended to samples.csv and flushed to the disk."""
    record = run.state.record
    with record.lock:
        append_samples(run.folder.samples, samples_frame([probe], [stage_ms], [e2e_ms]))
        run.state.probes_done += 1


def write_results(run: RankRun[ProfileState]) -> None:
    """Rank 0: samples.csv and run.json."""
    if run.rank != 0:
        return
    probes, warmup, forward_tokens = run.state.probes, run.state.warmup, run.state.forward_tokens
    probes = probes[run.state.first_probe :]
    frame = pd.read_csv(run.folder.samples)  # every probe's rows, appended as each completed
    wall_s = time.perf_counter() - run.t_start
    run.state.record.write(
        status=COMPLETE,
        attention_backend=run.stage.attention_kernel.backend,
        attention_kernel=run.state.attention_kernel,
        mamba_kernel=run.stage.mamba_kernel.kernel if any(layer.has_mamba for layer in run.spec.layers) else None,
        torch_threads=torch.get_num_threads(),
        profile_wall_s=round(wall_s, 3),
        probe_wall_s=round(run.state.probe_wall_s, 3),
        forward_tokens=int(forward_tokens[0]),
        forward_tokens_per_stage=[int(t) for t in forward_tokens],
        peak_memory_bytes_per_stage=run.state.peak_memory,
        estimated_memory_bytes_per_stage=[
            m.total for m in profile_memory(run.cfg, run.num_stages, rank_spec(run.spec, run.tp_size))
        ],
        **run.state.tp_ranks,
        timed_requests=sum(len(p.requests) for p in probes),
        warmup_requests=len(warmup),
        **(
            {"pipeline_overhead": run.state.overhead, "overhead_wall_s": round(run.state.overhead_wall_s, 3)}
            if run.state.overhead is not None
            else {}
        ),
        warmup_tokens=sum(r.chunk_size for r in warmup),
        design=design_record(
            run.cfg,
            run.state.design,
            probes,
            run.folder.samples,
            run.num_stages,
            run.state.probe_wall_s,
            int(forward_tokens[0]),
        ),
    )
    log_summary(frame, run.num_stages, wall_s, forward_tokens[0], run.folder.path)


def fit_policy(run: RankRun[ProfileState]) -> None:
    """Rank 0, unless --no-fit: policy.json and the plots beside the samples."""
    if run.rank != 0 or not run.cfg.fit:
        return
    from ppprof.fit import fit_run

    log.info("policy: %s", fit_run(run.folder.path))


PHASES: tuple[Phase, ...] = (
    ("prepare the run folder", prepare_run_folder),
    ("build the stage", build_stage),
    ("warm up", warm_up),
    ("run the probes", run_probes),
    ("measure the pipeline overhead", measure_overhead),
    ("write samples.csv and run.json", write_results),
    ("fit the policy", fit_policy),
)


def profile_rank(cfg: ProfileConfig, fault: str | None = None, resume: bool = False, overwrite: bool = False) -> int:
    """One rank of `ppprof profile` (`resume`: finish the interrupted run in cfg.out; `overwrite`: it may hold
    files); returns its exit code. A run that fails records it in run.json (status "failed: <reason>")."""

    def job(info) -> None:
        run = set_up(cfg, info, fault, state=ProfileState(resume=resume, overwrite=overwrite))
        try:
            run_phases(run, PHASES)
        except RunError as e:
            if run.state.record is not None:
                try:
                    run.state.record.write(status=f"{FAILED}: {e}")
                except OSError as write_error:  # a full disk: the error below still says what failed
                    log.error("could not record the status in run.json: %s", write_error)
            raise
        finally:
            release_folder(run)

    return run_rank(job, cfg.device, cfg.torch_threads, cfg.timeout, cfg.tp_size)


def log_summary(frame, world_size: int, wall_s: float, forward_tokens: int, run_dir: Path) -> None:
    sweep = frame[frame["prefix_len"] == frame["prefix_len"].min()]
    big, small = sweep.loc[sweep["chunk_size"].idxmax()], sweep.loc[sweep["chunk_size"].idxmin()]
    for s in range(world_size):
        col = stage_column(s)
        log.info(
            "stage %d: chunk %d -> %.3f ms, chunk %d -> %.3f ms",
            s,
            big["chunk_size"],
            big[col],
            small["chunk_size"],
            small[col],
        )
    log.info("profile wall time %.2f s, %d forward tokens a stage; wrote %s", wall_s, forward_tokens, run_dir)

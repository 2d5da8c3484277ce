"""The profile job, one rank's view: prepare the run folder and the probes, build the stage, measure the per-chunk
pipeline overhead (first, so that the adaptive design judges the status on the planning model the fit will use), warm
up, run the probes in lockstep, time the packed forwards (ppprof.run.measure), then (rank 0) write run.json and fit the
policy (ppprof.run.profile_results). The phases hand on a ProfileState (ppprof.run.profile_state), the samples in
memory among it: samples.csv, packed.csv and run.json are checkpoints, never read back within the run."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import torch

from ppprof.adaptive import initial_probes
from ppprof.adaptive.probes import resumed_probes
from ppprof.config import ProfileConfig
from ppprof.distributed.agree import RunError, agreed
from ppprof.distributed.stop import Stop
from ppprof.fit.plots import CHUNKS_PLOT, FIT_PLOT
from ppprof.manifest import git_revision, write_manifest
from ppprof.model.stage import build_stage_cache
from ppprof.probe.loop import ProbeRunner
from ppprof.probe.output import SamplesLog, complete_probes
from ppprof.probe.synth import warmup_requests
from ppprof.run.measure import measure_overhead, run_probes, time_packed_forwards
from ppprof.run.profile_results import fit_policy, write_results
from ppprof.run.profile_state import ProfileState
from ppprof.run.provenance import default_run_dir, hardware
from ppprof.run.rank import (
    OWN,
    Phase,
    RankRun,
    claim_folder,
    enter_folder,
    make_stage,
    release_folder,
    run_phases,
    run_rank,
    run_status,
    set_up,
    tp_shard,
)
from ppprof.runfiles import FAILED, RunFolder, RunRecord
from ppprof.specs.spec import layers_pattern

log = logging.getLogger("ppprof")


def run_outputs(folder: RunFolder) -> tuple[Path, ...]:
    """What a profile writes in its run folder besides the rank logs; an older run's are removed when --overwrite."""
    return (
        folder.samples,
        folder.packed,
        folder.run_json,
        folder.policy,
        folder.path / FIT_PLOT,
        folder.path / CHUNKS_PLOT,
    )


def prepare_run_folder(run: RankRun[ProfileState]) -> None:
    """Rank 0 names and creates the run folder (its lock, where no launcher holds it), synthesizes the probes, and
    writes run.json (status running); resuming, it keeps the probes samples.csv holds whole. Every rank gets the
    folder, the probes and the first probe to run, and logs there."""
    run_dir = probes = None
    first = 0
    with agreed(run.pipe, "prepare the run folder and the probes"):
        if run.rank == 0:
            run_dir = Path(run.cfg.job.out) if run.cfg.job.out else default_run_dir(run.cfg.model.model)
            run_dir.mkdir(parents=True, exist_ok=True)
            claim_folder(run, run_dir, run.cfg.job.out, run.state.overwrite, run.state.resume)
            folder = RunFolder(run_dir)
            probes = resumed_probes(run.cfg, folder.samples) if run.state.resume else initial_probes(run.cfg)
            if run.state.resume:
                first = complete_probes(folder.samples, probes)
                probes = probes if run.cfg.probes.design != "adaptive" else probes[: max(first, 1)]
            else:
                for path in run_outputs(folder):  # --overwrite: none of an older run's results stays beside this one's
                    path.unlink(missing_ok=True)
            # samples.csv is a checkpoint: its rows are kept in memory as they are appended (a resumed run's, read once)
            run.state.samples_log = (
                SamplesLog.resumed(folder.samples) if run.state.resume else SamplesLog(folder.samples)
            )
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
        pp_size=run.pp_size,
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
        run.pp_size,
        f" (TP rank {run.pipe.tp.rank} of {run.tp_size})" if run.tp_size > 1 else "",
        layer_ids.start,
        layer_ids.stop - 1,
        layers_pattern(spec.layers[layer_ids.start : layer_ids.stop]),
        spec.name,
        run.info.device,
        str(run.dtype).removeprefix("torch."),
        run.info.backend,
        torch.get_num_threads(),
        extra=OWN,
    )
    run.stage = make_stage(run, layer_ids)
    run.cache = build_stage_cache(
        spec, layer_ids, cfg.cache_sizes, dtype=run.dtype, device=run.info.device, **tp_shard(run)
    )
    cache = run.cache
    pool_mib = [0.0 if p is None else p.nbytes() / 2**20 for p in (cache.kv_pool, cache.mamba_pool)]
    log.info(
        "pools: KV %.1f MiB (%d slots, page %d), Mamba %.1f MiB (%s slots), %d request entries",
        pool_mib[0],
        cache.kv_alloc.size,
        cfg.pools.page_size,
        pool_mib[1],
        "no" if cache.mamba_alloc is None else cache.mamba_alloc.size,
        cfg.pools.max_running_requests,
    )


def warm_up(run: RankRun[ProfileState]) -> None:
    """Untimed forwards shaped like the first timed ones, so that no timed request is the first of its kind."""
    run.state.runner = ProbeRunner(
        stage=run.stage, cache=run.cache, pipe=run.pipe, seed=run.cfg.probes.seed, fault=run.fault
    )
    every_size = run.info.device.type == "cuda"  # a GPU's first forward of each size is slow (kernel choice)
    run.state.warmup = warmup_requests(run.state.probes, run.cfg.probes.warmup, every_size)
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


PHASES: tuple[Phase, ...] = (
    ("prepare the run folder", prepare_run_folder),
    ("build the stage", build_stage),
    ("measure the pipeline overhead", measure_overhead),
    ("warm up", warm_up),
    ("run the probes", run_probes),
    ("time the packed forwards", time_packed_forwards),
    ("write run.json", write_results),
    ("fit the policy", fit_policy),
)


def profile_rank(cfg: ProfileConfig, fault: str | None = None, *, resume: bool = False, overwrite: bool = False) -> int:
    """One rank of `ppprof profile` (`resume`: finish the interrupted run in cfg.job.out; `overwrite`: it may hold
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

    return run_rank(job, cfg.job.device, cfg.job.torch_threads, cfg.job.timeout, cfg.parallelism.tp_size)

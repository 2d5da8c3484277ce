"""The profile's measuring phases: first the per-chunk pipeline overhead, pipelined through the profile's own stages
by the bench executor (ppprof.bench.overhead); once the stage is warm, the probes in lockstep (rank 0 appends each
probe's rows to samples.csv as it completes and keeps them in memory; the adaptive design chooses each next probe
from them, judging the status with that overhead), then the packed forwards in lockstep (ppprof.probe.packed; rank 0
writes packed.csv and keeps its rows)."""

from __future__ import annotations

import logging
import time

import numpy as np

from ppprof.adaptive.loop import probe_sequence, status_words
from ppprof.adaptive.probes import resumed_latencies
from ppprof.bench.executor import WARMUP_REPEAT, BenchPrompt, BenchStage, PromptRunner
from ppprof.bench.overhead import overhead_chunk_sizes, overhead_plans, pipeline_overhead
from ppprof.fit.packed import checked_packed
from ppprof.probe.output import samples_frame
from ppprof.probe.packed import PackedRunner, PackLimits, pack_design, packed_frame, write_packed
from ppprof.run.profile_state import ProfileState
from ppprof.run.progress import progress
from ppprof.run.provenance import peak_memory_bytes
from ppprof.run.rank import RankRun

log = logging.getLogger("ppprof")


def run_probes(run: RankRun[ProfileState]) -> None:
    """Every probe in lockstep (from the first not yet complete, for --resume); after each, every stage's latencies
    are gathered (stage_ms[probe][stage][request]) and rank 0 appends the probe's rows to samples.csv and keeps them.
    The adaptive design chooses each next probe from the rows kept so far (probe_sequence)."""
    first, runner = run.state.first_probe, run.state.runner
    total = (
        sum(len(p.requests) for p in run.state.probes[first:])
        if run.cfg.probes.design == "grid"
        else run.cfg.request_budget
    )
    with progress(run.rank, total, "profile", "req") as bar:
        probe_all(run, bar)
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
                [o[0] for o in everyone[s * tp : (s + 1) * tp]] for s in range(run.pp_size)
            ],
            "peak_memory_bytes_per_tp_rank": [
                [o[1] for o in everyone[s * tp : (s + 1) * tp]] for s in range(run.pp_size)
            ],
        }


def probe_all(run: RankRun[ProfileState], bar) -> None:
    """The probes of run_probes, `bar` (rank 0's progress bar, or None) counting the requests and showing the
    adaptive design's decision so far."""
    state, first, runner = run.state, run.state.first_probe, run.state.runner
    # A resumed adaptive design costs its next batch from every probe that ran, those before the interruption too.
    e2e_ms = resumed_latencies(state.samples_log.frame(), state.probes[:first]) if run.rank == 0 else []
    rows = state.samples_log.samples if run.rank == 0 else None
    for probe in probe_sequence(run.pipe, run.cfg, state, rows, e2e_ms):
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
        history = getattr(state.design, "history", None)
        if bar is not None and history:
            bar.set_postfix_str(status_words(history[-1].get("status")), refresh=True)


def time_packed_forwards(run: RankRun[ProfileState]) -> None:
    """cfg.probes.packed_forwards packed forwards of 2 to 8 pieces (none where 0), designed on rank 0 from the probes
    that ran (ppprof.probe.packed), timed in lockstep on every stage; rank 0 writes packed.csv. Every pool is
    checked after the last."""
    cfg = run.cfg
    if not cfg.probes.packed_forwards:
        return
    start, packs = time.perf_counter(), None
    if run.rank == 0:
        limits = PackLimits(
            tokens=cfg.max_probe_chunk_size,
            kv_slots=run.cache.kv_alloc.size,
            page_size=cfg.pools.page_size,
            context_len=cfg.probes.context_len,
            max_pieces=min(cfg.pools.max_mamba_cache_size, cfg.pools.max_running_requests),
        )
        packs = pack_design(run.state.probes, limits, cfg.probes.packed_forwards, cfg.probes.seed)
    packs = run.pipe.broadcast(packs)
    if not packs:  # the same on every rank
        log.warning("packed forwards not timed: two of the smallest probe chunk do not fit one forward's limits")
        return
    stage_ms = run.pipe.all_gather(PackedRunner(run.state.runner).run(packs))
    run.state.packed_wall_s = time.perf_counter() - start
    if run.rank == 0:
        with run.state.record.lock:
            write_packed(run.folder.packed, packs, stage_ms)
        run.state.packed = checked_packed(packed_frame(packs, stage_ms), run.folder.packed)  # the rows written
        log.info(
            "%d packed forwards of %d-%d pieces timed in %.1f s; every pool full again after them",
            len(packs),
            min(len(p.requests) for p in packs),
            max(len(p.requests) for p in packs),
            run.state.packed_wall_s,
        )


def measure_overhead(run: RankRun[ProfileState]) -> None:
    """The per-chunk pipeline overhead (ppprof.bench.overhead), unless overhead_repeats is 0: one warm-up prompt,
    then overhead_repeats rounds of fixed plans at B/4, B and 2B, pipelined through the profile's own stages by the
    bench executor (every pool checked after every prompt); rank 0 solves each prompt's overhead from its TTFT and
    the replay of every stage's forwards of it."""
    cfg = run.cfg
    if not cfg.probes.overhead_repeats:
        return
    start = time.perf_counter()
    sizes = overhead_chunk_sizes(cfg.probes.base_chunk_size, cfg.chunk_unit, cfg.max_probe_chunk_size)
    capacity = min(cfg.pools.max_total_tokens, cfg.probes.context_len)
    warmup, timed = overhead_plans(sizes, capacity, cfg.probes.overhead_repeats, cfg.probes.base_chunk_size)
    if not timed:  # the same on every rank: nothing to agree on
        log.warning(
            "pipeline overhead not measured: a request holds %d tokens, under two chunks of %d", capacity, sizes[0]
        )
        return
    runner = PromptRunner(stages=[BenchStage(run.stage_idx, run.stage, run.cache)], pipe=run.pipe, seed=cfg.probes.seed)
    rows, ttft = [], {}
    for index, (repeat, chunks) in enumerate([(WARMUP_REPEAT, warmup)] + timed):  # the warm-up is prompt 0
        result = runner.run(BenchPrompt(index, f"overhead-{chunks[-1]}", repeat, sum(chunks), chunks))
        rows += result.rows
        ttft[index] = result.ttft_ms
    rows = [row for per_rank in run.pipe.all_gather(rows) for row in per_rank]
    run.state.overhead_wall_s = time.perf_counter() - start
    if run.rank != 0:
        return
    o = run.state.overhead = pipeline_overhead(timed, rows, ttft, run.pp_size)
    log.info(
        "pipeline overhead: %.3f +- %.3f ms a chunk (median of %d runs; by chunk size %s), measured in %.1f s",
        o["ms_per_chunk"],
        o["stderr_ms"],
        len(o["runs"]),
        ", ".join(f"{n}: {v:.3f}" for n, v in o["by_chunk_size"].items()),
        run.state.overhead_wall_s,
    )


def keep_samples(run: RankRun[ProfileState], probe, stage_ms: list[list[float]], e2e_ms: list[float]) -> None:
    """Rank 0: one probe's rows (stage_ms[stage][request]) appended to samples.csv, flushed to the disk, and kept in
    memory for the design and the fit."""
    record = run.state.record
    with record.lock:
        run.state.samples_log.append(samples_frame([probe], [stage_ms], [e2e_ms]))
        run.state.probes_done += 1

"""The bench job, one rank's view: prepare the run folder and the schedule of prompts (rank 0 plans every strategy),
build this rank's stages, measure the transfer time between ranks, run the prompts in lockstep, then (rank 0) write
bench.csv, bench.json and the timelines."""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ppprof.bench.executor import WARMUP_REPEAT, BenchPrompt, BenchStage, PromptRunner
from ppprof.bench.plans import Arm, arms
from ppprof.bench.report import Measured, write_report
from ppprof.chunks import align_up
from ppprof.config import BenchConfig
from ppprof.distributed.agree import agreed
from ppprof.manifest import write_manifest
from ppprof.model.stage import build_stage_cache
from ppprof.policy.policy_file import load
from ppprof.policy.runtime import Policy
from ppprof.policy.summary import extrapolation
from ppprof.run.forward_trace import RankTrace, join_parts
from ppprof.run.progress import progress
from ppprof.run.provenance import default_run_dir
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
    set_up,
    tp_shard,
)
from ppprof.runfiles import RunFolder
from ppprof.specs.memory import CacheSizes

log = logging.getLogger("ppprof")
TRANSFER_REPEATS = 7


@dataclass(slots=True)
class BenchState:
    """What the bench job's phases hand on, in the order they fill it."""

    bench: BenchConfig
    """The bench's settings (its profile's among them)."""
    overwrite: bool = False
    """--overwrite: bench.out may hold files."""
    policy: Policy | None = None
    """The policy benched: loaded and checked where this process resolved the settings (run.resolve.resolve_bench),
    else by rank 0 in prepare; read once in a process."""
    plans: list[Arm] = field(default_factory=list)
    """Every strategy's chunks for every prompt length."""
    schedule: list[BenchPrompt] = field(default_factory=list)
    """The prompts in the order they run, warm-ups included."""
    runner: PromptRunner | None = None
    """This rank's stages and the loop that runs a prompt through them."""
    transfer: dict = field(default_factory=dict)
    """The fitted transfer time between ranks: a_ms, b_ms_per_token and the points measured."""
    rows: list[dict] = field(default_factory=list)
    """Every stage's timed chunks of every prompt, gathered from every rank."""
    ttft: dict[int, float] = field(default_factory=dict)
    """TTFT (ms) of each prompt, by its index in the schedule."""


def schedule(plans, repeats: int) -> list[BenchPrompt]:
    """Per prompt length: one warm-up prompt, then every plan once per repeat, interleaved (A B C A B C ...)."""
    out = []
    for prompt_len in dict.fromkeys(a.prompt_len for a in plans):
        group = [a for a in plans if a.prompt_len == prompt_len]
        out.append(BenchPrompt(len(out), group[0].name, WARMUP_REPEAT, prompt_len, group[0].chunk_sizes))
        for r in range(repeats):
            out += [BenchPrompt(len(out) + i, a.name, r, prompt_len, a.chunk_sizes) for i, a in enumerate(group)]
    return out


def prepare(run: RankRun[BenchState]) -> None:
    """Rank 0: the run folder, the plans of every strategy and the schedule; every rank gets them."""
    bench = run.state.bench
    run_dir = plans = None
    with agreed(run.pipe, "prepare the run folder and the plans"):
        if run.rank == 0:
            policy = run.state.policy = run.state.policy or load(bench.policy)
            if policy.latency_model is None:
                raise ValueError(f"policy {bench.policy} has no latency model ({policy.reason}): profile again")
            samples = RunFolder.of(bench.policy).samples
            plans = arms(
                policy,
                samples if samples.is_file() else None,
                bench.prompt_lens,
                bench.strategies,
                bench.pp_size,
                bench.plans,
            )
            run_dir = Path(bench.out) if bench.out else default_run_dir(f"bench-{run.cfg.model.model}")
            run_dir.mkdir(parents=True, exist_ok=True)
            claim_folder(run, run_dir, bench.out, run.state.overwrite)
            write_manifest(run_dir)
    run_dir, run.state.plans = run.pipe.broadcast((str(run_dir), plans))
    run.state.schedule = schedule(run.state.plans, bench.repeats)
    enter_folder(run, run_dir)


def build_stages(run: RankRun[BenchState]) -> None:
    """This rank's stages (a run of consecutive ones when there are more stages than ranks), each with a cache that
    holds the longest prompt."""
    cfg, bench = run.cfg, run.state.bench
    per_rank = bench.pp_size // run.pp_size
    longest = align_up(max(bench.prompt_lens), cfg.pools.page_size)
    stages = []
    for index in range(run.stage_idx * per_rank, (run.stage_idx + 1) * per_rank):
        layer_ids = run.stage_ranges[index]
        stage = make_stage(run, layer_ids)
        cache = build_stage_cache(
            run.spec,
            layer_ids,
            CacheSizes(
                max_total_tokens=longest,
                page_size=cfg.pools.page_size,
                max_mamba_cache_size=1,
                max_running_requests=1,
                context_len=max(longest, cfg.probes.context_len),
            ),
            dtype=run.dtype,
            device=run.info.device,
            **tp_shard(run),
        )
        stages.append(BenchStage(index, stage, cache))
    run.state.runner = PromptRunner(stages=stages, pipe=run.pipe, seed=cfg.probes.seed)
    if bench.forward_trace is not None:
        context_len = max(longest, cfg.probes.context_len)
        run.state.runner.trace = RankTrace(bench.forward_trace, run, context_len, "ppprof bench", bench.pp_size)
    log.info(
        "stages %s of %d (%s) on rank %d", [s.index for s in stages], bench.pp_size, run.spec.name, run.rank, extra=OWN
    )


def measure_transfers(run: RankRun[BenchState]) -> None:
    """Transfer time of a chunk's activations between neighbouring ranks, fitted as a + b * chunk_size (ms): half the
    median round trip at the smallest, middle and largest chunk the plans use."""
    sizes = sorted({c for a in run.state.plans for c in a.chunk_sizes})
    probe = sorted({sizes[0], sizes[len(sizes) // 2], sizes[-1]})
    points = []
    for boundary in range(run.pp_size - 1):
        for n in probe:
            trips = run.pipe.round_trips_ms(boundary, n, TRANSFER_REPEATS)
            points += [(n, float(np.median(trips[1:])) / 2)] if trips else []
    points = [p for per_rank in run.pipe.all_gather(points) for p in per_rank]
    if not points:
        run.state.transfer = {"a_ms": 0.0, "b_ms_per_token": 0.0, "points": []}
        return
    x, y = np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)
    b, a = np.polyfit(x, y, 1) if len(set(x)) > 1 else (0.0, float(y.mean()))
    run.state.transfer = {"a_ms": max(float(a), 0.0), "b_ms_per_token": max(float(b), 0.0), "points": points}
    log.info(
        "transfer between ranks: %.3f ms + %.2e ms/token",
        run.state.transfer["a_ms"],
        run.state.transfer["b_ms_per_token"],
    )


def run_prompts(run: RankRun[BenchState]) -> None:
    """The schedule in order, every rank together; rows and TTFTs are gathered to rank 0 at the end."""
    runner, prompts = run.state.runner, run.state.schedule
    rows, ttft = [], {}
    with progress(run.rank, len(prompts), "bench", "prompt") as bar:
        for prompt in prompts:
            result = runner.run(prompt)
            rows += result.rows
            ttft[prompt.index] = result.ttft_ms
            if bar is not None:
                bar.update()
    if run.state.bench.forward_trace is not None:
        join_parts(run.pipe, run.rank, run.state.bench.forward_trace, runner.trace)
    gathered = run.pipe.all_gather(rows)
    run.state.rows = [row for per_rank in gathered for row in per_rank]
    run.state.ttft = ttft


def write_results(run: RankRun[BenchState]) -> None:
    """Rank 0: bench.csv, bench.json, a timeline PNG per prompt length, and the summary table on stderr."""
    if run.rank != 0:
        return
    bench = run.state.bench
    run_json = RunFolder.of(bench.policy).read_run() or {}
    policy = run.state.policy  # loaded by rank 0 in prepare
    notes = {}
    for n in bench.prompt_lens:
        plans = [a.chunk_sizes for a in run.state.plans if a.prompt_len == n]
        # The deepest prefix and the largest chunk any plan of this prompt reaches.
        notes[n] = extrapolation(policy, n, [max(max(c) for c in plans), min(c[-1] for c in plans)])
    state = run.state
    measured = Measured(state.plans, state.rows, state.ttft, state.transfer, run.info.world_size, run.pp_size)
    summary = write_report(run.folder.path, bench, measured, run_json, notes)
    print(summary, file=sys.stderr)
    log.info("wrote %s", run.folder.path)


PHASES: tuple[Phase, ...] = (
    ("prepare the run folder and the plans", prepare),
    ("build the stages", build_stages),
    ("measure the transfers", measure_transfers),
    ("run the prompts", run_prompts),
    ("write bench.csv, bench.json and the timelines", write_results),
)


def bench_rank(
    bench: BenchConfig, fault: str | None = None, overwrite: bool = False, policy: Policy | None = None
) -> int:
    """One rank of `ppprof bench` (`overwrite`: --out may hold files; `policy`: bench.policy where this process
    loaded it already); returns its exit code."""

    def job(info) -> None:
        run = set_up(
            bench.profile,
            info,
            fault,
            state=BenchState(bench, overwrite, policy),
            repeat=bench.pp_size // bench.profiled_stages,
            pp_size=bench.pp_size,
        )
        try:
            run_phases(run, PHASES)
        finally:
            release_folder(run)

    return run_rank(
        job,
        bench.profile.job.device,
        bench.profile.job.torch_threads,
        bench.profile.job.timeout,
        bench.profile.parallelism.tp_size,
    )

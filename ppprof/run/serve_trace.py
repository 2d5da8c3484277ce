"""A request trace replayed through the ranks (`ppprof serve-bench --trace` without --simulate), one rank's view: the
phases of ppprof.run.serve_job with the trace's part in place of the levels. After a warm-up, every arm runs the part
`repeats` times, interleaved: its requests arrive at the trace's scaled times on the wall clock, each prefill starts
past the prefix a block cache (empty at each run's start, the simulation's own) holds when it arrives, and that prefix
is written into the request's KV and Mamba slots on every stage (ppprof.probe.request.write_prefix), so its chunks
attend over real KV as a server's do. Rank 0 writes serving.json (each arm measured beside the simulation of the same
part with the same cache), serving.csv (every batch on every stage) and, with --output-file, one bench_serving line a
run with the measured figures."""

from __future__ import annotations

import logging
import sys

from ppprof.io import append_lines
from ppprof.manifest import write_result
from ppprof.policy.runtime import Policy
from ppprof.run.progress import progress
from ppprof.run.rank import Phase, RankRun
from ppprof.run.serve_job import (
    SERVING_CSV,
    ServeState,
    build_stage,
    gather_rows,
    prepare,
    reload,
    serve_one,
    serve_rank,
    write_rows,
)
from ppprof.serving.arms import sizer
from ppprof.serving.prefix_cache import PrefixCache
from ppprof.serving.replay import REQUEST_ENTRIES, details, metrics, pool_tokens, replay
from ppprof.serving.report import trace_cell, trace_largest_miss, trace_measured_text
from ppprof.serving.scheduler import Capacity
from ppprof.serving.serve_config import ServeBenchConfig
from ppprof.serving.simulate import LoadLevel, TraceArrivals

log = logging.getLogger("ppprof")
TRACE_LEVEL = "trace"
"""serving.csv's `level` of a replayed trace's runs."""


def new_cache(run: RankRun[ServeState]) -> PrefixCache | None:
    """A run's prefix cache, empty: --cache-tokens of them, or (by default) the simulated pool's, as --simulate's."""
    part, tokens = run.state.part, run.state.serve.trace.cache_tokens
    budget = pool_tokens(part) if tokens is None else tokens
    return PrefixCache(budget, part.block_tokens) if budget else None


def replay_one(run: RankRun[ServeState], arm: str, repeat: int, prompts: list[int]) -> None:
    """Arm `arm` replays the part once: the first stage's ranks schedule it within the simulated pools' capacity
    (which the stages' pools hold: ServeBenchConfig.with_pools), with a new cache; rank 0 keeps its metrics."""
    part, lead = run.state.part, run.pipe.is_first
    tag = {"level": TRACE_LEVEL, "arm": arm, "repeat": repeat}
    reload(run, tag)
    tag["policy_sha256"] = run.state.watch.digest[:12]
    sized = capacity = arrivals = None
    if lead:
        sized = sizer(run.state.policy, arm)
        capacity = Capacity(pool_tokens(part), REQUEST_ENTRIES)
        blocks = [r.blocks for r in part.requests]
        arrivals = TraceArrivals([r.arrival_ms for r in part.requests], blocks, new_cache(run))
    result = run.state.runner.run(prompts, None, sized, capacity, tag, arrivals)
    run.state.batches += len(result.rows)
    run.state.rows += result.rows
    if run.rank == 0:
        figures = metrics(result.served, part, arm, arrivals.cache, backend="ppprof") | {"repeat": repeat}
        if run.state.serve.trace.output_details:
            figures["details"] = details(result.served)
        run.state.cells.setdefault((TRACE_LEVEL, arm), []).append(figures)


def serve_trace(run: RankRun[ServeState]) -> None:
    """A warm-up (the first arm, a closed loop over the part's first prompts, no cache), then every arm once a
    repeat; the rows of every stage gathered on rank 0."""
    serve = run.state.serve
    run.state.part = serve.trace.read()
    prompts = [r.prompt_len for r in run.state.part.requests]
    slots = run.state.runner.slots
    serve_one(run, LoadLevel(concurrency=slots), serve.strategies[0], -1, prompts[: max(2, slots)])
    with progress(run.rank, serve.repeats * len(serve.strategies), "serve-bench", "run") as bar:
        for repeat in range(serve.repeats):
            for arm in serve.strategies:
                replay_one(run, arm, repeat, prompts)
                if bar is not None:
                    bar.set_postfix_str(f"{arm}, repeat {repeat}", refresh=False)
                    bar.update()
    gather_rows(run, serve)


def write_trace_results(run: RankRun[ServeState]) -> None:
    """Rank 0: serving.json (every arm measured, the median of its repeats, beside its simulation), serving.csv, the
    --output-file lines (a run a line, in the order they ran) and the table on stderr."""
    if run.rank != 0:
        return
    serve, part, out = run.state.serve, run.state.part, run.state.out
    simulated = replay(
        run.state.first_policy, part, serve.strategies, run.pp_size, serve.async_depth, serve.trace.cache_tokens
    )
    cells = run.state.cells
    plain = {
        arm: [{k: v for k, v in r.items() if k != "details"} for r in cells[(TRACE_LEVEL, arm)]]
        for arm in serve.strategies
    }
    runs = [trace_cell(plain[arm], sim) for arm, sim in zip(serve.strategies, simulated)]
    result = {
        "mode": "measured trace",
        "pp_size": run.pp_size,
        "async_depth": serve.async_depth,
        "repeats": serve.repeats,
        "policy": serve.policy,
        "policy_sha256": run.state.first_digest,
        "reloads": run.state.reloads,
        "device": str(run.info.device),
        "trace": part.to_dict(),
        "runs": runs,
        "largest_miss": trace_largest_miss(runs),
    }
    write_result(out, result)
    write_rows(out.with_name(SERVING_CSV), run.state.rows)
    lines = [cells[(TRACE_LEVEL, arm)][r] for r in range(serve.repeats) for arm in serve.strategies]
    appended = ""
    if serve.trace.output_file:
        append_lines(serve.trace.output_file, lines)
        appended = f"; {serve.trace.output_file}: {len(lines)} lines appended"
    print(trace_measured_text(result), file=sys.stderr)
    log.info("wrote %s%s", out, appended)


TRACE_PHASES: tuple[Phase, ...] = (
    ("read the policy", prepare),
    ("build the stage", build_stage),
    ("replay the trace", serve_trace),
    ("write serving.json", write_trace_results),
)


def trace_rank(serve: ServeBenchConfig, fault: str | None = None, policy: Policy | None = None) -> int:
    """One rank of `ppprof serve-bench --trace` through the ranks; returns its exit code."""
    return serve_rank(serve, fault, policy, TRACE_PHASES)

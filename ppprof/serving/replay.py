"""A request trace (ppprof.traces) replayed through the serving simulation: arrivals at the trace's times, prompt
lengths from it, each prefill starting after the prefix the block cache (ppprof.serving.prefix_cache) holds, every
arm on the policy's planning model; reported with the metric names SGLang's bench_serving writes (one JSON object a
run, appended to a JSONL file), beside the prefix-hit share and the chunks a request took. Prefill only: a request's
output tokens are a decode instance's. Pure: no torch."""

from __future__ import annotations

import numpy as np

from ppprof.policy.runtime import Policy
from ppprof.serving.arms import packed_stage_ms, sizer
from ppprof.serving.prefix_cache import PrefixCache
from ppprof.serving.scheduler import Capacity
from ppprof.serving.simulate import Arrivals, Served, TraceArrivals, serve
from ppprof.traces import Trace

REQUEST_ENTRIES = 128
"""Requests the simulated pools hold at once (serve-bench's default for open-loop arrivals)."""


def pool_tokens(trace: Trace, entries: int = REQUEST_ENTRIES) -> int:
    """The simulated KV pool: `entries` of the trace part's longest prompt (every admitted request reserves its
    whole prompt), the prefix cache's default bound."""
    return max(r.prompt_len for r in trace.requests) * entries


def metrics(
    served: Served, trace: Trace, arm: str, cache: PrefixCache | None, backend: str = "ppprof-simulated"
) -> dict:
    """One run in bench_serving's names (duration in s, throughputs a second, TTFT in ms) and ppprof's additions
    (the arm, the prefix-hit share of the input tokens, chunks a request); `backend`: what served it (the
    simulation, or "ppprof" for the real pipeline)."""
    ttft = np.array([r.ttft for r in served.requests])
    duration_s = served.span_ms / 1e3
    total = sum(r.prompt_len for r in served.requests)
    cached = sum(r.cached for r in served.requests)
    return {
        "backend": backend,
        "dataset_name": "mooncake-trace",
        "arm": arm,
        "completed": len(served.requests),
        "duration": duration_s,
        "total_input_tokens": total,
        "request_throughput": len(served.requests) / duration_s if duration_s > 0 else None,
        "input_throughput": total / duration_s if duration_s > 0 else None,
        "mean_ttft_ms": float(ttft.mean()),
        "median_ttft_ms": float(np.median(ttft)),
        "std_ttft_ms": float(ttft.std()),
        "p90_ttft_ms": float(np.percentile(ttft, 90)),
        "p99_ttft_ms": float(np.percentile(ttft, 99)),
        "prefix_hit_share": cached / total if total else 0.0,
        "cached_input_tokens": cached,
        "chunks_per_request": float(np.mean([len(r.chunks) for r in served.requests])),
        "prefix_cache": None if cache is None else {"capacity_tokens": cache.capacity_blocks * cache.block_tokens},
    }


def details(served: Served) -> dict:
    """bench_serving's --output-details: per request, in arrival order."""
    return {
        "arrival_ms": [r.arrival for r in served.requests],
        "input_lens": [r.prompt_len for r in served.requests],
        "cached_lens": [r.cached for r in served.requests],
        "ttfts_ms": [r.ttft for r in served.requests],
        "chunks": [list(r.chunks) for r in served.requests],
    }


def replay(
    policy: Policy,
    trace: Trace,
    arms: tuple[str, ...],
    pp_size: int,
    async_depth: int = 0,
    cache_tokens: int | None = None,
    with_details: bool = False,
) -> list[dict]:
    """Every arm's run of the trace part (metrics(), with details() where asked), each with a prefix cache of
    `cache_tokens` (None: the pool's tokens; 0: no cache, every prefill cold) that starts empty."""
    if policy.planning_model is None:
        raise ValueError(
            f"the policy has no latency model ({policy.status}: {policy.reason}): the simulation prices batches "
            "with it; profile again"
        )
    stage_ms = packed_stage_ms(policy.planning_model, pp_size, policy.extra_piece_ms)
    prompts = [r.prompt_len for r in trace.requests]
    arrivals = [r.arrival_ms for r in trace.requests]
    blocks = [r.blocks for r in trace.requests]
    kv = pool_tokens(trace)
    budget = kv if cache_tokens is None else cache_tokens
    out = []
    for arm in arms:
        cache = PrefixCache(budget, trace.block_tokens) if budget else None
        served = serve(
            pp_size,
            sizer(policy, arm),
            stage_ms,
            Capacity(kv, REQUEST_ENTRIES),
            Arrivals(prompts, trace=TraceArrivals(arrivals, blocks, cache)),
            async_depth,
        )
        run = metrics(served, trace, arm, cache)
        out.append(run | {"details": details(served)} if with_details else run)
    return out

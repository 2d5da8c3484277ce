"""The serving simulation: the scheduler (ppprof.serving.scheduler) driven by arrivals, its batches timed by a latency
model instead of ranks, as a discrete-event simulation of the pipeline. Each stage runs one batch at a time, in the
order the scheduler sent them; a batch enters stage s when stage s is free and the batch has left stage s - 1. The
scheduler serves the slots round robin and, as SGLang's PP loop does, waits for a slot's previous batch to leave the
last stage before it builds that slot's next one. Pure: no torch, no clock (milliseconds of model time)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ppprof.serving.prefix_cache import PrefixCache
from ppprof.serving.scheduler import Batch, Capacity, Request, Scheduler, Sizer


@dataclass(frozen=True, slots=True)
class LoadLevel:
    """A closed loop of `concurrency` requests in flight (a new one arrives as one finishes), or Poisson arrivals at
    `rate` requests a second."""

    concurrency: int | None = None
    rate: float | None = None

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ValueError("a load level is a concurrency or a request rate: give one")

    @property
    def name(self) -> str:
        return f"concurrency-{self.concurrency}" if self.concurrency is not None else f"rate-{self.rate:g}"


@dataclass(frozen=True, slots=True)
class TraceArrivals:
    """A request trace's part as a level serves it: each request's arrival (ms into the level) and block ids, and the
    prefix cache (ppprof.serving.prefix_cache, empty at the start) that its prefills start past; None: no cache."""

    arrivals_ms: Sequence[float]
    blocks: Sequence[tuple[int, ...]]
    cache: PrefixCache | None


@dataclass(frozen=True, slots=True)
class Arrivals:
    """The requests a level serves (serve), in arrival order, and when they arrive: at a load `level`, or (level None)
    at a request trace's times."""

    prompts: Sequence[int]
    """Each request's prompt length."""
    level: LoadLevel | None = None
    seed: int = 0
    """The load level, and the seed of its Poisson arrival times."""
    trace: TraceArrivals | None = None
    """A trace's arrival times, each prompt's block ids and the prefix cache its prefills start past."""


@dataclass(slots=True)
class Served:
    """What one level did: each request (its arrival, chunks and finish), each batch with its slot and times, and the
    stages' busy time."""

    requests: list[Request]
    batches: list[tuple[Batch, float, float]]
    """(batch, time it entered the first stage, time it left the last), in the order sent."""
    busy_ms: list[float]
    """Per stage: the time it ran batches."""

    @property
    def span_ms(self) -> float:
        """From the first arrival to the last finish."""
        return max(r.finish for r in self.requests) - min(r.arrival for r in self.requests)

    def summary(self) -> dict:
        """Input throughput, TTFT mean and quantiles (and each request's, by arrival), the stages' idle fraction,
        chunks per request, requests per batch."""
        ttft = np.array([r.ttft for r in self.requests])
        span = self.span_ms
        return {
            "num_requests": len(self.requests),
            "throughput_tokens_per_s": sum(r.prompt_len for r in self.requests) / (span / 1e3) if span > 0 else None,
            "ttft_ms": {
                "mean": float(ttft.mean()),
                "p50": float(np.percentile(ttft, 50)),
                "p90": float(np.percentile(ttft, 90)),
                "p99": float(np.percentile(ttft, 99)),
            },
            "idle_fraction": 1.0 - sum(self.busy_ms) / (len(self.busy_ms) * span) if span > 0 else None,
            "ttft_ms_by_request": [float(x) for x in ttft],
            "chunks_per_request": float(np.mean([len(r.chunks) for r in self.requests])),
            "requests_per_batch": float(np.mean([len(b.pieces) for b, _, _ in self.batches])),
        }


def prompts_of(lengths: Sequence[int], weights: Sequence[float], num_prompts: int, seed: int) -> list[int]:
    """`num_prompts` prompt lengths drawn from a workload's lengths with its weights."""
    rng = np.random.default_rng(seed)
    p = np.asarray(weights, dtype=float)
    return [int(n) for n in rng.choice(np.asarray(lengths), size=num_prompts, p=p / p.sum())]


def arrival_times(level: LoadLevel, num_prompts: int, seed: int) -> list[float] | None:
    """Poisson arrival times in ms (the first at 0); None for a closed loop (arrivals follow finishes)."""
    if level.rate is None:
        return None
    gaps = np.random.default_rng(seed + 1).exponential(1e3 / level.rate, size=num_prompts)
    return list(np.concatenate([[0.0], np.cumsum(gaps[1:])]))


def serve(
    pp_size: int,
    sizer: Sizer,
    stage_ms: Callable[[Batch], Sequence[float]],
    capacity: Capacity,
    arrivals: Arrivals,
    async_depth: int = 0,
) -> Served:
    """Serve `arrivals`' prompts (in arrival order) at its level, or (level None) at its trace's times (ms);
    `stage_ms(batch)` is each stage's time for a batch (pp_size of them). The scheduler serves pp_size + `async_depth`
    micro-batch slots (SGLang's pp_async_batch_depth, 0 by default). With a trace's block ids and cache, a prompt's
    prefill starts after its cached prefix."""
    prompts, level, trace = arrivals.prompts, arrivals.level, arrivals.trace
    slots = pp_size + async_depth
    scheduler = Scheduler(slots, sizer, capacity, None if trace is None else trace.cache)
    times = list(trace.arrivals_ms) if trace is not None else arrival_times(level, len(prompts), arrivals.seed)
    ids = list(trace.blocks) if trace is not None else [()] * len(prompts)
    queue = deque() if times is None else deque(zip(times, range(len(prompts)), prompts))
    issued = 0 if times is not None else min(level.concurrency, len(prompts))
    for rid in range(issued):
        scheduler.arrive(Request(rid, prompts[rid], 0.0, blocks=ids[rid]))
    stage_free, busy = [0.0] * pp_size, [0.0] * pp_size
    leaves: dict[int, float] = {}
    batches: list[tuple[Batch, float, float]] = []
    done: list[Request] = []
    now, slot = 0.0, 0
    while len(done) < len(prompts):
        if slot in leaves:  # the loop waits for this slot's batch to leave the last stage
            now = max(now, leaves.pop(slot))
            for request in scheduler.finish(slot, now):
                done.append(request)
                if times is None and issued < len(prompts):  # closed loop: the next request arrives now
                    scheduler.arrive(Request(issued, prompts[issued], now, blocks=ids[issued]))
                    issued += 1
        while queue and queue[0][0] <= now:
            t, rid, n = queue.popleft()
            scheduler.arrive(Request(rid, n, t, blocks=ids[rid]))
        batch = scheduler.next_batch(slot)
        if batch is not None:
            start = end = now
            for s, ms in enumerate(stage_ms(batch)):
                start = max(end, stage_free[s])
                end = stage_free[s] = start + ms
                busy[s] += ms
                if s == 0:
                    first = start
            leaves[slot] = end
            batches.append((batch, first, end))
        elif not leaves and queue:  # nothing in the pipeline: time moves to the next arrival
            now = max(now, queue[0][0])
        elif not leaves and not queue and len(done) < len(prompts):  # nothing in the pipeline or to come: a stall
            raise RuntimeError(f"the scheduler stalled with {len(prompts) - len(done)} requests left")
        slot = (slot + 1) % slots
    assert scheduler.idle and capacity.full, "a request kept what it held"
    return Served(sorted(done, key=lambda r: r.rid), batches, busy)

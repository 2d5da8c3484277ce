"""The per-chunk pipeline overhead: what a chunk costs on the real pipeline beyond its stages' timed forwards
(transfers, launches, the scheduling step), solved from a measured TTFT against the replay of the stages' own
timings, and its summary for run.json from what the prompts measured. Pure: numpy; the profile job runs the prompts
(ppprof.run.measure)."""

from __future__ import annotations

import numpy as np

from ppprof.chunks import align_down
from ppprof.policy.timeline import replay

OVERHEAD_CHUNKS = 8
"""Chunks of each fixed plan."""
OVERHEAD_MULTIPLES = (0.25, 1.0, 2.0)
"""Chunk sizes of the fixed plans, in multiples of B (aligned down to the page, at most the largest probe chunk)."""
DEEP_PREFIX_CHUNKS = 8
"""The smallest size's plan runs after this many B-sized chunks (fewer where the KV pool holds less): lockstep probes
of small chunks run colder than pipelined ones at deep prefixes most, and the calibration must see those cells."""
MIN_CHUNKS = 2
"""The fewest chunks a plan keeps where the KV pool holds fewer than OVERHEAD_CHUNKS: a pipeline needs two."""
MEDIAN_SE = 1.2533 * 1.4826
"""The median's standard error is ~1.2533 sigma / sqrt(n) (normal samples), sigma ~1.4826 x the MAD."""
METHOD = (
    f"fixed plans of {OVERHEAD_CHUNKS} chunks at B/4, B and 2B (the B/4 plan after {DEEP_PREFIX_CHUNKS} "
    "chunks of B) run pipelined through the profile's stages after its probes, interleaved, after one warm-up; "
    "each run's overhead o solves replay(stage times + o) = measured TTFT, "
    "o = (measured - replay) / (num_chunks + num_stages - 1)"
)


def overhead_chunk_sizes(base_chunk_size: int, page_size: int, max_chunk_size: int) -> list[int]:
    """The fixed plans' chunk sizes: B/4, B and 2B aligned down to the page (at least one page), at most
    `max_chunk_size` (the largest probe chunk), distinct, smallest first."""
    sizes = {
        min(max(align_down(int(m * base_chunk_size), page_size), page_size), max_chunk_size) for m in OVERHEAD_MULTIPLES
    }
    return sorted(sizes)


def overhead_plans(
    chunk_sizes: list[int], capacity: int, repeats: int, base_chunk_size: int | None = None
) -> tuple[tuple[int, ...], list[tuple[int, tuple[int, ...]]]]:
    """The warm-up prompt's chunks (one of each size, as many as fit) and the timed prompts, (repeat, chunks) in the
    order they run: `repeats` rounds of one plan a size, each round starting one size later (interleaved, so no size
    always runs first). A plan has OVERHEAD_CHUNKS chunks, fewer where `capacity` (the tokens a request can hold) is
    smaller; a size with under MIN_CHUNKS chunks is left out (none left: no prompt). With `base_chunk_size` B, the
    plan of the smallest size below B starts after up to DEEP_PREFIX_CHUNKS chunks of B, as many as the rest of the
    capacity holds (its size is its last chunk's)."""
    plans = {n: (n,) * min(OVERHEAD_CHUNKS, capacity // n) for n in chunk_sizes if capacity // n >= MIN_CHUNKS}
    sizes = list(plans)
    if not sizes:
        return (), []
    small = sizes[0]
    if base_chunk_size and small < base_chunk_size:
        deep = min(DEEP_PREFIX_CHUNKS, (capacity - sum(plans[small])) // base_chunk_size)
        plans[small] = (base_chunk_size,) * deep + plans[small]
    warmup = []
    for n in sizes:  # the smallest always fits (it fits twice)
        if sum(warmup) + n <= capacity:
            warmup.append(n)
    timed = [(r, plans[sizes[(r + i) % len(sizes)]]) for r in range(repeats) for i in range(len(sizes))]
    return tuple(warmup), timed


def chunk_overhead_ms(stage_ms, measured_ms: float) -> float:
    """The overhead o (ms a chunk) such that the replay of `stage_ms` ((P, n), stage s's forward of chunk k) with
    every stage's time of every chunk increased by o ends at `measured_ms`.

    The replay's end is the longest monotone path through the (stage, chunk) cells from (0, 0) to (P - 1, n - 1),
    and every such path crosses n + P - 1 cells, so adding o to each cell moves the end by exactly (n + P - 1) o:
        replay(t + o) = replay(t) + (n + P - 1) o,  o = (measured - replay(t)) / (n + P - 1).
    Negative where the pipeline ran faster than its stages' timings compose (noise)."""
    t = np.asarray(stage_ms, dtype=float)
    pp_size, num_chunks = t.shape
    return (float(measured_ms) - float(replay(t)[1][-1, -1])) / (num_chunks + pp_size - 1)


def overhead_run(chunk_sizes, stage_ms, measured_ms: float, repeat: int) -> dict:
    """One run's record in run.json's pipeline_overhead.runs: its plan's size (its last chunk's) and chunks, and every
    stage's forward of every chunk (stage_ms, (P, n): what the fit's calibration onto the pipelined runs reads,
    ppprof.fit.calibrate)."""
    t = np.asarray(stage_ms, dtype=float)
    return {
        "chunk_size": int(chunk_sizes[-1]),
        "num_chunks": len(chunk_sizes),
        "chunk_sizes": [int(n) for n in chunk_sizes],
        "repeat": int(repeat),
        "measured_ms": round(float(measured_ms), 4),
        "replay_ms": round(float(replay(t)[1][-1, -1]), 4),
        "ms_per_chunk": round(chunk_overhead_ms(t, measured_ms), 4),
        "stage_ms": [[round(float(v), 4) for v in row] for row in t],
    }


def pipeline_overhead(
    timed: list[tuple[int, tuple[int, ...]]], rows: list[dict], ttft_ms: dict[int, float], pp_size: int
) -> dict:
    """run.json's pipeline_overhead from what the timed prompts measured: `timed` the (repeat, chunks) plans of
    overhead_plans, run as prompts 1, 2, ... after the warm-up (prompt 0); `rows` every stage's chunks of them, as
    the bench executor records them (prompt, stage, chunk, compute_ms; the warm-up's too, unread); `ttft_ms` each
    prompt's TTFT by its index."""
    stage_ms = {}  # prompt -> {(stage, chunk): ms}
    for row in rows:
        stage_ms.setdefault(row["prompt"], {})[(row["stage"], row["chunk"])] = row["compute_ms"]
    runs = [
        overhead_run(
            chunks, [[stage_ms[i][(s, k)] for k in range(len(chunks))] for s in range(pp_size)], ttft_ms[i], repeat
        )
        for i, (repeat, chunks) in enumerate(timed, start=1)
    ]
    return summarize(runs, pp_size)


def median_stderr(values) -> float:
    """The median's standard error from the spread (MEDIAN_SE x MAD / sqrt(n)); with one value, no spread tells
    it: as large as the value."""
    v = np.asarray(values, dtype=float)
    if len(v) < 2:
        return abs(float(v[0])) if len(v) else 0.0
    return MEDIAN_SE * float(np.median(np.abs(v - np.median(v)))) / float(np.sqrt(len(v)))


def summarize(runs: list[dict], pp_size: int) -> dict:
    """run.json's pipeline_overhead: the median ms a chunk over every run, its standard error, the median at each
    chunk size, and the runs."""
    values = [r["ms_per_chunk"] for r in runs]
    sizes = sorted({r["chunk_size"] for r in runs})
    by_size = {
        str(n): round(float(np.median([r["ms_per_chunk"] for r in runs if r["chunk_size"] == n])), 4) for n in sizes
    }
    return {
        "ms_per_chunk": round(float(np.median(values)), 4),
        "stderr_ms": round(median_stderr(values), 4),
        "num_stages": int(pp_size),
        "method": METHOD,
        "by_chunk_size": by_size,
        "runs": runs,
    }

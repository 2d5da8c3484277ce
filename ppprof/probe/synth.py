"""Synthesis of probe requests (pure, deterministic from the seed): the grid design's prefix-free sweep, its wide
probe and prefix grid, and the warm-up requests of any design (ppprof.adaptive chooses the adaptive design's probes)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from ppprof.chunks import align_down
from ppprof.config import ProfileConfig, sweep_chunk_sizes
from ppprof.config.sections import SGLANG_PROBE_MULTIPLE

SWEEP = "sweep"
WIDE = "wide"
PREFIX = "prefix"
DESIGN = "design"
NUM_GRID_CHUNKS = 8
"""Distinct chunk sizes of a prefix probe within SGLang's range (1.25 B down to B / 8)."""
NUM_WIDE_CHUNKS = 3
"""Distinct chunk sizes above 1.25 B, up to the largest probe chunk: where first chunks 2-4x later ones go."""
WIDE_SHARE = 8
"""One request in WIDE_SHARE of a prefix probe (at least one) takes a wide chunk size, the largest first, so that
the probe costs less than a grid of the wide sizes alike; the wide probe holds as many (at least one a size)."""


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    """One synthetic prefill: `chunk_size` new tokens after `prefix_len` cached ones (rid unique in the run)."""

    rid: int
    prefix_len: int
    chunk_size: int


@dataclass(frozen=True, slots=True)
class Probe:
    """A batch of up to 128 requests run back to back, their Mamba slots taken in one grouped window."""

    index: int
    kind: str
    requests: tuple[ProbeRequest, ...]
    design_step: int = 0
    """0: the initial design (every probe of a grid run); k: the k-th batch the adaptive design added."""

    @property
    def forward_tokens(self) -> int:
        """Tokens this probe runs through each stage (prefixes are written, not computed)."""
        return sum(r.chunk_size for r in self.requests)


def grid_chunk_sizes(base_chunk_size: int, align: int, num_sizes: int = NUM_GRID_CHUNKS) -> list[int]:
    """Distinct chunk sizes of a prefix probe within SGLang's range, linear from 1.25 x B down to B / 8, aligned."""
    top, bottom = int(SGLANG_PROBE_MULTIPLE * base_chunk_size), max(1, base_chunk_size // 8)
    sizes = {align_down(round(top - i * (top - bottom) / (num_sizes - 1)), align) for i in range(num_sizes)}
    return sorted(sizes, reverse=True)


def wide_chunk_sizes(
    base_chunk_size: int, max_chunk_size: int, align: int, num_sizes: int = NUM_WIDE_CHUNKS
) -> list[int]:
    """Distinct chunk sizes above 1.25 x B up to `max_chunk_size` (an aligned size), log-spaced, aligned down,
    largest first; none where the largest probe chunk is 1.25 B."""
    low = int(SGLANG_PROBE_MULTIPLE * base_chunk_size)
    if max_chunk_size <= low:
        return []
    ratio = max_chunk_size / low
    sizes = {align_down(round(low * ratio ** (i / num_sizes)), align) for i in range(1, num_sizes + 1)}
    return sorted((s for s in sizes if s > low), reverse=True)


def make_probes(cfg: ProfileConfig) -> list[Probe]:
    """The grid design's probes: probe 0 is the prefix-free sweep (SGLang's start-up profile); then, where the
    largest probe chunk is above 1.25 B, the prefix-free wide probe (the wide sizes only); then one probe per prefix
    length, its requests cycling through the grid's chunk sizes, one in WIDE_SHARE through the wide ones, in a
    seeded random order. Request ids are unique across the run."""
    n, align = cfg.probes.requests_per_probe, cfg.chunk_unit
    probes = [
        Probe(
            0,
            SWEEP,
            tuple(ProbeRequest(i, 0, c) for i, c in enumerate(sweep_chunk_sizes(cfg.probes.base_chunk_size, n, align))),
        )
    ]
    grid = grid_chunk_sizes(cfg.probes.base_chunk_size, align)
    wide = wide_chunk_sizes(cfg.probes.base_chunk_size, cfg.max_probe_chunk_size, align)
    num_wide = max(1, n // WIDE_SHARE) if wide else 0
    shapes = [(WIDE, 0, [wide[i % len(wide)] for i in range(max(num_wide, len(wide)))])] if wide else []
    shapes += [
        (PREFIX, p, [grid[i % len(grid)] for i in range(n - num_wide)] + [wide[i % len(wide)] for i in range(num_wide)])
        for p in cfg.resolved_prefix_lens()
    ]
    rid = n
    for kind, prefix_len, chunks in shapes:
        k = len(probes)
        random.Random(cfg.probes.seed * 7919 + k).shuffle(chunks)
        probes.append(Probe(k, kind, tuple(ProbeRequest(rid + i, prefix_len, c) for i, c in enumerate(chunks))))
        rid += len(chunks)
    return probes


def warmup_requests(probes: list[Probe], count: int, every_size: bool = False) -> list[ProbeRequest]:
    """Untimed requests before the first timed one: `count` shaped like the first (largest) sweep requests, then one
    per prefix probe with its prefix, so that no timed request is the first of its kind. Negative ids keep them
    apart from the probes'. An adaptive design's warm-up: `count` of its largest chunk without a prefix, then its
    smallest chunk at each of its prefix lengths (cheap, and each prefix length met once before it is timed).
    `every_size` (on a GPU) adds one request without a prefix of every other chunk size the probes time: a GPU's first
    forward of a new size picks its kernels (43-60 ms against 3-5 ms warm on an H200, results/gpu-check-h200/), so
    that no timed row is a size's first."""
    if probes[0].kind == DESIGN:
        reqs = probes[0].requests
        largest = max(r.chunk_size for r in reqs)
        deep = sorted({r.prefix_len for r in reqs} - {0})
        shapes = [(0, largest)] * count + [(p, min(r.chunk_size for r in reqs if r.prefix_len == p)) for p in deep]
    else:
        first = probes[0].requests
        shapes = [(0, first[i % len(first)].chunk_size) for i in range(count)]
        if count:
            shapes += [(p.requests[0].prefix_len, max(r.chunk_size for r in p.requests)) for p in probes[1:]]
    if not count:
        return []
    if every_size:
        met = {c for _, c in shapes}
        shapes += [(0, c) for c in sorted({r.chunk_size for p in probes for r in p.requests} - met)]
    return [ProbeRequest(-1 - i, p, c) for i, (p, c) in enumerate(shapes)]

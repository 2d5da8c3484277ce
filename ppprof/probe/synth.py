"""Synthesis of probe requests (pure, deterministic from the seed): the prefix-free sweep and the prefix grid, or the
adaptive design's probes (ppprof.fit.design chooses their points)."""

from __future__ import annotations

import random
from dataclasses import dataclass

from ppprof.chunks import align_down
from ppprof.config import ProfileConfig, sweep_chunk_sizes
from ppprof.fit.design import initial_design

SWEEP = "sweep"
PREFIX = "prefix"
DESIGN = "design"
NUM_GRID_CHUNKS = 8
"""Distinct chunk sizes in a prefix probe."""
NUM_CANDIDATE_CHUNKS = 12
NUM_CANDIDATE_PREFIXES = 12
"""The adaptive design's candidate grid: prefix 0 and 12 prefix lengths log-spaced from B to the context (or
--prefix-lens where given), times 12 chunk sizes from 1.25 B down to B / 8."""


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
    """Distinct chunk sizes of a prefix probe, linear from 1.25 x B down to B / 8, aligned."""
    top, bottom = int(1.25 * base_chunk_size), max(1, base_chunk_size // 8)
    sizes = {align_down(round(top - i * (top - bottom) / (num_sizes - 1)), align) for i in range(num_sizes)}
    return sorted(sizes, reverse=True)


def candidate_grid(cfg: ProfileConfig) -> tuple[list[int], list[int]]:
    """(prefix_len, chunk_size) of every candidate of the adaptive design, as two lists."""
    prefixes = (0,) + (cfg.resolved_prefix_lens() if cfg.prefix_lens is not None
                       else cfg.resolved_prefix_lens(NUM_CANDIDATE_PREFIXES))
    chunks = grid_chunk_sizes(cfg.base_chunk_size, cfg.page_size, NUM_CANDIDATE_CHUNKS)
    pairs = [(p, c) for p in sorted(set(prefixes)) for c in chunks]
    return [p for p, _ in pairs], [c for _, c in pairs]


def design_probe(index: int, step: int, points: list[tuple[int, int]], first_rid: int, seed: int) -> Probe:
    """A probe of the adaptive design: `points` (prefix_len, chunk_size) in a seeded random order, so that repeats
    of a point are not run back to back."""
    order = list(points)
    random.Random(seed * 7919 + index).shuffle(order)
    return Probe(index, DESIGN, tuple(ProbeRequest(first_rid + i, p, c) for i, (p, c) in enumerate(order)), step)


def make_probes(cfg: ProfileConfig) -> list[Probe]:
    """Grid design: probe 0 is the prefix-free sweep; then one probe per prefix length, its requests cycling through
    the grid's chunk sizes in a seeded random order. Adaptive design: the initial design's one probe (the next ones
    are chosen as the run goes). Request ids are unique across the run."""
    if cfg.design == "adaptive":
        L, x = candidate_grid(cfg)
        return [design_probe(0, 0, initial_design(L, x, cfg.base_chunk_size), 0, cfg.seed)]
    n, align = cfg.requests_per_probe, cfg.page_size
    probes = [Probe(0, SWEEP, tuple(ProbeRequest(i, 0, c)
                                    for i, c in enumerate(sweep_chunk_sizes(cfg.base_chunk_size, n, align))))]
    grid = grid_chunk_sizes(cfg.base_chunk_size, align)
    for k, prefix_len in enumerate(cfg.resolved_prefix_lens(), start=1):
        chunks = [grid[i % len(grid)] for i in range(n)]
        random.Random(cfg.seed * 7919 + k).shuffle(chunks)
        probes.append(Probe(k, PREFIX, tuple(ProbeRequest(k * n + i, prefix_len, c) for i, c in enumerate(chunks))))
    return probes


def warmup_requests(probes: list[Probe], count: int) -> list[ProbeRequest]:
    """Untimed requests before the first timed one: `count` shaped like the first (largest) sweep requests, then one
    per prefix probe with its prefix, so that no timed request is the first of its kind. Negative ids keep them
    apart from the probes'. An adaptive design's warm-up: `count` of its largest chunk without a prefix, then its
    smallest chunk at each of its prefix lengths (cheap, and each prefix length met once before it is timed)."""
    if probes[0].kind == DESIGN:
        reqs = probes[0].requests
        largest = max(r.chunk_size for r in reqs)
        deep = sorted({r.prefix_len for r in reqs} - {0})
        shapes = [(0, largest)] * count + [(p, min(r.chunk_size for r in reqs if r.prefix_len == p)) for p in deep]
        return [ProbeRequest(-1 - i, p, c) for i, (p, c) in enumerate(shapes)] if count else []
    first = probes[0].requests
    out = [ProbeRequest(-1 - i, 0, first[i % len(first)].chunk_size) for i in range(count)]
    if count:
        out += [ProbeRequest(-1 - count - k, p.requests[0].prefix_len, max(r.chunk_size for r in p.requests))
                for k, p in enumerate(probes[1:])]
    return out

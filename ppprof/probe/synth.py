"""Synthesis of probe requests (pure, deterministic from the seed): the prefix-free sweep and the prefix grid."""

from __future__ import annotations

import random
from dataclasses import dataclass

from ppprof.config import ProfileConfig

SWEEP = "sweep"
PREFIX = "prefix"
NUM_GRID_CHUNKS = 8
"""Distinct chunk sizes in a prefix probe."""


@dataclass(frozen=True, slots=True)
class ProbeRequest:
    rid: int
    prefix_len: int
    chunk_len: int


@dataclass(frozen=True, slots=True)
class Probe:
    index: int
    kind: str
    requests: tuple[ProbeRequest, ...]

    @property
    def num_tokens(self) -> int:
        return sum(r.chunk_len for r in self.requests)


def align_down(x: int, unit: int) -> int:
    """x rounded down to a multiple of unit, but at least one unit."""
    return max(unit, x // unit * unit)


def sweep_chunk_sizes(base_chunk_size: int, num_requests: int, align: int) -> list[int]:
    """Sizes falling linearly from 1.25 x B to about 1.25 x B / 128 whatever the number of requests n, each aligned
    down to `align`. With n = 128 this is SGLang's start-up profile, size_i = 1.25B - i * (1.25B // 128)."""
    top = int(1.25 * base_chunk_size)
    step = (top - top // 128) / (num_requests - 1) if num_requests > 1 else 0
    return [align_down(int(top - i * step), align) for i in range(num_requests)]


def grid_chunk_sizes(base_chunk_size: int, align: int, num_sizes: int = NUM_GRID_CHUNKS) -> list[int]:
    """Distinct chunk sizes of a prefix probe, linear from 1.25 x B down to B / 8, aligned."""
    top, bottom = int(1.25 * base_chunk_size), max(1, base_chunk_size // 8)
    sizes = {align_down(round(top - i * (top - bottom) / (num_sizes - 1)), align) for i in range(num_sizes)}
    return sorted(sizes, reverse=True)


def make_probes(cfg: ProfileConfig) -> list[Probe]:
    """Probe 0 is the prefix-free sweep; then one probe per prefix length, its requests cycling through the grid's
    chunk sizes in a seeded random order. Request ids are unique across the run."""
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
    apart from the probes'."""
    first = probes[0].requests
    out = [ProbeRequest(-1 - i, 0, first[i % len(first)].chunk_len) for i in range(count)]
    if count:
        out += [ProbeRequest(-1 - count - k, p.requests[0].prefix_len, max(r.chunk_len for r in p.requests))
                for k, p in enumerate(probes[1:])]
    return out

"""Helpers of the specs tests."""

from __future__ import annotations

from dataclasses import fields

from ppprof.specs.memory import CacheSizes, PeakRequest, StageMemory, stage_memory


def memory_of(spec, layers: range, *, stage_idx: int = 0, **flat) -> StageMemory:
    """stage_memory from the flat keywords the tests write: the pools' sizes (CacheSizes) and the largest probe
    request with its dtype, backend and device (PeakRequest)."""
    sizes = CacheSizes(**{f.name: flat.pop(f.name) for f in fields(CacheSizes)})
    return stage_memory(spec, layers, sizes, PeakRequest(**flat), stage_idx)

"""The fit SGLang and vllm-ascend make at start-up: least squares of f(l) = a l^2 + b l + c on their prefix-free
forwards, in order, the first dropped (it ran cold). Unclamped: each server applies its own clamps. Pure numpy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ppprof.policy.rule import LatencyModel

MIN_POINTS = 8
"""The fewest prefix-free forwards (after the first is dropped) the boot fit needs (SGLang's minimum)."""


class Forwards(Protocol):
    """Timed forwards in the order they ran: one row each (ppprof.fit's Samples is one)."""

    prefix_len: np.ndarray  # (n,) int
    chunk_size: np.ndarray  # (n,) int
    chunk_latency_ms: np.ndarray  # (n,) float


@dataclass(frozen=True, slots=True)
class BootFit:
    """The boot fit of some forwards: the row dropped, the rows fitted (0-based), and the quadratic (None under
    MIN_POINTS)."""

    dropped: np.ndarray
    used: np.ndarray
    model: LatencyModel | None


SWEEP = "sweep"
"""The kind of the rows of SGLang's own start-up profile (the prefix-free sweep of 1.25 B down to ~B/128)."""


def prefix_free_quadratic(forwards: Forwards) -> BootFit:
    """1. the prefix-free rows in order (those of the sweep, where the rows say their kind and hold one: what the
    server's own start-up profile runs, not the wider probes above 1.25 B); 2. the first dropped; 3. numpy's lstsq on
    [l^2, l, 1] of the rest, unless fewer than MIN_POINTS remain."""
    free = np.asarray(forwards.prefix_len) == 0
    kind = getattr(forwards, "kind", None)
    if kind is not None and (np.asarray(kind) == SWEEP).any():
        free &= np.asarray(kind) == SWEEP
    rows = np.flatnonzero(free)
    used = rows[1:]
    if len(used) < MIN_POINTS:
        return BootFit(rows[:1], used, None)
    length = np.asarray(forwards.chunk_size)[used].astype(np.float64)
    design = np.column_stack([length * length, length, np.ones_like(length)])
    (a, b, c), *_ = np.linalg.lstsq(design, np.asarray(forwards.chunk_latency_ms)[used], rcond=None)
    return BootFit(rows[:1], used, LatencyModel("quadratic", a=float(a), b=float(b), c=float(c)))

"""Chunk arithmetic every layer shares: aligning a token count to a unit, the default floor of a chunk, and walking a
prompt chunk by chunk under a rule. Pure Python; imports nothing of ppprof."""

from __future__ import annotations

import math
from collections.abc import Callable

MIN_ALIGNMENT = 64
"""Chunk sizes of a dynamic rule are multiples of max(page size, 64), as SGLang aligns them."""


def default_alignment(page_size: int, tp_size: int = 1) -> int:
    """The alignment unit of chunk sizes on a server with this KV page size and TP degree: max(page_size, 64), and a
    multiple of tp_size too (a server's token split across TP ranks needs chunks divisible by them)."""
    return math.lcm(max(page_size, MIN_ALIGNMENT), tp_size)


def chunk_unit(page_size: int, tp_size: int = 1) -> int:
    """What every probe chunk is a multiple of: whole pages, split evenly over the TP ranks (lcm(page, tp))."""
    return math.lcm(page_size, tp_size)


def default_floor(base_chunk_size: int) -> int:
    """The smallest chunk a dynamic rule gives before alignment, by default: B // 4 (SGLang's floor), at least 1."""
    return max(base_chunk_size // 4, 1)


def ceil_div(x: int, unit: int) -> int:
    """How many `unit`s hold `x` (x / unit rounded up), in integers."""
    return -(-x // unit)


def align_up(x: int, unit: int) -> int:
    """x rounded up to a multiple of unit."""
    return ceil_div(x, unit) * unit


def align_down(x: int, unit: int) -> int:
    """x rounded down to a multiple of unit, but at least one unit."""
    return max(unit, x // unit * unit)


def walk(size_at: Callable[[int], int], prompt_len: int) -> list[int]:
    """The chunks of a `prompt_len`-token prompt under a rule: size_at(done) is the next chunk after `done` tokens
    are prefilled; the last chunk takes the rest. ValueError where the rule gives a chunk of less than one token."""
    chunks, done = [], 0
    while done < prompt_len:
        size = min(int(size_at(done)), prompt_len - done)
        if size < 1:
            raise ValueError(f"the rule gave a chunk of {size} tokens after {done}: check the chunk settings")
        chunks.append(size)
        done += size
    return chunks


def positive_root(qa: float, qb: float, qc: float) -> float | None:
    """The root (-qb + sqrt(qb^2 - 4 qa qc)) / (2 qa) of qa x^2 + qb x + qc = 0 (qa != 0) where it is real, finite
    and positive, else None (for qa > 0 the larger root; the caller solves qa == 0 itself)."""
    disc = qb * qb - 4.0 * qa * qc
    if qa == 0 or disc < 0:
        return None
    x = (-qb + math.sqrt(disc)) / (2.0 * qa)
    return x if math.isfinite(x) and x > 0 else None

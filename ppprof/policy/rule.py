"""Latency models of a prefill chunk, and the greedy equal-latency next-chunk rule built on them, with its lookup table.

Both models are kept as the four coefficients of the prefix-aware form (ATOM's), so that planning is the same code:

    chunk latency  t(L, x) = c + g L + b x + a (2 L x + x^2)     (L = prefix_len cached tokens, x = chunk_size new ones)

- `quadratic` (SGLang's): f(l) = a l^2 + b l + c, fitted (as SGLang does) on prefix-free requests only, where a
  request of l tokens really takes f(l); g = 0. A chunk of x tokens after L cached ones costs the fixed cost plus the
  growth of f: c + f(L + x) - f(L), which is the form above with g = 0.
- `prefix` (ATOM's): t(L, x) fitted directly; g is the per-chunk work proportional to the prefix.


Rule for a prompt whose first `L` tokens are already prefilled (B = base chunk size, s = smooth factor):
  1. L == 0: the first chunk is B.
  2. x = positive root of the model's equal-latency equation (see LatencyModel.equal_latency_chunk); none: B.
  3. smoothed = int(B + s (x - B)), floored at min_chunk_size (default B // 4, SGLang's floor).
  4. aligned down to the alignment, at least one alignment unit.
  5. capped at min(context_len - L - CONTEXT_MARGIN, max_chunk_size), aligned down again; 0 means "use B".
The cap applies from the second chunk on: max_chunk_size (SGLang's max_prefill_tokens) may be below B, and the
first chunk is B all the same, as in SGLang.
The models themselves (LatencyModel) are the contract's (ppprof.policy.contract). Pure Python; no torch.
"""

from __future__ import annotations

import math

from ppprof.chunks import ChunkSettings
from ppprof.policy.contract import COEF_UNITS, FORMS, MODEL_COEFS, MODEL_NAMES, NO_CALIBRATION, LatencyModel, sglang_f

__all__ = [
    "COEF_UNITS",
    "FORMS",
    "MODEL_COEFS",
    "MODEL_NAMES",
    "NO_CALIBRATION",
    "LatencyModel",
    "build_table",
    "check_rule",
    "chunk_cap",
    "monotone_end",
    "next_chunk_size",
    "sglang_f",
]


def next_chunk_size(model: LatencyModel, settings: ChunkSettings, target_ms: float, prefix_len: int) -> int:
    """The rule in the module docstring, evaluated directly (the table is built from this)."""
    B = settings.base_chunk_size
    if prefix_len == 0:
        return B
    x = model.equal_latency_chunk(prefix_len, target_ms)
    if x is None:
        return B
    align = settings.alignment
    size = int(B + settings.smooth_factor * (x - B))
    size = max(size, settings.min_chunk_size)
    size = (size // align) * align
    size = max(size, align)
    size = min(size, chunk_cap(settings, prefix_len))
    size = (size // align) * align
    return size if size > 0 else B


def chunk_cap(settings: ChunkSettings, prefix_len: int) -> int:
    """The largest chunk allowed after `prefix_len` tokens: min(context_len - L - margin, max_chunk_size)."""
    return min(settings.context_len - prefix_len - settings.context_margin, settings.max_chunk_size)


def monotone_end(settings: ChunkSettings) -> int:
    """First prefix length at which the context cap leaves less than one alignment unit (the rule gives B again)."""
    return max(1, settings.context_len - settings.context_margin - settings.alignment + 1)


def build_table(model: LatencyModel, settings: ChunkSettings, target_ms: float) -> tuple[list[int], list[int]]:
    """Breakpoints (prefix_len starts, chunk sizes): size(L) = sizes[i] for the last i with starts[i] <= L.

    Exact for every integer L >= 0: on [1, monotone_end) the rule is non-increasing in L (the root shrinks as L grows,
    and the context cap shrinks too), so each change is found by bisection; L = 0 and L >= monotone_end give B.
    """
    B = settings.base_chunk_size
    end = monotone_end(settings)
    starts, sizes = [0], [B]

    def rule(L: int) -> int:
        return next_chunk_size(model, settings, target_ms, L)

    L = 1
    while L < end:
        size = rule(L)
        if size != sizes[-1]:
            starts.append(L)
            sizes.append(size)
        lo, hi = L, end  # rule(lo) == size; find the first L' in (lo, end) with rule(L') != size, or end
        if rule(end - 1) == size:
            break
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if rule(mid) == size:
                lo = mid
            else:
                hi = mid
        L = hi
    if sizes[-1] != B:
        starts.append(end)
        sizes.append(B)
    return starts, sizes


def check_rule(model: LatencyModel, settings: ChunkSettings, target_ms: float, num_points: int = 4096) -> None:
    """Raise ValueError unless the rule's sizes are aligned, within the clamps and non-increasing in prefix_len.

    The first chunk (prefix 0) must be B and is exempt from the cap (max_chunk_size may be below B, as SGLang's
    max_prefill_tokens may be below its chunked_prefill_size); the clamps are checked from prefix 1 on.
    """
    first = next_chunk_size(model, settings, target_ms, 0)
    if first != settings.base_chunk_size:
        raise ValueError(f"first chunk {first} is not the base chunk size {settings.base_chunk_size}")
    end = monotone_end(settings)
    step = max(1, end // num_points)
    align = settings.alignment
    previous = math.inf
    for L in range(1, end, step):
        size = next_chunk_size(model, settings, target_ms, L)
        cap = chunk_cap(settings, L)
        if size % align:
            raise ValueError(f"chunk size {size} at prefix_len {L} is not a multiple of alignment {align}")
        if not (align <= size <= cap):
            raise ValueError(f"chunk size {size} at prefix_len {L} is outside [{align}, {cap}]")
        if size > previous:
            raise ValueError(f"chunk size grows from {previous} to {size} at prefix_len {L}: sizes must not increase")
        previous = size

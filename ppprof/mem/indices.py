"""Index normalisation shared by the allocators: they accept ints, sequences, numpy arrays and torch tensors on any
device, and keep plain Python ints internally (no tensor ops on the hot path)."""

from __future__ import annotations

from typing import Any

PAD_SLOT = 0
"""Slot 0 of every slot pool is reserved: padded tokens write their K/V (or state) there."""


def to_index_list(indices: Any) -> list[int]:
    """Return `indices` as a list of Python ints. Tensors are moved to the host first (`.tolist()` does that)."""
    if isinstance(indices, int):
        return [indices]
    tolist = getattr(indices, "tolist", None)
    if tolist is not None:
        out = tolist()
        return [out] if isinstance(out, int) else [int(i) for i in _flatten(out)]
    return [int(i) for i in indices]


def _flatten(x):
    for item in x:
        if isinstance(item, list):
            yield from _flatten(item)
        else:
            yield item

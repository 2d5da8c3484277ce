"""Index normalisation shared by the allocators: they accept ints, sequences, numpy arrays and torch tensors on any
device. The KV allocator works on numpy arrays; the Mamba allocator on plain Python ints (its calls are one slot)."""

from __future__ import annotations

from typing import Any

import numpy as np

PAD_SLOT = 0
"""Slot 0 of every slot pool is reserved: padded tokens write their K/V (or state) there."""


def to_index_array(indices: Any) -> np.ndarray:
    """`indices` as a flat int64 numpy array; tensors are moved to the host first."""
    if isinstance(indices, np.ndarray):
        return indices.astype(np.int64, copy=False).ravel()
    if hasattr(indices, "detach"):  # a torch tensor, on any device
        return indices.detach().to("cpu").numpy().astype(np.int64, copy=False).ravel()
    if isinstance(indices, (int, np.integer)):
        return np.array([indices], dtype=np.int64)
    return np.asarray(list(indices), dtype=np.int64).ravel()


def to_index_list(indices: Any) -> list[int]:
    """`indices` as a list of Python ints."""
    return to_index_array(indices).tolist()

"""Request-to-token pool: one entry per live request, holding its table of positions -> KV slots and its Mamba slot.

The entry bookkeeping is plain Python; the table is a tensor (kept on the compute device, where attention reads it).
"""

from __future__ import annotations

import torch

from ppprof.mem.indices import PAD_SLOT

NO_MAMBA_SLOT = -1
"""Entry value of a request that holds no Mamba slot."""


class ReqToTokenPool:
    """One entry a live request: the KV slot of each of its positions and its Mamba slot."""

    def __init__(self, size: int, context_len: int, device: str | torch.device = "cpu") -> None:
        if size < 1:
            raise ValueError(f"request pool size {size} must be >= 1 (--max-running-requests)")
        if context_len < 1:
            raise ValueError(f"context_len {context_len} must be >= 1")
        self.size = size
        self.context_len = context_len
        # (size, context_len): KV slot of each position of each request; PAD_SLOT where unset
        self.req_to_token = torch.full((size, context_len), PAD_SLOT, dtype=torch.int64, device=device)
        self.clear()

    def clear(self) -> None:
        self._free = list(range(self.size - 1, -1, -1))
        self._is_free = bytearray([1]) * self.size
        self.mamba_slot = [NO_MAMBA_SLOT] * self.size

    def available_size(self) -> int:
        return len(self._free)

    def alloc(self) -> int | None:
        """A free entry index (req_pool_idx), or None when all are taken."""
        if not self._free:
            return None
        idx = self._free.pop()
        self._is_free[idx] = 0
        return idx

    def free(self, req_pool_idx: int) -> None:
        if not 0 <= req_pool_idx < self.size:
            raise ValueError(f"request entry {req_pool_idx} cannot be freed: valid entries are 0..{self.size - 1}")
        if self._is_free[req_pool_idx]:
            raise ValueError(f"double free of request entry {req_pool_idx}: it is already free")
        # Freeing the entry forgets its Mamba slot: a caller that has not released that slot first leaks it, and
        # the leak check of StageCache reports it (release order: KV slots, Mamba slot, request entry).
        self.mamba_slot[req_pool_idx] = NO_MAMBA_SLOT
        self._is_free[req_pool_idx] = 1
        self._free.append(req_pool_idx)

    def write(self, req_pool_idx: int, start: int, slots: torch.Tensor) -> None:
        """Record `slots` as the KV slots of positions [start, start + len(slots))."""
        end = start + slots.numel()
        if end > self.context_len:
            raise ValueError(f"request needs {end} positions but the context length is {self.context_len}")
        self.req_to_token[req_pool_idx, start:end] = slots

    def slots(self, req_pool_idx: int, length: int) -> torch.Tensor:
        """(length,) KV slots of positions [0, length)."""
        return self.req_to_token[req_pool_idx, :length]

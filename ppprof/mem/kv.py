"""Token-to-KV slot allocator: owns only the free-page bookkeeping of a paged KV cache (no tensors).

Slots are token positions in the KV buffers; page p holds slots [p * page_size, (p + 1) * page_size). Page 0 is
reserved so that slot 0 (PAD_SLOT) stays the write target of padded tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ppprof.mem.indices import PAD_SLOT, to_index_array


class KVAllocator:
    """Free-slot bookkeeping of a paged KV cache: which token slots are free, handed out and taken back by pages."""

    def __init__(self, size: int, page_size: int = 1) -> None:
        """`size` usable token slots (a multiple of page_size; a stage's max_total_tokens), plus the reserved page 0."""
        if page_size < 1:
            raise ValueError(f"page_size={page_size} must be >= 1")
        if size < page_size or size % page_size:
            raise ValueError(f"size={size} must be a positive multiple of page_size={page_size}")
        self.page_size = page_size
        self.num_pages = size // page_size
        self._offsets = np.arange(page_size, dtype=np.int64)
        # scratch for finding repeats in one free call
        self._mark = np.zeros(self.num_pages + 1, dtype=np.int64)
        self._positions = np.arange(self.num_pages * page_size, dtype=np.int64)
        self.clear()

    @property
    def size(self) -> int:
        """Usable slots (the reserved page excluded)."""
        return self.num_pages * self.page_size

    @property
    def total_slots(self) -> int:
        """Slots a KV buffer needs, reserved page included."""
        return (self.num_pages + 1) * self.page_size

    def clear(self) -> None:
        # Free pages are a stack in a preallocated array: alloc takes from the top, free writes on top. Unlike a
        # free-list tensor grown by torch.cat, a free costs O(pages freed), not O(pages free). Kept in descending
        # order at start so that a fresh allocator hands out pages 1, 2, 3, ... (deterministic and contiguous).
        self._stack = np.arange(self.num_pages, 0, -1, dtype=np.int64)
        self._top = self.num_pages
        self._is_free = np.ones(self.num_pages + 1, dtype=bool)
        self._is_free[PAD_SLOT] = False

    def available_size(self) -> int:
        return self._top * self.page_size

    def _take_pages(self, num_pages: int) -> np.ndarray | None:
        if num_pages > self._top:
            return None
        top = self._top
        pages = self._stack[top - num_pages : top][::-1].copy()
        self._top = top - num_pages
        self._is_free[pages] = False
        return pages

    def _slots_of(self, pages: np.ndarray, n: int) -> np.ndarray:
        if self.page_size == 1:
            return pages
        return (pages[:, None] * self.page_size + self._offsets).ravel()[:n]

    def alloc(self, n: int) -> np.ndarray | None:
        """(n,) int64 slots for `n` tokens of a new request, in whole pages; None (nothing taken) when short."""
        if n < 0:
            raise ValueError(f"cannot allocate n={n} slots")
        pages = self._take_pages(-(-n // self.page_size))
        return None if pages is None else self._slots_of(pages, n)

    def alloc_extend(self, n: int, last_slot: int | None) -> np.ndarray | None:
        """Slots for `n` more tokens of a request whose last allocated slot is `last_slot` (None: it has none yet).

        The rest of `last_slot`'s page is used first, then whole new pages; None (nothing taken) when short.
        """
        if last_slot is None or self.page_size == 1:
            return self.alloc(n)
        room = self.page_size - 1 - last_slot % self.page_size
        num_head = min(room, n)
        pages = self._take_pages(-(-(n - num_head) // self.page_size))
        if pages is None:
            return None
        head = np.arange(last_slot + 1, last_slot + 1 + num_head, dtype=np.int64)
        return np.concatenate((head, self._slots_of(pages, n - num_head)))

    def free(self, slots: Any) -> None:
        """Free the pages holding `slots` (ints, a list, a numpy array, or a tensor on any device). Raises, freeing
        nothing, on a reserved, out-of-range or already free slot."""
        idx = to_index_array(slots)
        if idx.size == 0:
            return
        ps = self.page_size
        pages = idx if ps == 1 else idx // ps
        lo, hi = pages.min(), pages.max()
        if lo < 1 or hi > self.num_pages:
            bad = int(idx[(pages < 1) | (pages > self.num_pages)][0])
            why = "it is in the reserved pad page" if 0 <= bad < ps else f"valid slots are [{ps}, {self.total_slots})"
            raise ValueError(f"KV slot {bad} cannot be freed: {why}")
        already = self._is_free[pages]
        if already.any():
            bad = int(pages[already][0])
            raise ValueError(f"double free of KV slot {bad * ps} (page {bad}): it is already free")
        # Repeats inside one call: after mark[pages] = position, only the last occurrence of a page reads back its
        # own position. With paging, slots of one page legitimately repeat the page; without, a repeat is an error.
        positions = self._positions[: pages.size]
        mark = self._mark
        mark[pages] = positions
        last = mark[pages] == positions
        if not last.all():
            if ps == 1:
                raise ValueError(f"double free of KV slot {int(idx[~last][0])}: it is repeated in one call")
            pages = pages[last]
        self._is_free[pages] = True
        top = self._top
        self._stack[top : top + pages.size] = pages[::-1]
        self._top = top + pages.size

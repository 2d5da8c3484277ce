"""Mamba state slot allocator: one slot per live request (no tensors). Slot 0 (PAD_SLOT) is reserved.

A grouped window cuts per-request cost in a loop over n waiting requests: alloc_group_begin(n) takes n slots in one
call; alloc() inside the window draws from that group and falls back to the per-call path when the group is used up
or could not be taken; alloc_group_end() returns every slot of the group that was not handed out.
"""

from __future__ import annotations

from typing import Any

from ppprof.mem.indices import PAD_SLOT, to_index_list


class MambaAllocator:
    """Free-slot bookkeeping of the Mamba state pool: one slot a request, per call or from a grouped window."""

    def __init__(self, size: int) -> None:
        """`size` usable slots, numbered 1..size; state buffers need size + 1 rows."""
        if size < 1:
            raise ValueError(f"Mamba cache size {size} must be >= 1")
        self.size = size
        self.clear()

    @property
    def total_slots(self) -> int:
        return self.size + 1

    def clear(self) -> None:
        """Everything free again; an open group window is closed."""
        self._free = list(range(self.size, 0, -1))  # a stack: a fresh allocator hands out 1, 2, 3, ...
        self._is_free = bytearray([0]) + bytearray([1]) * self.size
        self._group: list[int] | None = None

    def available_size(self) -> int:
        """Slots on the free list (slots parked in an open group are not counted)."""
        return len(self._free)

    @property
    def group_open(self) -> bool:
        return self._group is not None

    def group_remaining(self) -> int:
        return 0 if self._group is None else len(self._group)

    def _take(self, n: int) -> list[int] | None:
        free = self._free
        if n > len(free):
            return None
        if n == 1:
            slot = free.pop()
            self._is_free[slot] = 0
            return [slot]
        out = free[-n:] if n else []
        out.reverse()
        del free[len(free) - n :]
        is_free = self._is_free
        for s in out:
            is_free[s] = 0
        return out

    def alloc(self, n: int = 1) -> list[int] | None:
        """`n` slots, or None (nothing taken) when there are not enough."""
        group = self._group
        if group and n == 1:  # the hot path of a probe: one slot from an open window
            return [group.pop()]
        if n <= 0:
            if n < 0:
                raise ValueError(f"cannot allocate n={n} Mamba slots")
            return []
        if group is not None and len(group) >= n:
            out = group[-n:]
            del group[len(group) - n :]
            out.reverse()
            return out
        return self._take(n)

    def alloc_group_begin(self, n: int) -> bool:
        """Open a window holding `n` slots taken in one call; returns False when they could not be taken (alloc then
        uses the per-call path). Windows do not nest."""
        if self._group is not None:
            raise RuntimeError("alloc_group_begin called while a group window is open: call alloc_group_end first")
        if n < 0:
            raise ValueError(f"cannot open a group of n={n} Mamba slots")
        taken = self._take(n)
        self._group = [] if taken is None else taken[::-1]  # reversed: pop() hands them out in ascending order
        return taken is not None

    def alloc_group_end(self) -> int:
        """Close the window and return its unused slots to the free list; returns how many came back."""
        group = self._group
        if group is None:
            raise RuntimeError("alloc_group_end called with no open group window")
        self._group = None
        if group:
            is_free = self._is_free
            for s in group:
                is_free[s] = 1
            self._free.extend(group)
        return len(group)

    def free(self, slots: Any) -> None:
        """Free `slots` (an int, a list, or a tensor on any device). Raises, freeing nothing, on slot 0, an
        out-of-range slot, or a slot that is already free."""
        is_free = self._is_free
        # Fast path for the common case of one request's slot (an int or a one-element list).
        one = slots[0] if type(slots) is list and len(slots) == 1 else slots
        if type(one) is int and 0 < one <= self.size and not is_free[one]:
            is_free[one] = 1
            self._free.append(one)
            return
        idx = to_index_list(slots)
        for s in idx:
            if not 0 < s <= self.size:
                why = "it is the reserved pad slot" if s == PAD_SLOT else f"valid slots are 1..{self.size}"
                raise ValueError(f"Mamba slot {s} cannot be freed: {why}")
            if is_free[s]:
                raise ValueError(f"double free of Mamba slot {s}: it is already free")
        if len(idx) > 1 and len(set(idx)) != len(idx):
            raise ValueError(f"double free of Mamba slots: {len(idx) - len(set(idx))} repeated in one call")
        for s in idx:
            is_free[s] = 1
        self._free.extend(reversed(idx))

"""The cache of one pipeline stage: allocators and pools together, and the single release path of a request.

Release order, always: KV slots -> Mamba slot -> request entry. The Mamba slot is found through the request's entry
(req_pool_idx), so it must be released before the entry is.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ppprof.mem.kv import KVAllocator
from ppprof.mem.mamba_slots import MambaAllocator
from ppprof.mem.pools import KVPool, LatentPool, MambaPool
from ppprof.mem.req import NO_MAMBA_SLOT, ReqToTokenPool


def describe_leaks(leaks: dict[str, int], sep: str = ", ") -> str:
    """{"mamba": 2} -> "mamba pool leaked 2 slots"."""
    return sep.join(f"{pool} pool leaked {n} slot{'s' * (n != 1)}" for pool, n in leaks.items())


class LeakError(RuntimeError):
    """Slots are still outstanding when every request should have been released."""

    def __init__(self, leaks: dict[str, int]) -> None:
        self.leaks = dict(leaks)
        super().__init__(describe_leaks(self.leaks))


@dataclass(slots=True, eq=False)
class Request:
    """A live request as a stage sees it."""

    rid: int
    req_pool_idx: int | None = None
    kv_len: int = 0
    """Positions [0, kv_len) have KV slots in the request's table."""
    last_slot: int | None = None
    """KV slot of position kv_len - 1, kept host-side so that extending a paged request needs no device sync."""


class StageCache:
    """Request pool, KV and Mamba allocators, and the pools of a stage's own layers."""

    def __init__(
        self,
        *,
        req_pool: ReqToTokenPool,
        kv_alloc: KVAllocator,
        mamba_alloc: MambaAllocator | None = None,
        kv_pool: KVPool | LatentPool | None = None,
        mamba_pool: MambaPool | None = None,
    ) -> None:
        if (mamba_pool is None) != (mamba_alloc is None):
            raise ValueError("a Mamba pool needs a Mamba allocator and the other way round")
        self.req_pool = req_pool
        self.kv_alloc = kv_alloc
        self.mamba_alloc = mamba_alloc
        self.kv_pool = kv_pool
        self.mamba_pool = mamba_pool

    @property
    def device(self) -> torch.device:
        return self.req_pool.req_to_token.device

    def mamba_slot(self, req: Request) -> int:
        if req.req_pool_idx is None:
            return NO_MAMBA_SLOT
        return self.req_pool.mamba_slot[req.req_pool_idx]

    def mamba_states(self, req: Request, layer_id: int):
        """(conv state, recurrent state) of `req` in layer `layer_id`'s rows of the Mamba pool: views the layer
        reads and rewrites. ValueError where the request holds no slot (indexing with NO_MAMBA_SLOT, -1, would
        silently read and overwrite the pool's last row)."""
        slot = self.mamba_slot(req)
        if self.mamba_pool is None or slot == NO_MAMBA_SLOT:
            raise ValueError(f"request {req.rid} holds no Mamba slot on this stage: admit it first (cache.admit)")
        return self.mamba_pool.conv[layer_id][slot], self.mamba_pool.ssm[layer_id][slot]

    def admit(self, req: Request) -> bool:
        """Give `req` a request entry and, where the stage has Mamba layers, a zeroed Mamba slot. False (nothing held)
        when either pool is full."""
        if req.req_pool_idx is not None:
            raise ValueError(f"request {req.rid} is already admitted (entry {req.req_pool_idx})")
        idx = self.req_pool.alloc()
        if idx is None:
            return False
        if self.mamba_alloc is not None:
            got = self.mamba_alloc.alloc(1)
            if got is None:
                self.req_pool.free(idx)
                return False
            self.req_pool.mamba_slot[idx] = got[0]
            self.mamba_pool.reset(got[0])
        req.req_pool_idx = idx
        return True

    def extend(self, req: Request, n: int) -> torch.Tensor | None:
        """KV slots for the next `n` positions of `req`, recorded in its table; (n,) int64 on the
        device, or None (nothing taken) when the KV cache is short."""
        if req.req_pool_idx is None:
            raise ValueError(f"request {req.rid} is not admitted")
        slots = self.kv_alloc.alloc_extend(n, req.last_slot)
        if slots is None:
            return None
        out = torch.from_numpy(slots).to(self.device, non_blocking=True)
        self.req_pool.write(req.req_pool_idx, req.kv_len, out)
        req.kv_len += n
        if len(slots):
            req.last_slot = int(slots[-1])
        return out

    def release(self, req: Request) -> None:
        """The one release path: KV slots, then the Mamba slot, then the request entry. A second call is a no-op."""
        idx = req.req_pool_idx
        if idx is None:
            return
        if req.kv_len:
            self.kv_alloc.free(self.req_pool.slots(idx, req.kv_len))
            req.kv_len, req.last_slot = 0, None
        slot = self.req_pool.mamba_slot[idx]
        if slot != NO_MAMBA_SLOT:
            self.mamba_alloc.free(slot)
        self.req_pool.free(idx)  # also forgets the entry's Mamba slot
        req.req_pool_idx = None

    def outstanding(self) -> dict[str, int]:
        """Slots handed out and not yet back, per pool (slots parked in an open Mamba group window count)."""
        out = {
            "request": self.req_pool.size - self.req_pool.available_size(),
            "kv": self.kv_alloc.size - self.kv_alloc.available_size(),
        }
        if self.mamba_alloc is not None:
            out["mamba"] = self.mamba_alloc.size - self.mamba_alloc.available_size()
        return out

    def leaks(self) -> dict[str, int]:
        """The pools that are not back to full capacity, with the count: outstanding() less its zeros."""
        return {pool: n for pool, n in self.outstanding().items() if n}

    def check_no_leaks(self) -> None:
        """Raise LeakError naming each pool that is not back to full capacity, with the count."""
        leaks = self.leaks()
        if leaks:
            raise LeakError(leaks)

    def clear(self) -> None:
        self.req_pool.clear()
        self.kv_alloc.clear()
        if self.mamba_alloc is not None:
            self.mamba_alloc.clear()

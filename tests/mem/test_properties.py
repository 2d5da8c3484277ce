"""Property tests: random sequences of alloc, free, group begin/end, release and clear never hand a slot out twice,
never hand out slot 0, conserve the free count, and get everything back once all requests are released."""

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from ppprof.mem import KVAllocator, MambaAllocator, ReqToTokenPool, Request, StageCache
from ppprof.mem.pools import MambaPool, StateShape

MAMBA_SIZE = 6


class MambaMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.alloc = MambaAllocator(MAMBA_SIZE)
        self.held: set[int] = set()
        self.parked = 0  # slots sitting in an open group

    @rule(n=st.integers(0, 4))
    def alloc_n(self, n):
        got = self.alloc.alloc(n)
        if got is None:
            assert self.alloc.available_size() < n and self.alloc.group_remaining() < n
            return
        assert len(got) == n
        assert 0 not in got
        assert not (set(got) & self.held), f"{got=} handed out twice"
        assert len(set(got)) == n
        self.held |= set(got)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def free_some(self, data):
        slots = data.draw(st.lists(st.sampled_from(sorted(self.held)), min_size=1, unique=True))
        self.alloc.free(torch.tensor(slots) if len(slots) % 2 else slots)
        self.held -= set(slots)

    @precondition(lambda self: not self.alloc.group_open)
    @rule(n=st.integers(0, MAMBA_SIZE + 2))
    def group_begin(self, n):
        self.alloc.alloc_group_begin(n)

    @precondition(lambda self: self.alloc.group_open)
    @rule()
    def group_end(self):
        self.alloc.alloc_group_end()

    @rule()
    def clear(self):
        self.alloc.clear()
        self.held.clear()

    @invariant()
    def conserved(self):
        a = self.alloc
        assert a.available_size() + a.group_remaining() + len(self.held) == MAMBA_SIZE


class CacheMachine(RuleBasedStateMachine):
    """Requests through the StageCache with a paged KV allocator and a small Mamba cache."""

    def __init__(self):
        super().__init__()
        kv = KVAllocator(32, page_size=4)
        mamba = MambaAllocator(3)
        self.cache = StageCache(
            req_pool=ReqToTokenPool(4, 64),
            kv_alloc=kv,
            mamba_alloc=mamba,
            mamba_pool=MambaPool(mamba.total_slots, [0], StateShape(4, 2, 1, 2, 2), torch.float32, "cpu"),
        )
        self.live: list[Request] = []
        self.next_rid = 0

    @rule()
    def admit(self):
        r = Request(self.next_rid)
        self.next_rid += 1
        if self.cache.admit(r):
            self.live.append(r)
        else:
            assert r.req_pool_idx is None

    @precondition(lambda self: self.live)
    @rule(data=st.data(), n=st.integers(0, 11))
    def extend(self, data, n):
        r = data.draw(st.sampled_from(self.live))
        before = r.kv_len
        slots = self.cache.extend(r, n)
        if slots is None:
            assert r.kv_len == before
        else:
            assert 0 not in slots.tolist()

    @precondition(lambda self: self.live)
    @rule(data=st.data(), twice=st.booleans())
    def release(self, data, twice):
        r = data.draw(st.sampled_from(self.live))
        self.cache.release(r)
        if twice:
            self.cache.release(r)
        self.live.remove(r)

    @precondition(lambda self: not self.cache.mamba_alloc.group_open)
    @rule(n=st.integers(0, 4))
    def group_begin(self, n):
        self.cache.mamba_alloc.alloc_group_begin(n)

    @rule()
    def clear(self):
        self.cache.clear()
        for r in self.live:  # their slots went back with the clear; the requests are gone
            r.req_pool_idx, r.kv_len, r.last_slot = None, 0, None
        self.live.clear()

    @precondition(lambda self: self.cache.mamba_alloc.group_open)
    @rule()
    def group_end(self):
        self.cache.mamba_alloc.alloc_group_end()

    @invariant()
    def no_slot_shared(self):
        kv_slots, mamba_slots = [], []
        for r in self.live:
            kv_slots += self.cache.req_pool.slots(r.req_pool_idx, r.kv_len).tolist()
            mamba_slots.append(self.cache.mamba_slot(r))
        assert len(kv_slots) == len(set(kv_slots)), f"{kv_slots=}"
        assert 0 not in kv_slots and 0 not in mamba_slots
        assert len(set(mamba_slots)) == len(mamba_slots)
        out = self.cache.outstanding()
        assert out["request"] == len(self.live)
        pages = {s // 4 for s in kv_slots}
        assert out["kv"] == 4 * len(pages)

    def teardown(self):
        for r in self.live:
            self.cache.release(r)
        if self.cache.mamba_alloc.group_open:
            self.cache.mamba_alloc.alloc_group_end()
        self.cache.check_no_leaks()


TestMamba = MambaMachine.TestCase
TestMamba.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestCache = CacheMachine.TestCase
TestCache.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)

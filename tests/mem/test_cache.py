import pytest
import torch

from ppprof.mem import KVAllocator, LeakError, MambaAllocator, ReqToTokenPool, Request, StageCache
from ppprof.mem.pools import KVPool, MambaPool, StateShape
from ppprof.mem.req import NO_MAMBA_SLOT


def make_cache(max_total_tokens=64, page_size=4, mamba_slots=2, requests=4):
    kv = KVAllocator(max_total_tokens, page_size)
    mamba = MambaAllocator(mamba_slots)
    return StageCache(
        req_pool=ReqToTokenPool(requests, 128),
        kv_alloc=kv,
        kv_pool=KVPool(kv.total_slots, [0], 2, 4, torch.float32, "cpu"),
        mamba_alloc=mamba,
        mamba_pool=MambaPool(mamba.total_slots, [1], StateShape(8, 4, 2, 4, 4), torch.float32, "cpu"),
    )


def test_admit_extend_release_round_trip_records_the_table():
    c = make_cache()
    r = Request(rid=7)
    assert c.admit(r)
    s1 = c.extend(r, 3)
    s2 = c.extend(r, 6)
    assert s1.tolist() == [4, 5, 6]
    assert s2.tolist() == [7, 8, 9, 10, 11, 12]
    assert c.req_pool.slots(r.req_pool_idx, 9).tolist() == s1.tolist() + s2.tolist()
    assert c.outstanding() == {"request": 1, "kv": 12, "mamba": 1}
    c.release(r)
    assert c.outstanding() == {"request": 0, "kv": 0, "mamba": 0}
    c.release(r)  # a second release is harmless
    c.check_no_leaks()


def test_admit_zeroes_the_mamba_state():
    c = make_cache()
    c.mamba_pool.fill_random(1)
    r = Request(0)
    c.admit(r)
    assert c.mamba_slot(r) == 1
    assert c.mamba_pool.ssm[1][1].abs().sum().item() == 0


def test_admit_fails_cleanly_when_mamba_slots_run_out():
    c = make_cache(mamba_slots=1)
    a, b = Request(0), Request(1)
    assert c.admit(a)
    assert not c.admit(b)
    assert c.outstanding() == {"request": 1, "kv": 0, "mamba": 1}
    c.release(a)
    assert c.admit(b)


def test_release_order_kv_then_mamba_then_entry(monkeypatch):
    c = make_cache()
    r = Request(0)
    c.admit(r)
    c.extend(r, 5)
    calls = []
    for name, obj in (("kv", c.kv_alloc), ("mamba", c.mamba_alloc), ("request", c.req_pool)):
        orig = obj.free
        monkeypatch.setattr(obj, "free", lambda x, orig=orig, name=name: (calls.append(name), orig(x)))
    c.release(r)
    assert calls == ["kv", "mamba", "request"]


def test_release_that_skips_the_mamba_slot_is_caught_by_the_leak_check():
    c = make_cache()
    reqs = [Request(i) for i in range(2)]
    for r in reqs:
        c.admit(r)
        c.extend(r, 4)
    for r in reqs:  # the historical bug: KV slots and entry freed, the Mamba slot forgotten
        c.kv_alloc.free(c.req_pool.slots(r.req_pool_idx, r.kv_len))
        c.req_pool.free(r.req_pool_idx)
    assert c.req_pool.mamba_slot == [NO_MAMBA_SLOT] * 4
    with pytest.raises(LeakError, match="mamba pool leaked 2 slots") as e:
        c.check_no_leaks()
    assert e.value.leaks == {"mamba": 2}


def test_extend_short_takes_nothing_and_stage_without_mamba():
    kv = KVAllocator(8)
    c = StageCache(req_pool=ReqToTokenPool(2, 16), kv_alloc=kv)
    r = Request(0)
    assert c.admit(r)
    assert c.extend(r, 9) is None
    assert r.kv_len == 0
    assert c.outstanding() == {"request": 1, "kv": 0}
    c.release(r)
    c.check_no_leaks()

import pytest
import torch

from ppprof.mem.kv import KVAllocator


def test_fresh_allocator_hands_out_slots_in_order_and_never_slot_zero():
    kv = KVAllocator(8)
    assert kv.alloc(3).tolist() == [1, 2, 3]
    assert kv.alloc(2).tolist() == [4, 5]
    assert kv.available_size() == 3


def test_alloc_returns_none_and_takes_nothing_when_short():
    kv = KVAllocator(4)
    assert kv.alloc(5) is None
    assert kv.available_size() == 4
    assert kv.alloc(4).tolist() == [1, 2, 3, 4]
    assert kv.alloc(1) is None


def test_paged_alloc_rounds_up_to_pages_and_skips_reserved_page():
    kv = KVAllocator(16, page_size=4)
    assert kv.total_slots == 20
    slots = kv.alloc(5)
    assert slots.tolist() == [4, 5, 6, 7, 8]
    assert kv.available_size() == 8  # two pages taken


def test_alloc_extend_fills_the_last_page_first():
    kv = KVAllocator(16, page_size=4)
    first = kv.alloc(5)  # pages 1, 2; slot 8 is the first of page 2
    more = kv.alloc_extend(5, last_slot=first[-1])
    assert more.tolist() == [9, 10, 11, 12, 13]
    assert kv.available_size() == 4
    assert kv.alloc_extend(0, last_slot=int(more[-1])).tolist() == []


def test_alloc_extend_short_takes_nothing():
    kv = KVAllocator(8, page_size=4)
    s = kv.alloc(3)
    assert kv.alloc_extend(6, last_slot=s[-1]) is None
    assert kv.available_size() == 4


def test_free_returns_pages_and_they_are_reused():
    kv = KVAllocator(8, page_size=2)
    a = kv.alloc(3)
    kv.free(a)
    assert kv.available_size() == 8
    assert kv.alloc(3).tolist() == a.tolist()


def test_free_accepts_tensors():
    kv = KVAllocator(8)
    s = kv.alloc(4)
    kv.free(torch.tensor(s))
    assert kv.available_size() == 8


@pytest.mark.parametrize("page_size", [1, 4])
def test_double_free_raises_with_the_slot(page_size):
    kv = KVAllocator(8, page_size=page_size)
    s = kv.alloc(2)
    kv.free(s)
    with pytest.raises(ValueError, match=f"double free of KV slot {s[0]}"):
        kv.free(s)


def test_reserved_and_out_of_range_slots_raise_and_free_nothing():
    kv = KVAllocator(8)
    s = kv.alloc(2)
    with pytest.raises(ValueError, match="KV slot 0 .*reserved"):
        kv.free([s[0], 0])
    with pytest.raises(ValueError, match=r"KV slot 9 .*valid slots are \[1, 9\)"):
        kv.free([9])
    assert kv.available_size() == 6  # the failed calls freed nothing
    with pytest.raises(ValueError, match="repeated"):
        kv.free([s[0], s[0]])


def test_clear_restores_everything():
    kv = KVAllocator(8, page_size=2)
    kv.alloc(7)
    kv.clear()
    assert kv.available_size() == 8
    assert kv.alloc(2).tolist() == [2, 3]


@pytest.mark.parametrize("size,page_size", [(0, 1), (6, 4), (8, 0)])
def test_bad_sizes_raise(size, page_size):
    with pytest.raises(ValueError):
        KVAllocator(size, page_size)

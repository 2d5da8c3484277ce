import pytest
import torch

from ppprof.mem.mamba_slots import MambaAllocator


def test_per_call_alloc_in_order_and_none_when_empty():
    m = MambaAllocator(3)
    assert m.alloc(1) == [1]
    assert m.alloc(2) == [2, 3]
    assert m.alloc(1) is None
    assert m.available_size() == 0


def test_group_window_hands_out_its_slots_then_falls_back():
    m = MambaAllocator(6)
    assert m.alloc_group_begin(2) is True
    assert m.available_size() == 4
    assert m.alloc(1) == [1]
    assert m.alloc(1) == [2]
    assert m.group_remaining() == 0
    assert m.alloc(1) == [3]  # group used up: per-call path
    assert m.alloc_group_end() == 0
    assert m.available_size() == 3


def test_group_end_returns_unused_slots():
    m = MambaAllocator(8)
    m.alloc_group_begin(5)
    got = [m.alloc(1)[0] for _ in range(2)]
    assert got == [1, 2]
    assert m.alloc_group_end() == 3
    assert m.available_size() == 6
    m.free(got)
    assert m.available_size() == 8


def test_group_that_cannot_be_taken_falls_back_to_per_call():
    m = MambaAllocator(4)
    assert m.alloc_group_begin(128) is False
    assert m.available_size() == 4
    assert [m.alloc(1)[0] for _ in range(4)] == [1, 2, 3, 4]
    assert m.alloc(1) is None
    assert m.alloc_group_end() == 0


def test_group_windows_do_not_nest_and_end_needs_a_begin():
    m = MambaAllocator(4)
    with pytest.raises(RuntimeError, match="alloc_group_end called with no open group"):
        m.alloc_group_end()
    m.alloc_group_begin(1)
    with pytest.raises(RuntimeError, match="group window is open"):
        m.alloc_group_begin(1)


def test_free_accepts_indices_on_any_device_form():
    m = MambaAllocator(4)
    a, b, c = m.alloc(1)[0], m.alloc(1)[0], m.alloc(1)[0]
    m.free(a)
    m.free(torch.tensor([b]))
    m.free(torch.tensor(c))
    assert m.available_size() == 4


def test_free_errors_name_the_slot_and_free_nothing():
    m = MambaAllocator(4)
    s = m.alloc(2)
    with pytest.raises(ValueError, match="Mamba slot 0 cannot be freed: it is the reserved pad slot"):
        m.free(0)
    with pytest.raises(ValueError, match=r"Mamba slot 5 cannot be freed: valid slots are 1..4"):
        m.free([s[0], 5])
    assert m.available_size() == 2
    m.free(s[0])
    with pytest.raises(ValueError, match=f"double free of Mamba slot {s[0]}"):
        m.free(s[0])


def test_clear_closes_window_and_frees_all():
    m = MambaAllocator(4)
    m.alloc_group_begin(2)
    m.alloc(1)
    m.clear()
    assert not m.group_open
    assert m.available_size() == 4


def test_zero_and_negative_counts():
    m = MambaAllocator(4)
    m.alloc_group_begin(3)
    assert m.alloc(0) == []
    assert m.group_remaining() == 3
    with pytest.raises(ValueError, match="cannot allocate n=-2 Mamba slots"):
        m.alloc(-2)
    m.alloc_group_end()
    with pytest.raises(ValueError, match="n=-1"):
        m.alloc_group_begin(-1)
    assert m.available_size() == 4

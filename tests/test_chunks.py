"""The shared chunk arithmetic (ppprof.chunks): exact expectations and a naive reference."""

import math

import pytest

from ppprof.chunks import align_down, align_up, ceil_div, default_alignment, default_floor, positive_root, walk


@pytest.mark.parametrize(
    "x, unit, down, up",
    [(0, 64, 64, 0), (1, 64, 64, 64), (64, 64, 64, 64), (65, 64, 64, 128), (1000, 1, 1000, 1000), (130, 16, 128, 144)],
)
def test_align(x, unit, down, up):
    assert align_down(x, unit) == down, f"{x=} {unit=}"
    assert align_up(x, unit) == up, f"{x=} {unit=}"
    assert ceil_div(x, unit) == math.ceil(x / unit)


def test_defaults():
    assert default_alignment(1) == 64 and default_alignment(128) == 128
    assert default_floor(512) == 128 and default_floor(3) == 1


def test_walk_last_chunk_takes_the_rest():
    assert walk(lambda done: 100 if done < 300 else 50, 420) == [100, 100, 100, 50, 50, 20]
    assert walk(lambda done: 512, 512) == [512]
    assert walk(lambda done: 512, 0) == []


def test_walk_refuses_an_empty_chunk():
    with pytest.raises(ValueError, match="chunk of 0 tokens after 100"):
        walk(lambda done: 100 if done < 100 else 0, 300)


@pytest.mark.parametrize("qa, qb, qc", [(1.0, 2.0, -3.0), (2e-7, 5e-3, -4.0), (-1.0, 4.0, -3.0)])
def test_positive_root_solves(qa, qb, qc):
    x = positive_root(qa, qb, qc)
    assert x is not None and x > 0
    assert qa * x * x + qb * x + qc == pytest.approx(0.0, abs=1e-9)


def test_positive_root_none():
    assert positive_root(1.0, 0.0, 1.0) is None  # no real root
    assert positive_root(1.0, 3.0, 2.0) is None  # both roots negative
    assert positive_root(0.0, 1.0, -1.0) is None  # linear: the caller's case

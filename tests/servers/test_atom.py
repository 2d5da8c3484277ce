"""ATOM's rule re-derived by hand from its Dynamic CPP guide, the calibration it accepts, and its flags."""

import numpy as np
import pytest

from ppprof.policy import LatencyModel
from ppprof.servers import ServerSetting
from ppprof.servers.atom import ATOM, prefix_form

from .helpers import PREFIX, QUADRATIC, root


def test_atom_rule_by_hand():
    s = ServerSetting(
        server="atom",
        base_chunk_size=4096,
        dynamic=True,
        smooth_factor=1.0,
        min_chunk_size=512,
        max_chunk_size=8192,
        page_size=16,
    )
    rule = ATOM.rule(s, ATOM.boot_model(PREFIX), context_len=65536)
    a, b, g = PREFIX.a, PREFIX.b, PREFIX.g
    assert rule.next(0) == 4096
    for L in (100, 4096, 20000, 50000):
        x = root(a, 2 * a * L + b, a * 4096**2 + b * 4096 - g * L)
        floor = root(a, 2 * a * L + b, 4 * g * L)  # prefix cost at most 20% of the chunk's latency
        size = min(max(int(x), 16, 512, int(floor)), 4096, 8192)
        assert rule.next(L) == size - size % 16, f"{L=}"
    # a prefix cost above the whole budget: the base size
    heavy = LatencyModel("prefix", a=1e-7, b=0.001, c=1.0, g=0.01)
    assert ATOM.rule(s, heavy, 10**6).next(900000) == 4096


def test_atom_refuses_a_calibration_out_of_its_bounds_and_keeps_the_ceiling():
    assert ATOM.boot_model(LatencyModel("prefix", a=1e-6, b=-0.1, c=1.0, g=0.0)) is None
    assert ATOM.boot_model(LatencyModel("prefix", a=1e-6, b=0.1, c=1.0, g=-1e-4)) is None
    s = ServerSetting(
        server="atom",
        base_chunk_size=4096,
        dynamic=True,
        smooth_factor=1.0,
        min_chunk_size=512,
        max_chunk_size=8192,
        page_size=16,
    )
    assert ATOM.rule(s, None, 65536).next(5000) == 8192 == ATOM.fixed_chunk_size(s)


def test_prefix_form_of_each_model():
    assert prefix_form(PREFIX) is PREFIX
    q = prefix_form(QUADRATIC)
    assert (q.name, q.a, q.b, q.c, q.g) == ("prefix", QUADRATIC.a, QUADRATIC.b, QUADRATIC.c, 0.0)
    pairs = LatencyModel("pairs", a=1e-6, b=0.01, c=2.0, g=2e-4, h=0.0)  # h = 0: the prefix model exactly
    folded = prefix_form(pairs, {"prefix_len": [0, 20000], "chunk_size": [64, 4096]})
    assert np.allclose([folded.a, folded.b, folded.c, folded.g], [1e-6, 0.01, 2.0, 2e-4], rtol=1e-6), f"{folded=}"


def test_flags_base_size_zero_is_the_ceiling_and_the_calibration_is_read():
    atom, calibration, _ = ATOM.parse_flags(
        "--max-num-batched-tokens=32768 --enable-dynamic-chunking "
        "--dynamic-chunking-calibration 3.25e-07,6.03e-03,26.1,5.39e-04"
    )
    assert atom.base_chunk_size == 32768 and calibration.g == 5.39e-04
    zero = ATOM.parse_flags("--dynamic-chunking-base-size 0 --max-num-batched-tokens 16384 --block-size 16")[0]
    assert (zero.base_chunk_size, zero.max_chunk_size, zero.page_size) == (16384, 16384, 16)
    with pytest.raises(ValueError, match="four numbers a,b,c,gamma"):
        ATOM.parse_flags("--dynamic-chunking-calibration 1,2")

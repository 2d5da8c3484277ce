"""The boot fit SGLang and vllm-ascend share, on plain arrays: which rows it reads, what it returns, and each server's
clamps on top of it."""

from types import SimpleNamespace

import numpy as np

from ppprof.servers.boot import MIN_POINTS, prefix_free_quadratic
from ppprof.servers.sglang import SGLANG
from ppprof.servers.vllm_ascend import VLLM_ASCEND


def forwards(a, b, c, sizes, first_ms=None, prefixed=()):
    """Prefix-free forwards of f(l) = a l^2 + b l + c in order (the first at `first_ms` when given), with `prefixed`
    (prefix_len, chunk_size, latency_ms) rows interleaved after the first."""
    rows = [(0, int(l), a * l * l + b * l + c) for l in sizes]
    if first_ms is not None:
        rows[0] = (0, rows[0][1], first_ms)
    rows[1:1] = list(prefixed)
    prefix_len, chunk_size, latency_ms = (np.array(col) for col in zip(*rows))
    return SimpleNamespace(prefix_len=prefix_len, chunk_size=chunk_size, chunk_latency_ms=latency_ms.astype(float))


def test_it_drops_the_first_prefix_free_row_and_ignores_the_prefixed_ones():
    sizes = [64 * k for k in range(1, 12)]
    fit = prefix_free_quadratic(forwards(3e-7, 0.02, 4.0, sizes, first_ms=1e6, prefixed=[(4096, 512, 9e9)]))
    assert list(fit.dropped) == [0] and list(fit.used) == list(range(2, 12))
    assert np.allclose([fit.model.a, fit.model.b, fit.model.c], [3e-7, 0.02, 4.0], rtol=1e-6), f"{fit.model=}"


def test_it_equals_numpys_least_squares_on_noisy_rows():
    rng = np.random.default_rng(0)
    sizes = rng.integers(64, 8192, 40)
    data = forwards(3e-7, 0.02, 4.0, sizes)
    data.chunk_latency_ms = data.chunk_latency_ms * (1 + 0.05 * rng.standard_normal(len(sizes)))
    l, t = data.chunk_size[1:].astype(float), data.chunk_latency_ms[1:]
    want = np.linalg.lstsq(np.column_stack([l * l, l, np.ones_like(l)]), t, rcond=None)[0]
    got = prefix_free_quadratic(data).model
    assert (got.a, got.b, got.c) == tuple(float(v) for v in want)


def test_too_few_rows_give_no_model():
    fit = prefix_free_quadratic(forwards(3e-7, 0.02, 4.0, [64 * k for k in range(1, MIN_POINTS + 1)]))
    assert fit.model is None and len(fit.used) == MIN_POINTS - 1
    assert SGLANG.boot_fit(forwards(3e-7, 0.02, 4.0, [64] * 3)) is None


def test_each_server_clamps_the_same_fit_its_own_way():
    concave = forwards(-2e-8, 0.02, 4.0, [256 * k for k in range(1, 20)])
    assert SGLANG.boot_fit(concave) is None  # a <= 0: SGLang keeps dynamic chunking off
    assert VLLM_ASCEND.boot_fit(concave).a == 1e-9  # vllm-ascend sets a to 1e-9
    falling = forwards(3e-7, -0.001, 4.0, [256 * k for k in range(1, 20)])
    assert SGLANG.boot_fit(falling).b == 0.0 and VLLM_ASCEND.boot_fit(falling).b < 0

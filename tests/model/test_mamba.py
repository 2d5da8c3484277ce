"""Mamba2 numerics: chunked SSD == the step-by-step recurrence; the causal conv resumes from its state."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ppprof.model.mamba import causal_conv, segsum, ssd_chunked


def ssd_recurrence(x, dt, a, b, c, state):
    """Naive scan, one step at a time: state = exp(dt a) state + dt x B^T; y = state C.
    x: (L, heads, p); dt: (L, heads); a: (heads,); b, c: (L, groups, n); state: (heads, p, n)."""
    heads_per_group = x.shape[1] // b.shape[1]
    b, c = b.repeat_interleave(heads_per_group, dim=1), c.repeat_interleave(heads_per_group, dim=1)
    ys = []
    for t in range(x.shape[0]):
        decay = torch.exp(dt[t] * a)[:, None, None]  # (heads, 1, 1)
        state = decay * state + (dt[t][:, None] * x[t])[:, :, None] * b[t][:, None, :]  # (heads, p, n)
        ys.append(torch.einsum("hpn,hn->hp", state, c[t]))
    return torch.stack(ys), state


def random_inputs(seq_len, num_heads=4, head_dim=8, num_groups=2, d_state=6, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(seq_len, num_heads, head_dim, generator=gen)
    dt = F.softplus(torch.randn(seq_len, num_heads, generator=gen) - 1)
    a = -torch.rand(num_heads, generator=gen) * 2 - 0.1
    b = torch.randn(seq_len, num_groups, d_state, generator=gen)
    c = torch.randn(seq_len, num_groups, d_state, generator=gen)
    state = torch.randn(num_heads, head_dim, d_state, generator=gen)
    return x, dt, a, b, c, state


def test_segsum():
    x = torch.tensor([1.0, 2.0, 3.0])
    inf = float("-inf")
    want = torch.tensor([[0.0, inf, inf], [2.0, 0.0, inf], [5.0, 3.0, 0.0]])
    assert torch.equal(segsum(x), want)


@pytest.mark.parametrize("seq_len", [1, 5, 8, 16, 37, 64])
@pytest.mark.parametrize("block_len", [8, 16])
@pytest.mark.parametrize("zero_state", [True, False])
def test_ssd_chunked_equals_recurrence(seq_len, block_len, zero_state):
    x, dt, a, b, c, state = random_inputs(seq_len, seed=seq_len)
    if zero_state:
        state = torch.zeros_like(state)
    y, final = ssd_chunked(x, dt, a, b, c, block_len, initial_state=None if zero_state else state)
    y_ref, final_ref = ssd_recurrence(x, dt, a, b, c, state)
    assert y.shape == x.shape and final.shape == state.shape
    torch.testing.assert_close(y, y_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(final, final_ref, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cuts", [[1], [3, 17], [16, 32], [1, 2, 30]])
def test_ssd_resumed_from_state_equals_one_pass(cuts):
    x, dt, a, b, c, _ = random_inputs(40, seed=1)
    y_ref, final_ref = ssd_chunked(x, dt, a, b, c, 16)
    state, ys = None, []
    for start, end in zip([0, *cuts], [*cuts, 40]):
        y, state = ssd_chunked(x[start:end], dt[start:end], a, b[start:end], c[start:end], 16, initial_state=state)
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys), y_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(state, final_ref, rtol=1e-4, atol=1e-4)


def test_causal_conv_resumes_from_state():
    gen = torch.Generator().manual_seed(0)
    channels, kernel = 5, 4
    x = torch.randn(11, channels, generator=gen)
    weight, bias = torch.randn(channels, kernel, generator=gen), torch.randn(channels, generator=gen)
    zero = torch.zeros(channels, kernel - 1)
    y_ref, state_ref = causal_conv(x, zero, weight, bias)
    # Reference by definition: y[t, ch] = bias + sum_j w[ch, j] x[t - (kernel - 1) + j] (zeros before the start).
    padded = torch.cat([zero.T, x])
    want = torch.stack([(padded[t:t + kernel].T * weight).sum(-1) + bias for t in range(11)])
    torch.testing.assert_close(y_ref, want)
    torch.testing.assert_close(state_ref, x[-(kernel - 1):].T)
    state, ys = zero, []
    for start, end in ((0, 1), (1, 3), (3, 11)):  # chunks shorter than the kernel, too
        y, state = causal_conv(x[start:end], state, weight, bias)
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys), y_ref)
    torch.testing.assert_close(state, state_ref)

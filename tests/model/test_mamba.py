"""Mamba2 numerics: chunked SSD == the step-by-step recurrence; the causal conv resumes from its state; the whole layer
== a token-by-token reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ppprof.mem.cache import Request
from ppprof.mem.req import NO_MAMBA_SLOT
from ppprof.model.mamba import Mamba2, causal_conv, segsum, ssd_chunked
from ppprof.model.stage import build_stage_cache
from ppprof.specs.memory import CacheSizes
from ppprof.specs.spec import LayerSpec, ModelSpec


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
    want = torch.stack([(padded[t : t + kernel].T * weight).sum(-1) + bias for t in range(11)])
    torch.testing.assert_close(y_ref, want)
    torch.testing.assert_close(state_ref, x[-(kernel - 1) :].T)
    state, ys = zero, []
    for start, end in ((0, 1), (1, 3), (3, 11)):  # chunks shorter than the kernel, too
        y, state = causal_conv(x[start:end], state, weight, bias)
        ys.append(y)
    torch.testing.assert_close(torch.cat(ys), y_ref)
    torch.testing.assert_close(state, state_ref)


def mamba2_step_reference(m, x, conv_state, ssm_state):
    """The whole Mamba2 layer, written token by token from its definition, independent of ppprof.model.mamba's
    helpers. m: a Mamba2 (for its weights and sizes); x: (n, hidden); conv_state: (conv_dim, kernel - 1);
    ssm_state: (heads, head_dim, d_state). Returns the output (n, hidden) and the final conv and SSM states."""
    n = x.shape[0]
    heads, head_dim, d_state, groups = m.num_heads, m.head_dim, m.d_state, m.num_groups
    heads_per_group, kernel = heads // groups, m.conv_weight.shape[1]
    a = -torch.exp(m.a_log)  # (heads,)
    window = conv_state.T.clone()  # (kernel - 1, conv_dim): the last inputs of the conv, oldest first
    h = ssm_state.clone()  # (heads, head_dim, d_state)
    out = []
    for t in range(n):
        proj = m.in_proj.weight @ x[t]  # (d_inner + conv_dim + heads,)
        z, xbc, dt = proj[: m.d_inner], proj[m.d_inner : m.d_inner + m.conv_dim], proj[m.d_inner + m.conv_dim :]
        # Causal conv over [state || x]: the kernel's last tap multiplies the current input.
        window = torch.cat([window, xbc[None]])[-kernel:]  # (kernel, conv_dim)
        xbc = F.silu(m.conv_bias + (m.conv_weight * window.T).sum(dim=1))  # (conv_dim,)
        window = window[1:]
        xs = xbc[: m.d_inner].view(heads, head_dim)
        b = xbc[m.d_inner : m.d_inner + groups * d_state].view(groups, d_state)
        c = xbc[m.d_inner + groups * d_state :].view(groups, d_state)
        dt = F.softplus(dt + m.dt_bias)  # (heads,)
        y = torch.empty(heads, head_dim)
        for hd in range(heads):
            g = hd // heads_per_group
            h[hd] = torch.exp(dt[hd] * a[hd]) * h[hd] + dt[hd] * torch.outer(xs[hd], b[g])
            y[hd] = h[hd] @ c[g] + m.d_skip[hd] * xs[hd]
        # Gated RMSNorm: gate with silu(z), then normalise each group of d_inner / groups channels.
        gated = (y.reshape(-1) * F.silu(z)).view(groups, -1)
        normed = gated / torch.sqrt(gated.pow(2).mean(dim=-1, keepdim=True) + m.eps)
        out.append(m.out_proj.weight @ (normed.reshape(-1) * m.norm_weight))
    return torch.stack(out), window.T, h


def mamba_layer_setup(num_groups=2, chunk_size=8, seed=0):
    """A one-layer Mamba2 model with random weights (conv bias, norm weight, D, dt bias nonzero), its cache and an
    admitted request whose slot holds a random (nonzero) conv and SSM state."""
    spec = ModelSpec(
        name="mamba",
        family="nemotron_h",
        layers=(LayerSpec(mixers=("mamba",)),),
        hidden_size=24,
        vocab_size=32,
        mamba_num_heads=4,
        mamba_head_dim=8,
        ssm_state_size=6,
        conv_kernel=4,
        mamba_n_groups=num_groups,
        mamba_chunk_size=chunk_size,
    )
    m = Mamba2(spec, 0, dtype=torch.float32, device="cpu")
    gen = torch.Generator().manual_seed(seed)
    m.init_weights(gen, 0.2)
    with torch.no_grad():
        for p in (m.conv_bias, m.norm_weight, m.d_skip, m.dt_bias):
            p.copy_(torch.randn(p.shape, generator=gen) * 0.5 + (1.0 if p is m.norm_weight else 0.0))
    cache = build_stage_cache(
        spec,
        range(1),
        CacheSizes(max_total_tokens=64, page_size=1, max_mamba_cache_size=3, max_running_requests=3, context_len=64),
    )
    req = Request(7)
    assert cache.admit(req)
    slot = cache.mamba_slot(req)
    cache.mamba_pool.conv[0][slot] = torch.randn(m.conv_dim, 3, generator=gen)
    cache.mamba_pool.ssm[0][slot] = torch.randn(4, 8, 6, generator=gen)
    return m, cache, req, gen


@pytest.mark.parametrize("num_tokens", [1, 5, 19])
def test_mamba2_layer_equals_step_reference(num_tokens):
    """Mamba2.forward on one chunk, resumed from a nonzero state, == the token-by-token reference; the slot ends in
    the reference's final conv and SSM states."""
    m, cache, req, gen = mamba_layer_setup()
    slot = cache.mamba_slot(req)
    conv0, ssm0 = cache.mamba_pool.conv[0][slot].clone(), cache.mamba_pool.ssm[0][slot].clone()
    x = torch.randn(num_tokens, 24, generator=gen)
    with torch.no_grad():
        got = m(x, cache, req)
        want, conv_want, ssm_want = mamba2_step_reference(m, x, conv0, ssm0)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(cache.mamba_pool.conv[0][slot], conv_want)
    torch.testing.assert_close(cache.mamba_pool.ssm[0][slot], ssm_want, rtol=1e-4, atol=1e-5)


def test_mamba2_without_slot_raises():
    """A request with no Mamba slot (never admitted: NO_MAMBA_SLOT) is refused, not run on the pool's last row."""
    m, cache, _, gen = mamba_layer_setup()
    last = cache.mamba_pool.ssm[0][NO_MAMBA_SLOT].clone()
    stranger = Request(3)
    assert cache.mamba_slot(stranger) == NO_MAMBA_SLOT
    with pytest.raises(ValueError, match="request 3 holds no Mamba slot.*admit it first"):
        with torch.no_grad():
            m(torch.randn(2, 24, generator=gen), cache, stranger)
    assert torch.equal(cache.mamba_pool.ssm[0][NO_MAMBA_SLOT], last)


@pytest.mark.parametrize("seq_len,block_len", [(37, 8), (256, 64), (300, 128)])
def test_ssd_in_bf16_stays_within_tolerance_of_fp32(seq_len, block_len):
    """The torch path computes its contractions in bf16 and keeps states fp32: the outputs and the final state stay
    within a few bf16 ulps (relative to their scale) of the fp32 scan of the same bf16-rounded inputs."""
    x, dt, a, b, c, state = random_inputs(seq_len, num_heads=8, head_dim=16, num_groups=2, d_state=16, seed=seq_len)
    x, b, c = (t.bfloat16() for t in (x, b, c))
    y16, final16 = ssd_chunked(x, dt, a, b, c, block_len, initial_state=state)
    y32, final32 = ssd_chunked(x.float(), dt, a, b.float(), c.float(), block_len, initial_state=state)
    assert y16.dtype == final16.dtype == torch.float32
    for got, want in ((y16, y32), (final16, final32)):
        rel = (got - want).abs().max() / want.abs().max()
        assert rel < 2e-2, f"{rel=}"


def test_whole_model_in_bf16_stays_close_to_fp32():
    """Logits of a chunked prefill through the hybrid test model (Mamba, attention, MoE) in bf16 vs fp32."""
    from tests.model.helpers import chunked_logits, tiny_hybrid

    got = chunked_logits(tiny_hybrid(), [37, 1, 26], dtype=torch.bfloat16).float()
    want = chunked_logits(tiny_hybrid(), [37, 1, 26], dtype=torch.float32)
    cos = F.cosine_similarity(got, want, dim=0)
    assert cos > 0.99, f"{cos=}"

"""Gated DeltaNet: the chunked delta rule equals the token-by-token recurrence (fp32 states), from any state and at
any split; the layer resumes its conv and recurrent state from its Mamba-pool slot, so chunked == one shot."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ppprof.mem.cache import Request
from ppprof.model.deltanet import GatedDeltaNet, chunk_gated_delta_rule, recurrent_gated_delta_rule
from ppprof.specs import load_spec

from .helpers import chunked_logits, make_cache

TOL = dict(rtol=1e-5, atol=1e-5)


def _inputs(t=45, heads=3, dk=8, dv=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(t, heads, dk, generator=g), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(t, heads, dk, generator=g), dim=-1)
    v = torch.randn(t, heads, dv, generator=g)
    decay = -torch.rand(t, heads, generator=g) * 2  # log-decays down to -2: fast forgetting too
    beta = torch.rand(t, heads, generator=g)
    return q, k, v, decay, beta, torch.randn(heads, dk, dv, generator=g)


@pytest.mark.parametrize("chunk_size", [1, 4, 16, 64])
@pytest.mark.parametrize("with_state", [False, True])
def test_chunked_equals_recurrent(chunk_size, with_state):
    q, k, v, g, beta, s0 = _inputs()
    s0 = s0 if with_state else None
    o_ref, s_ref = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    o, s = chunk_gated_delta_rule(q, k, v, g, beta, chunk_size, s0)
    assert o.dtype == s.dtype == torch.float32
    torch.testing.assert_close(o, o_ref, **TOL)
    torch.testing.assert_close(s, s_ref, **TOL)


def test_split_sequence_resumes_from_the_state():
    q, k, v, g, beta, s0 = _inputs()
    o_ref, s_ref = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    o1, s1 = chunk_gated_delta_rule(q[:19], k[:19], v[:19], g[:19], beta[:19], 8, s0)
    o2, s2 = chunk_gated_delta_rule(q[19:], k[19:], v[19:], g[19:], beta[19:], 8, s1)
    torch.testing.assert_close(torch.cat([o1, o2]), o_ref, **TOL)
    torch.testing.assert_close(s2, s_ref, **TOL)


def test_bf16_inputs_keep_fp32_states():
    q, k, v, g, beta, s0 = _inputs()
    o, s = chunk_gated_delta_rule(q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta, 16, s0)
    assert s.dtype == torch.float32 and o.dtype == torch.float32


def test_layer_state_lives_in_the_mamba_slot():
    spec = load_spec("tiny-gdn")
    layer = GatedDeltaNet(spec, 0, dtype=torch.float32, device="cpu")
    layer.init_weights(torch.Generator().manual_seed(0), 0.02)
    x = torch.randn(30, spec.hidden_size, generator=torch.Generator().manual_seed(1))
    outs, states = [], []
    for splits in ([30], [7, 23]):
        cache = make_cache(spec, range(spec.num_layers))
        assert cache.mamba_pool.ssm[0].shape[1:] == (4, 16, 16)
        assert cache.mamba_pool.conv[0].shape[1:] == (spec.deltanet_conv_dim, 3)
        req = Request(0)
        assert cache.admit(req)
        start, pieces = 0, []
        for n in splits:
            pieces.append(layer(x[start : start + n], cache, req))
            start += n
        outs.append(torch.cat(pieces))
        slot = cache.mamba_slot(req)
        states.append((cache.mamba_pool.conv[0][slot].clone(), cache.mamba_pool.ssm[0][slot].clone()))
        cache.release(req)
        cache.check_no_leaks()
    torch.testing.assert_close(outs[1], outs[0], **TOL)
    for a, b in zip(states[1], states[0]):
        torch.testing.assert_close(a, b, **TOL)


def test_chunked_prefill_equals_one_shot():
    spec = load_spec("tiny-gdn")
    one = chunked_logits(spec, [70])
    torch.testing.assert_close(chunked_logits(spec, [1, 33, 36]), one, **TOL)
    torch.testing.assert_close(chunked_logits(spec, [64, 6], page_size=4), one, **TOL)

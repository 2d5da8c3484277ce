"""MLA: the decompressed (prefill) and absorbed forms agree; the latent pool holds one row a token; chunked == one
shot through the paged latent pool; a chunk's cost has a term in the prefix (kv_b_proj over the cached latents)."""

from __future__ import annotations

import pytest
import torch

from ppprof.mem.cache import Request
from ppprof.mem.pools import LatentPool
from ppprof.model.mla import Attend, MLAForm, MLAttention, mla_absorbed, mla_decompressed
from ppprof.specs import load_spec

from .helpers import chunked_logits, make_cache

TOL = dict(rtol=2e-5, atol=2e-5)


def _inputs(n=5, prefix_len=7, heads=4, dn=16, dr=8, dv=12, c=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = prefix_len + n
    return (
        torch.randn(n, heads, dn, generator=g),
        torch.randn(n, heads, dr, generator=g),
        torch.randn(t, c, generator=g),
        torch.randn(t, dr, generator=g),
        torch.randn(heads * (dn + dv), c, generator=g) * 0.2,
    )


@pytest.mark.parametrize("prefix_len", [0, 1, 7, 40])
@pytest.mark.parametrize("reference", [False, True])
def test_decompressed_and_absorbed_agree(prefix_len, reference):
    q_nope, q_rope, latent, k_rope, w = _inputs(prefix_len=prefix_len)
    scale = (16 + 8) ** -0.5
    a = mla_decompressed(q_nope, q_rope, latent, k_rope, w, Attend(prefix_len, scale, reference=reference))
    b = mla_absorbed(q_nope, q_rope, latent, k_rope, w, Attend(prefix_len, scale, reference=reference))
    assert a.shape == (5, 4, 12)
    torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("form", [mla_decompressed, mla_absorbed])
@pytest.mark.parametrize("span_len", [1, 6, 13, 39])
def test_a_prefix_decompressed_in_spans_equals_it_whole(form, span_len):
    """40 cached tokens in spans of span_len (the last one shorter), merged by log-sum-exp into the chunk's part:
    the same as the whole prefix at once and as the dense-mask oracle."""
    args = _inputs(prefix_len=40)
    whole = form(*args, Attend(40, 0.2, span_len=40))
    spanned = form(*args, Attend(40, 0.2, span_len=span_len))
    torch.testing.assert_close(spanned, whole, **TOL)
    torch.testing.assert_close(spanned, form(*args, Attend(40, 0.2, reference=True)), **TOL)
    with pytest.raises(ValueError, match="span_len 0 must be at least 1"):
        form(*args, Attend(40, 0.2, span_len=0))


def test_fast_path_equals_dense_mask_reference():
    q_nope, q_rope, latent, k_rope, w = _inputs(prefix_len=9)
    fast = mla_decompressed(q_nope, q_rope, latent, k_rope, w, Attend(9, 0.2))
    ref = mla_decompressed(q_nope, q_rope, latent, k_rope, w, Attend(9, 0.2, reference=True))
    torch.testing.assert_close(fast, ref, **TOL)


def test_the_latent_pool_holds_one_row_a_token():
    spec = load_spec("tiny-mla")
    cache = make_cache(spec, range(spec.num_layers), page_size=4)
    assert isinstance(cache.kv_pool, LatentPool)
    assert set(cache.kv_pool.latent) == set(range(4))
    assert cache.kv_pool.latent[0].shape == (cache.kv_alloc.total_slots, spec.kv_lora_rank + spec.qk_rope_head_dim)


def test_layer_forms_agree_through_the_pool():
    """The same MLA layer, its rows read back from the paged pool, in both forms."""
    spec = load_spec("tiny-mla")
    torch.manual_seed(0)
    layers = [
        MLAttention(spec, 0, dtype=torch.float32, device="cpu", form=MLAForm(absorb=absorb)) for absorb in (False, True)
    ]
    layers[1].load_state_dict(layers[0].state_dict())
    x = torch.randn(20, spec.hidden_size)
    outs = []
    for layer in layers:
        cache = make_cache(spec, range(spec.num_layers), page_size=4)
        req = Request(0)
        assert cache.admit(req) and cache.extend(req, 12) is not None
        layer(x[:12], cache, req, 0)
        assert cache.extend(req, 8) is not None
        outs.append(layer(x[12:], cache, req, 12))
    torch.testing.assert_close(outs[0], outs[1], **TOL)


@pytest.mark.parametrize("page_size", [1, 4])
def test_chunked_equals_one_shot(page_size):
    spec = load_spec("tiny-mla")
    one = chunked_logits(spec, [40], page_size=page_size)
    for chunks in ([13, 27], [1, 15, 24]):
        torch.testing.assert_close(chunked_logits(spec, chunks, page_size=page_size), one, **TOL)
    torch.testing.assert_close(chunked_logits(spec, [13, 27], attention_backend="reference"), one, **TOL)

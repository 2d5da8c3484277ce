"""Attention numerics: paged attention over a scattered KV buffer == dense causal SDPA; RoPE is relative."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ppprof.model.attention import apply_rope, paged_attention, prefix_causal_mask, rope_cos_sin


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Full causal attention over all positions, KV heads repeated per query head. q: (L, heads, dim); k, v:
    (L, kv_heads, dim) -> (L, heads, dim)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    return out.transpose(0, 1)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("prefix_len,n", [(0, 9), (0, 1), (13, 7), (20, 1), (5, 30)])
def test_paged_attention_equals_dense_sdpa(num_heads, num_kv_heads, prefix_len, n):
    gen = torch.Generator().manual_seed(prefix_len * 100 + n)
    total, head_dim, total_slots = prefix_len + n, 8, 64
    q = torch.randn(total, num_heads, head_dim, generator=gen)
    k = torch.randn(total, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(total, num_kv_heads, head_dim, generator=gen)
    # Scatter K/V over a buffer at shuffled slots (slot 0 stays the pad slot) and fill the rest with garbage that
    # must never be read.
    slots = torch.randperm(total_slots - 1, generator=gen)[:total] + 1
    k_buf = torch.full((total_slots, num_kv_heads, head_dim), 1e4)
    v_buf = torch.full((total_slots, num_kv_heads, head_dim), -1e4)
    k_buf[slots], v_buf[slots] = k, v
    got = paged_attention(q[prefix_len:], k_buf, v_buf, slots, prefix_len)
    want = dense_reference(q, k, v)[prefix_len:]
    assert got.shape == (n, num_heads, head_dim)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_paged_attention_checks_slot_count():
    q, buf = torch.zeros(3, 2, 8), torch.zeros(16, 2, 8)
    with pytest.raises(ValueError, match="prefix_len"):
        paged_attention(q, buf, buf, torch.arange(1, 5), prefix_len=2)


def test_prefix_causal_mask():
    want = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(prefix_causal_mask(3, 2, torch.device("cpu")), want)


def test_rope_scores_depend_only_on_relative_position():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 2, 16, generator=gen), torch.randn(1, 2, 16, generator=gen)

    def score(pos_q: int, pos_k: int) -> torch.Tensor:
        rq = apply_rope(q, *rope_cos_sin(torch.tensor([pos_q]), 16, 10000.0))
        rk = apply_rope(k, *rope_cos_sin(torch.tensor([pos_k]), 16, 10000.0))
        return (rq * rk).sum(-1)

    torch.testing.assert_close(score(7, 3), score(104, 100), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(score(7, 3), score(7, 5))
    torch.testing.assert_close(apply_rope(q, *rope_cos_sin(torch.tensor([0]), 16, 10000.0)), q)

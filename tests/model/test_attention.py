"""Attention numerics: both kernels over a scattered KV buffer == dense causal SDPA; the fast path == the reference\nand builds no dense mask; RoPE is relative."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from ppprof.model.attention import apply_rope, rope_cos_sin
from ppprof.model.attention_kernels import (
    CPU_FLASH,
    prefix_causal_mask,
    reference_attention,
    resolve_attention_backend,
    sdpa_attention,
)


def dense_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Full causal attention over all positions, KV heads repeated per query head. q: (L, heads, dim); k, v:
    (L, kv_heads, dim) -> (L, heads, dim)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True)
    return out.transpose(0, 1)


def scattered(num_heads, num_kv_heads, prefix_len, n, head_dim=8, total_slots=None, dtype=torch.float32, seed=0):
    """q, k, v of every position, and K/V scattered over a buffer at shuffled slots (slot 0 stays the pad slot), the
    rest garbage that must never be read."""
    gen = torch.Generator().manual_seed(seed * 1000 + prefix_len * 100 + n)
    total = prefix_len + n
    total_slots = total_slots or total + 16
    q = torch.randn(total, num_heads, head_dim, generator=gen)
    k = torch.randn(total, num_kv_heads, head_dim, generator=gen)
    v = torch.randn(total, num_kv_heads, head_dim, generator=gen)
    slots = torch.randperm(total_slots - 1, generator=gen)[:total] + 1
    k_buf = torch.full((total_slots, num_kv_heads, head_dim), 1e4)
    v_buf = torch.full((total_slots, num_kv_heads, head_dim), -1e4)
    k_buf[slots], v_buf[slots] = k, v
    return q.to(dtype), k.to(dtype), v.to(dtype), k_buf.to(dtype), v_buf.to(dtype), slots


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (4, 2), (6, 1)])
@pytest.mark.parametrize("prefix_len,n", [(0, 9), (0, 1), (13, 7), (20, 1), (5, 30)])
@pytest.mark.parametrize("attend", [reference_attention, sdpa_attention])
def test_paged_attention_equals_dense_sdpa(num_heads, num_kv_heads, prefix_len, n, attend):
    q, k, v, k_buf, v_buf, slots = scattered(num_heads, num_kv_heads, prefix_len, n)
    got, _ = attend(q[prefix_len:], k_buf, v_buf, slots, prefix_len)
    want = dense_reference(q, k, v)[prefix_len:]
    assert got.shape == (n, num_heads, head_dim := 8) and head_dim
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(8, 2, 64), (4, 4, 32), (32, 8, 128)])
@pytest.mark.parametrize("prefix_len,n", [(0, 64), (0, 1), (1, 1), (37, 50), (300, 1), (1000, 1), (513, 129)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fast_path_equals_the_reference(num_heads, num_kv_heads, head_dim, prefix_len, n, dtype):
    q, _, _, k_buf, v_buf, slots = scattered(num_heads, num_kv_heads, prefix_len, n, head_dim, dtype=dtype)
    got, kernel = sdpa_attention(q[prefix_len:], k_buf, v_buf, slots, prefix_len)
    want, _ = reference_attention(q[prefix_len:], k_buf, v_buf, slots, prefix_len)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got, want, **tol)
    assert kernel == CPU_FLASH


def test_the_fast_path_reads_the_pool_through_pages_as_the_model_does():
    """Both paths through a whole Stage on a paged pool (page 4) give the same logits after a long prefix."""
    from tests.model.helpers import chunked_logits

    spec = make_attention_spec()
    got = chunked_logits(spec, [40, 1, 23], page_size=4, attention_backend="sdpa")
    want = chunked_logits(spec, [40, 1, 23], page_size=4, attention_backend="reference")
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def make_attention_spec():
    from ppprof.specs.spec import LayerSpec, ModelSpec

    return ModelSpec(
        name="gqa",
        family="llama",
        layers=(LayerSpec(mixers=("attention",), ffn="mlp"),) * 2,
        hidden_size=64,
        vocab_size=97,
        intermediate_size=96,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=8,
    )


class ShapeRecorder(TorchDispatchMode):
    """Records the shape of every tensor an aten op returns."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.shapes.append(tuple(t.shape))
        return out


@pytest.mark.parametrize("num_heads,num_kv_heads", [(8, 2), (4, 4)])
def test_no_query_by_key_mask_or_score_matrix_is_built_on_the_fast_path(num_heads, num_kv_heads):
    prefix_len, n = 200, 48
    total, group = prefix_len + n, num_heads // num_kv_heads
    q, _, _, k_buf, v_buf, slots = scattered(num_heads, num_kv_heads, prefix_len, n)

    def dense(shapes):
        return [s for s in shapes if len(s) >= 2 and s[-1] == total and s[-2] in (n, group * n)]

    with ShapeRecorder() as fast:
        sdpa_attention(q[prefix_len:], k_buf, v_buf, slots, prefix_len)
    with ShapeRecorder() as ref:
        reference_attention(q[prefix_len:], k_buf, v_buf, slots, prefix_len)
    assert dense(ref.shapes), "the recorder must see the reference path's dense mask"
    assert dense(fast.shapes) == [], f"{fast.shapes=}"


def test_attention_checks_slot_count():
    q, buf = torch.zeros(3, 2, 8), torch.zeros(16, 2, 8)
    for attend in (sdpa_attention, reference_attention):
        with pytest.raises(ValueError, match="prefix_len"):
            attend(q, buf, buf, torch.arange(1, 5), prefix_len=2)


def test_prefix_causal_mask():
    want = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(prefix_causal_mask(3, 2, torch.device("cpu")), want)


@pytest.mark.parametrize(
    "name,device,expect", [("auto", "cpu", "sdpa"), ("sdpa", "cpu", "sdpa"), ("reference", "cuda", "reference")]
)
def test_backend_resolution(name, device, expect):
    assert resolve_attention_backend(name, device) == expect


@pytest.mark.parametrize("name,device,match", [("flashinfer", "cpu", "runs on CUDA only"), ("fast", "cpu", "unknown")])
def test_a_backend_that_cannot_run_is_refused_naming_the_flag(name, device, match):
    with pytest.raises(ValueError, match=f"--attention-backend.*{match}"):
        resolve_attention_backend(name, device)


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

"""Grouped-query causal attention with RoPE over the paged KV pool: a chunk writes its K/V at its slots, then attends over
the request's whole prefix + chunk, gathered from the pool through the request's slot table."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ppprof.specs.spec import ModelSpec
from ppprof.mem.cache import Request, StageCache


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotary tables for `positions`: (n,) int64 -> cos, sin: (n, head_dim // 2), fp32."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # (n, head_dim // 2)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half (NeoX) RoPE. x: (n, heads, head_dim); cos, sin: (n, head_dim // 2) -> (n, heads, head_dim)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()  # (n, heads, head_dim // 2)
    cos, sin = cos[:, None, :], sin[:, None, :]  # (n, 1, head_dim // 2)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


def prefix_causal_mask(chunk_size: int, prefix_len: int, device: torch.device) -> torch.Tensor:
    """Boolean mask (chunk_size, prefix_len + chunk_size), True where a query may attend: new token i sits at
    position prefix_len + i and sees every key at positions <= prefix_len + i (the whole prefix, causal in the chunk)."""
    total = prefix_len + chunk_size
    return torch.ones(chunk_size, total, dtype=torch.bool, device=device).tril(diagonal=prefix_len)


def paged_attention(q: torch.Tensor, k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor, prefix_len: int,
                    scale: float | None = None) -> torch.Tensor:
    """Causal attention of a chunk over prefix + chunk, K/V gathered from paged buffers.

    q: (n, num_heads, head_dim) for positions [prefix_len, prefix_len + n);
    k_buf, v_buf: (total_slots, num_kv_heads, head_dim); slots: (prefix_len + n,) KV slot of each position.
    Returns (n, num_heads, head_dim).
    """
    n, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[1]
    group = num_heads // num_kv_heads
    total = slots.numel()
    if total != prefix_len + n:
        raise ValueError(f"slots has {total} entries but prefix_len + n is {prefix_len + n}")
    k = k_buf.index_select(0, slots).transpose(0, 1)  # (num_kv_heads, total, head_dim)
    v = v_buf.index_select(0, slots).transpose(0, 1)  # (num_kv_heads, total, head_dim)
    # GQA without copying K/V once per query head: the `group` query heads that share a KV head are stacked along the
    # query axis, so K/V (the long, prefix-sized side) is read once per KV head; the mask is tiled to match.
    q = q.view(n, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(num_kv_heads, group * n, head_dim)
    if prefix_len == 0 and group == 1:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)  # (num_kv_heads, n, head_dim)
    else:
        mask = prefix_causal_mask(n, prefix_len, q.device).repeat(group, 1)  # (group * n, total)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # (num_kv_heads, group * n, head_dim)
    out = out.view(num_kv_heads, group, n, head_dim).permute(2, 0, 1, 3)  # (n, num_kv_heads, group, head_dim)
    return out.reshape(n, num_heads, head_dim)


class Attention(nn.Module):
    """q/k/v/o projections (no bias), RoPE on q and k, paged causal attention."""

    def __init__(self, spec: ModelSpec, layer_id: int, *, dtype: torch.dtype, device: str | torch.device) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = spec.num_attention_heads
        self.num_kv_heads = spec.num_key_value_heads
        self.head_dim = spec.head_dim
        self.rope_theta = spec.rope_theta
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_size, self.kv_size = q_size, kv_size
        kw = dict(bias=False, dtype=dtype, device=device)
        self.qkv_proj = nn.Linear(spec.hidden_size, q_size + 2 * kv_size, **kw)
        self.o_proj = nn.Linear(q_size, spec.hidden_size, **kw)

    def forward(self, x: torch.Tensor, cache: StageCache, req: Request, prefix_len: int) -> torch.Tensor:
        """x: (n, hidden) for positions [prefix_len, prefix_len + n) of `req` -> (n, hidden).

        The chunk's K/V land in the KV pool at the slots of those positions (already in the request's table).
        """
        n = x.shape[0]
        qkv = self.qkv_proj(x)  # (n, q_size + 2 * kv_size)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        positions = torch.arange(prefix_len, prefix_len + n, device=x.device)  # (n,)
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        slots = cache.req_pool.slots(req.req_pool_idx, prefix_len + n)  # (prefix_len + n,)
        pool = cache.kv_pool
        pool.write(self.layer_id, slots[prefix_len:], k, v)
        out = paged_attention(q, pool.k[self.layer_id], pool.v[self.layer_id], slots, prefix_len)
        return self.o_proj(out.reshape(n, self.q_size))  # (n, hidden)

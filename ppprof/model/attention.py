"""Grouped-query causal attention with RoPE over the paged KV pool: a chunk writes its K/V at its slots, then attends over
the request's whole prefix + chunk through the request's slot table, with the stage's attention kernel
(ppprof.model.attention_kernels)."""

from __future__ import annotations

import torch
from torch import nn

from ppprof.mem.cache import Request, StageCache
from ppprof.model.attention_kernels import AttentionKernel
from ppprof.model.tp import NO_TP, TPComm, mark_segments
from ppprof.specs.spec import ModelSpec
from ppprof.specs.tp import rank_shapes


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


class Attention(nn.Module):
    """q/k/v/o projections (no bias), RoPE on q and k, paged causal attention through `kernel` (shared by the stage's
    attention layers). With the spec's qk_norm, q and k are RMS-normalised per head before RoPE (Qwen3); with
    attn_output_gate, q_proj also gives each head a gate and the output is scaled by its sigmoid (Qwen3-Next).
    Under TP (`tp`), this rank's heads only: QKV column-parallel (its query heads, with their gates, and its KV
    heads, replicated where there are fewer KV heads than TP ranks), o_proj row-parallel, then the all-reduce."""

    def __init__(
        self,
        spec: ModelSpec,
        layer_id: int,
        *,
        dtype: torch.dtype,
        device: str | torch.device,
        kernel: AttentionKernel,
        tp: TPComm = NO_TP,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.kernel = kernel
        self.tp = tp
        shapes = rank_shapes(spec, tp.size, tp.rank)
        self.num_heads = shapes.q_heads.size
        self.num_kv_heads = shapes.kv_heads.size
        self.head_dim = spec.head_dim
        self.rope_theta = spec.rope_theta
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        self.q_size, self.kv_size = q_size, kv_size
        self.gated, self.eps = spec.attn_output_gate, spec.rms_norm_eps
        self.q_width = q_size * (2 if self.gated else 1)
        kw = dict(bias=False, dtype=dtype, device=device)
        self.qkv_proj = nn.Linear(spec.hidden_size, self.q_width + 2 * kv_size, **kw)
        self.o_proj = nn.Linear(q_size, spec.hidden_size, **kw)
        d = self.head_dim
        q_unit = 2 * d if self.gated else d  # a gated head's query and gate side by side
        mark_segments(
            self.qkv_proj.weight, [(shapes.q_heads, q_unit), (shapes.kv_heads, d), (shapes.kv_heads, d)], dim=0
        )
        mark_segments(self.o_proj.weight, [(shapes.q_heads, d)], dim=1)
        if spec.qk_norm:
            self.q_norm = nn.Parameter(torch.ones(self.head_dim, dtype=dtype, device=device))
            self.k_norm = nn.Parameter(torch.ones(self.head_dim, dtype=dtype, device=device))
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, cache: StageCache, req: Request, prefix_len: int) -> torch.Tensor:
        """x: (n, hidden) for positions [prefix_len, prefix_len + n) of `req` -> (n, hidden).

        The chunk's K/V land in the KV pool at the slots of those positions (already in the request's table).
        """
        n = x.shape[0]
        qkv = self.qkv_proj(x)  # (n, q_size + 2 * kv_size)
        q, k, v = qkv.split([self.q_width, self.kv_size, self.kv_size], dim=-1)
        gate = None
        if self.gated:  # each head's query and gate side by side, as Qwen3-Next's q_proj lays them out
            q, gate = q.view(n, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = q.reshape(n, self.num_heads, self.head_dim)
        k = k.view(n, self.num_kv_heads, self.head_dim)
        v = v.view(n, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = head_norm(q, self.q_norm, self.eps), head_norm(k, self.k_norm, self.eps)
        positions = torch.arange(prefix_len, prefix_len + n, device=x.device)  # (n,)
        cos, sin = rope_cos_sin(positions, self.head_dim, self.rope_theta)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)

        slots = cache.req_pool.slots(req.req_pool_idx, prefix_len + n)  # (prefix_len + n,)
        pool = cache.kv_pool
        pool.write(self.layer_id, slots[prefix_len:], k, v)
        out = self.kernel(
            q,
            pool.k[self.layer_id],
            pool.v[self.layer_id],
            slots,
            prefix_len,
            page_size=cache.kv_alloc.page_size,
            chunk_id=(req.rid, req.req_pool_idx, prefix_len, n),
        )
        if gate is not None:
            out = out * torch.sigmoid(gate)
        return self.tp.all_reduce(self.o_proj(out.reshape(n, self.q_size)))  # (n, hidden), summed over TP ranks


def head_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over each head's channels. x: (n, heads, head_dim); weight: (head_dim,)."""
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype) * weight

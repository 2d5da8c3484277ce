"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) over the latent KV pool.

Each token keeps one latent c (kv_lora_rank, normed) and one RoPE'd key k_r (qk_rope_head_dim) shared by the heads:
the pool's row. A chunk's prefill after a prefix is computed as serving engines compute it (vLLM's MLA prefill,
SGLang's chunked-prefix MHA path): the prefix's and the chunk's latents are decompressed by kv_b_proj into per-head
keys (k_nope, k_r) and values, then the chunk attends over them, causal with prefix. So every chunk pays a term that
grows with the prefix, kv_b_proj over the L cached tokens (the per-chunk prefix cost g of ATOM's model). The absorbed
form (kv_b_proj's halves folded into the queries and the output, attention over the latent: decode's form) is
`mla_absorbed`; the two agree (tests/model/test_mla.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ppprof.mem.cache import Request, StageCache
from ppprof.model.attention import apply_rope, rope_cos_sin
from ppprof.model.attention_kernels import dense_prefix_attention, prefix_causal_mask
from ppprof.specs.spec import ModelSpec


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last axis, in fp32, back to x's dtype."""
    h = x.float()
    return (h * torch.rsqrt(h.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype) * weight


def mla_decompressed(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    w_kv_b: torch.Tensor,
    prefix_len: int,
    scale: float,
    *,
    reference: bool = False,
) -> torch.Tensor:
    """The prefill form: keys and values rebuilt from the latents, then attention per head.

    q_nope: (n, H, dn); q_rope: (n, H, dr); latent: (T, c) and k_rope: (T, dr) for the T = L + n positions;
    w_kv_b: (H * (dn + dv), c), kv_b_proj's weight. Returns (n, H, dv).
    """
    n, heads, dn = q_nope.shape
    t = latent.shape[0]
    kv = (latent @ w_kv_b.T).view(t, heads, -1)  # (T, H, dn + dv): the prefix's decompression, every chunk
    k_nope, v = kv[..., :dn], kv[..., dn:]
    k = torch.cat([k_nope, k_rope[:, None, :].expand(t, heads, -1)], dim=-1)  # (T, H, dn + dr)
    q = torch.cat([q_nope, q_rope], dim=-1)  # (n, H, dn + dr)
    return _attend(q, k, v, prefix_len, scale, reference)


def mla_absorbed(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    w_kv_b: torch.Tensor,
    prefix_len: int,
    scale: float,
    *,
    reference: bool = False,
) -> torch.Tensor:
    """The absorbed form: q_nope . (W_uk c) = (W_uk^T q_nope) . c, so each head's query moves into the latent space,
    all heads attend over one shared key [c, k_r] with value c, and W_uv maps the result out. Same arguments and
    result as mla_decompressed."""
    n, heads, dn = q_nope.shape
    c = latent.shape[1]
    w = w_kv_b.view(heads, -1, c)  # (H, dn + dv, c)
    w_uk, w_uv = w[:, :dn], w[:, dn:]  # (H, dn, c), (H, dv, c)
    q_latent = torch.einsum("nhd,hdc->nhc", q_nope, w_uk)  # (n, H, c)
    q = torch.cat([q_latent, q_rope], dim=-1)  # (n, H, c + dr)
    k = torch.cat([latent, k_rope], dim=-1)[:, None, :]  # (T, 1, c + dr)
    out_latent = _attend(q, k, latent[:, None, :], prefix_len, scale, reference)  # (n, H, c)
    return torch.einsum("nhc,hvc->nhv", out_latent, w_uv)  # (n, H, dv)


def _attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int, scale: float, reference: bool
) -> torch.Tensor:
    """q: (n, H, d); k: (T, Hk, d); v: (T, Hk, dv) -> (n, H, dv), causal with prefix; `reference`: a dense mask."""
    q4, k4, v4 = q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None]
    if reference:
        mask = prefix_causal_mask(q.shape[0], prefix_len, q.device)
        k4, v4 = (x.expand(-1, q.shape[1], -1, -1) for x in (k4, v4))
        out = F.scaled_dot_product_attention(q4.float(), k4.float(), v4.float(), attn_mask=mask, scale=scale)
        return out[0].transpose(0, 1).to(q.dtype)
    out, _ = dense_prefix_attention(q4, k4, v4, prefix_len, scale)
    return out[0].transpose(0, 1)


class MLAttention(nn.Module):
    """q: q_a_proj -> norm -> q_b_proj (or one q_proj); kv_a_proj -> (latent, k_rope); the latent normed; RoPE on
    q's and k's rotary parts; the latent row written to the pool; attention over the request's rows (decompressed,
    or absorbed with `absorb`); o_proj. No biases."""

    def __init__(
        self,
        spec: ModelSpec,
        layer_id: int,
        *,
        dtype: torch.dtype,
        device: str | torch.device,
        absorb: bool = False,
        reference: bool = False,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.absorb, self.reference = absorb, reference
        self.num_heads = spec.num_attention_heads
        self.nope, self.rope, self.v_dim = spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.v_head_dim
        self.kv_lora_rank = spec.kv_lora_rank
        self.rope_theta, self.eps = spec.rope_theta, spec.rms_norm_eps
        self.scale = spec.qk_head_dim**-0.5
        kw = dict(bias=False, dtype=dtype, device=device)
        h, q_out = spec.hidden_size, self.num_heads * spec.qk_head_dim
        if spec.q_lora_rank:
            self.q_a_proj = nn.Linear(h, spec.q_lora_rank, **kw)
            self.q_a_norm = nn.Parameter(torch.ones(spec.q_lora_rank, dtype=dtype, device=device))
            self.q_b_proj = nn.Linear(spec.q_lora_rank, q_out, **kw)
        else:
            self.q_proj = nn.Linear(h, q_out, **kw)
        self.kv_a_proj = nn.Linear(h, spec.mla_latent_dim, **kw)
        self.kv_a_norm = nn.Parameter(torch.ones(spec.kv_lora_rank, dtype=dtype, device=device))
        self.kv_b_proj = nn.Linear(spec.kv_lora_rank, self.num_heads * (self.nope + self.v_dim), **kw)
        self.o_proj = nn.Linear(self.num_heads * self.v_dim, h, **kw)

    def forward(self, x: torch.Tensor, cache: StageCache, req: Request, prefix_len: int) -> torch.Tensor:
        """x: (n, hidden) for positions [prefix_len, prefix_len + n) of `req` -> (n, hidden); the chunk's latent rows
        land in the pool at the slots of those positions (already in the request's table)."""
        n = x.shape[0]
        if hasattr(self, "q_a_proj"):
            q = self.q_b_proj(rms_norm(self.q_a_proj(x), self.q_a_norm, self.eps))
        else:
            q = self.q_proj(x)
        q = q.view(n, self.num_heads, self.nope + self.rope)
        q_nope, q_rope = q[..., : self.nope], q[..., self.nope :]
        latent, k_rope = self.kv_a_proj(x).split([self.kv_lora_rank, self.rope], dim=-1)
        latent = rms_norm(latent, self.kv_a_norm, self.eps)  # (n, c)
        positions = torch.arange(prefix_len, prefix_len + n, device=x.device)
        cos, sin = rope_cos_sin(positions, self.rope, self.rope_theta)
        q_rope = apply_rope(q_rope, cos, sin)
        k_rope = apply_rope(k_rope[:, None, :], cos, sin)[:, 0]  # (n, dr): one key head shared by all

        slots = cache.req_pool.slots(req.req_pool_idx, prefix_len + n)
        pool = cache.kv_pool
        pool.write(self.layer_id, slots[prefix_len:], torch.cat([latent, k_rope], dim=-1))
        rows = pool.latent[self.layer_id].index_select(0, slots)  # (L + n, c + dr)
        form = mla_absorbed if self.absorb else mla_decompressed
        out = form(
            q_nope,
            q_rope,
            rows[:, : self.kv_lora_rank],
            rows[:, self.kv_lora_rank :],
            self.kv_b_proj.weight,
            prefix_len,
            self.scale,
            reference=self.reference,
        )  # (n, H, dv)
        return self.o_proj(out.reshape(n, self.num_heads * self.v_dim))

"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2) over the latent KV pool.

Each token keeps one latent c (kv_lora_rank, normed) and one RoPE'd key k_r (qk_rope_head_dim) shared by the heads:
the pool's row. A chunk's prefill after a prefix is computed as serving engines compute it (vLLM's MLA prefill,
SGLang's chunked-prefix MHA path): the prefix's and the chunk's latents are decompressed by kv_b_proj into per-head
keys (k_nope, k_r) and values, then the chunk attends over them, causal with prefix. So every chunk pays a term that
grows with the prefix, kv_b_proj over the L cached tokens (the per-chunk prefix cost g of ATOM's model). A prefix
longer than MLA_PREFIX_SPAN_TOKENS is decompressed a span at a time, each span's attention merged into the chunk's
by log-sum-exp (ppprof.model.attention_kernels), so the transient is bounded by the span, not the prefix. The
absorbed form (kv_b_proj's halves folded into the queries and the output, attention over the latent: decode's form)
is `mla_absorbed`; the two agree (tests/model/test_mla.py).

Under TP, as SGLang and vLLM shard it without data-parallel attention: each rank holds its query heads (q_b_proj or
q_proj and kv_b_proj column-parallel by head, o_proj row-parallel, then the all-reduce); q_a_proj and kv_a_proj are
whole, so every rank writes and reads the whole latent row of a token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ppprof.bounds import MLA_PREFIX_SPAN_TOKENS
from ppprof.mem.cache import Request, StageCache
from ppprof.model.attention import apply_rope, rope_cos_sin
from ppprof.model.attention_kernels import (
    attention_lse,
    dense_prefix_attention,
    merge_attention_lse,
    prefix_causal_mask,
)
from ppprof.model.tp import NO_TP, TPComm, mark_segments
from ppprof.specs.spec import ModelSpec
from ppprof.specs.tp import rank_shapes

KeysOf = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""(latent (t, c), k_rope (t, dr)) of t positions -> their keys (t, Hk, dk) and values (t, Hk, dv)."""


@dataclass(frozen=True, slots=True)
class Attend:
    """How a chunk attends over its rows (mla_decompressed, mla_absorbed, attend_spans): causal after `prefix_len`
    cached tokens, its scores scaled by `scale`."""

    prefix_len: int
    scale: float
    """The cached tokens before the chunk, and the softmax scale."""
    reference: bool = False
    span_len: int = MLA_PREFIX_SPAN_TOKENS
    """A dense mask over all rows (the oracle); else a prefix longer than `span_len` decompressed a span at a time."""


@dataclass(frozen=True, slots=True)
class MLAForm:
    """Which form an MLA layer computes (MLAttention): absorbed (decode's form) or decompressed (prefill's), the
    dense-mask reference or not, and the span a long prefix is decompressed in."""

    absorb: bool = False
    reference: bool = False
    span_len: int = MLA_PREFIX_SPAN_TOKENS


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
    attend: Attend,
) -> torch.Tensor:
    """The prefill form: keys and values rebuilt from the latents, then attention per head.

    q_nope: (n, H, dn); q_rope: (n, H, dr); latent: (T, c) and k_rope: (T, dr) for the T = L + attend.prefix_len
    positions; w_kv_b: (H * (dn + dv), c), kv_b_proj's weight (this TP rank's H heads). Returns (n, H, dv). A prefix
    longer than `attend.span_len` is decompressed that many tokens at a time (attend_spans).
    """
    n, heads, dn = q_nope.shape

    def keys(lat: torch.Tensor, kr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        t = lat.shape[0]
        kv = (lat @ w_kv_b.T).view(t, heads, -1)  # (t, H, dn + dv): the decompression, every chunk
        k = torch.cat([kv[..., :dn], kr[:, None, :].expand(t, heads, -1)], dim=-1)  # (t, H, dn + dr)
        return k, kv[..., dn:]

    q = torch.cat([q_nope, q_rope], dim=-1)  # (n, H, dn + dr)
    return attend_spans(q, keys, latent, k_rope, attend)


def mla_absorbed(
    q_nope: torch.Tensor,
    q_rope: torch.Tensor,
    latent: torch.Tensor,
    k_rope: torch.Tensor,
    w_kv_b: torch.Tensor,
    attend: Attend,
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

    def keys(lat: torch.Tensor, kr: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([lat, kr], dim=-1)[:, None, :], lat[:, None, :]  # (t, 1, c + dr), (t, 1, c)

    out_latent = attend_spans(q, keys, latent, k_rope, attend)  # (n, H, c)
    return torch.einsum("nhc,hvc->nhv", out_latent, w_uv)  # (n, H, dv)


def attend_spans(
    q: torch.Tensor, keys: KeysOf, latent: torch.Tensor, k_rope: torch.Tensor, attend: Attend
) -> torch.Tensor:
    """q: (n, H, d) over the T = L + n positions of latent: (T, c), k_rope: (T, dr), causal with prefix -> (n, H, dv).

    Up to `span_len` cached tokens (and `reference`, a dense mask): the keys of all T positions at once. Beyond:
    1. the chunk's own n positions, causal (square), with their log-sum-exp;
    2. the prefix in spans of at most span_len positions, no mask, each merged into the running output by
       log-sum-exp (exact: softmax over a union of key sets), its keys freed before the next span is built.
    """
    prefix_len, scale, reference, span_len = attend.prefix_len, attend.scale, attend.reference, attend.span_len
    if span_len < 1:
        raise ValueError(f"span_len {span_len} must be at least 1")
    if reference or prefix_len <= span_len:
        k, v = keys(latent, k_rope)
        return _attend(q, k, v, prefix_len, scale, reference)
    q4 = q.transpose(0, 1)[None]  # (1, H, n, d)
    d = q4.shape[-1]

    def attend_part(start: int, stop: int, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
        k, v = keys(latent[start:stop], k_rope[start:stop])  # (t, Hk, d), (t, Hk, dv)
        k4, v4 = k.transpose(0, 1)[None], F.pad(v, (0, d - v.shape[-1])).transpose(0, 1)[None]  # V padded to d
        out, lse = attention_lse(q4, k4, v4, causal, scale)  # (1, H, n, d), (1, H, n)
        return out[..., : v.shape[-1]].float(), lse  # (1, H, n, dv) fp32: the running output stays fp32

    out, lse = attend_part(prefix_len, latent.shape[0], causal=True)
    for start in range(0, prefix_len, span_len):
        out, lse = merge_attention_lse(out, lse, *attend_part(start, min(prefix_len, start + span_len), causal=False))
    return out[0].transpose(0, 1).to(q.dtype)  # (n, H, dv)


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
    or absorbed: `form`), the prefix in spans of `form.span_len` tokens; o_proj. No biases. Under TP (`tp`): this
    rank's query heads, then the all-reduce of o_proj's output (see the module docstring)."""

    def __init__(
        self,
        spec: ModelSpec,
        layer_id: int,
        *,
        dtype: torch.dtype,
        device: str | torch.device,
        form: MLAForm = MLAForm(),
        tp: TPComm = NO_TP,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.absorb, self.reference, self.tp = form.absorb, form.reference, tp
        self.prefix_span_len = form.span_len
        heads = rank_shapes(spec, tp.size, tp.rank).q_heads
        self.num_heads = heads.size
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
            q_proj = self.q_b_proj
        else:
            self.q_proj = q_proj = nn.Linear(h, q_out, **kw)
        self.kv_a_proj = nn.Linear(h, spec.mla_latent_dim, **kw)
        self.kv_a_norm = nn.Parameter(torch.ones(spec.kv_lora_rank, dtype=dtype, device=device))
        self.kv_b_proj = nn.Linear(spec.kv_lora_rank, self.num_heads * (self.nope + self.v_dim), **kw)
        self.o_proj = nn.Linear(self.num_heads * self.v_dim, h, **kw)
        mark_segments(q_proj.weight, [(heads, spec.qk_head_dim)], dim=0)  # column-parallel by head
        mark_segments(self.kv_b_proj.weight, [(heads, self.nope + self.v_dim)], dim=0)
        mark_segments(self.o_proj.weight, [(heads, self.v_dim)], dim=1)  # row-parallel

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
        rows = pool.latent[self.layer_id].index_select(0, slots)  # (L + n, c + dr): whole on every TP rank
        form = mla_absorbed if self.absorb else mla_decompressed
        out = form(
            q_nope,
            q_rope,
            rows[:, : self.kv_lora_rank],
            rows[:, self.kv_lora_rank :],
            self.kv_b_proj.weight,
            Attend(prefix_len, self.scale, self.reference, self.prefix_span_len),
        )  # (n, H, dv)
        return self.tp.all_reduce(self.o_proj(out.reshape(n, self.num_heads * self.v_dim)))  # summed over TP ranks

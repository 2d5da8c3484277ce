"""Gated DeltaNet linear attention (Qwen3-Next, Qwen3.5) in pure torch: causal conv and the chunked gated delta rule,
both resumed from and written back to the request's Mamba-pool slot, so a prompt prefilled chunk by chunk ends in the
same state as one prefilled at once; fla's CUDA kernel when it is importable.

The recurrence, per value head, with the state S (key dim x value dim) in fp32:
    S_t = exp(g_t) S_{t-1};  S_t = S_t + k_t (beta_t (v_t - S_t^T k_t))^T;  o_t = S_t^T q_t
(g_t <= 0 the log-decay, beta_t in (0, 1) the write strength, q and k L2-normalised, q scaled by dk^-1/2).
"""

from __future__ import annotations

import importlib.util
import math

import torch
import torch.nn.functional as F
from torch import nn

from ppprof.mem.cache import Request, StageCache
from ppprof.model.mamba import causal_conv
from ppprof.model.tp import NO_TP, TPComm, assign, full_shape, mark_segments
from ppprof.specs.spec import ModelSpec
from ppprof.specs.tp import rank_shapes

DELTANET_TORCH = "torch chunked delta rule (states fp32)"
DELTANET_FLA = "fla chunk_gated_delta_rule"


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The token-by-token recurrence (the oracle). q, k: (T, H, dk); v: (T, H, dv); g, beta: (T, H);
    initial_state: (H, dk, dv) or None (zeros). Returns o: (T, H, dv) and the final state (H, dk, dv), fp32."""
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    state = (
        torch.zeros(q.shape[1], q.shape[2], v.shape[2], device=q.device)
        if initial_state is None
        else initial_state.float().clone()
    )
    out = []
    for t in range(q.shape[0]):
        state = state * g[t].exp()[:, None, None]
        remembered = torch.einsum("hk,hkv->hv", k[t], state)  # S^T k
        delta = (v[t] - remembered) * beta[t][:, None]  # (H, dv)
        state = state + k[t][:, :, None] * delta[:, None, :]
        out.append(torch.einsum("hk,hkv->hv", q[t], state))
    return torch.stack(out), state


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    chunk_size: int,
    initial_state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence, a block of C steps at a time (the WY form of the delta rule). Same arguments and result
    as recurrent_gated_delta_rule. A length that is not a multiple of C is padded with g = 0, beta = 0, k = v = 0
    steps: they leave the state unchanged and their outputs are dropped.

    Inside a block entered with state S, with G_i the cumulative log-decay and gamma_i = exp(G_i):
    1. the writes u_i = beta_i (v_i - gamma_i S^T k_i - sum_{j<i} (gamma_i / gamma_j) (k_i . k_j) u_j) solve the unit
       lower-triangular system (I + M) U = beta V - (beta gamma K) S, M_ij = beta_i (gamma_i / gamma_j) k_i . k_j (j < i):
       U = Uv - W S with Uv = (I + M)^-1 beta V and W = (I + M)^-1 (beta gamma K), both independent of S;
    2. o_i = gamma_i S^T q_i + sum_{j<=i} (gamma_i / gamma_j) (q_i . k_j) u_j;
    3. the state leaving the block: gamma_C S + sum_j (gamma_C / gamma_j) k_j u_j^T.
    Steps 1's solves and 2's intra-block scores run for every block at once; only the state is carried in order.
    """
    seq_len, heads, dk = q.shape
    dv = v.shape[2]
    q, k, v, g, beta = (t.float() for t in (q, k, v, g, beta))
    pad = -seq_len % chunk_size
    if pad:  # pads the time axis (dim 0) at its end
        q, k, v, g, beta = (F.pad(t, (0,) * (2 * t.dim() - 1) + (pad,)) for t in (q, k, v, g, beta))
    blocks, c = (seq_len + pad) // chunk_size, chunk_size

    def split(t: torch.Tensor) -> torch.Tensor:  # (T, H, ...) -> (H, blocks, C, ...)
        return t.view(blocks, c, heads, *t.shape[2:]).movedim(2, 0)

    q, k, v, g, beta = (split(t) for t in (q, k, v, g, beta))
    cum = g.cumsum(dim=-1)  # (H, blocks, C): G_i
    lower = torch.ones(c, c, dtype=torch.bool, device=q.device).tril()
    # gamma_i / gamma_j for j <= i, 0 above (masked before exp: G_i - G_j > 0 there and could overflow).
    decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~lower, -math.inf).exp()  # (H, blocks, C, C)
    k_beta = k * beta[..., None]
    m = (k_beta @ k.transpose(-1, -2) * decay).tril(-1)  # (H, blocks, C, C)
    system = m + torch.eye(c, device=q.device)
    uv = torch.linalg.solve_triangular(system, v * beta[..., None], upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * cum.exp()[..., None], upper=False, unitriangular=True)
    scores = q @ k.transpose(-1, -2) * decay  # (H, blocks, C, C), causal with its diagonal
    q_decayed = q * cum.exp()[..., None]
    last = cum[..., -1]  # (H, blocks): G_C
    k_to_end = k * (last[..., None] - cum).exp()[..., None]  # (H, blocks, C, dk)

    state = torch.zeros(heads, dk, dv, device=q.device) if initial_state is None else initial_state.float().clone()
    out = torch.empty(heads, blocks, c, dv, device=q.device)
    for b in range(blocks):
        u = uv[:, b] - w[:, b] @ state  # (H, C, dv)
        out[:, b] = q_decayed[:, b] @ state + scores[:, b] @ u
        state = last[:, b].exp()[:, None, None] * state + k_to_end[:, b].transpose(-1, -2) @ u
    return out.movedim(0, 2).reshape(blocks * c, heads, dv)[:seq_len], state


def fla_available(device_type: str) -> bool:
    """flash-linear-attention's Triton kernels run on CUDA when the package is importable (ppprof[gpu])."""
    return device_type == "cuda" and importlib.util.find_spec("fla") is not None


class DeltaNetKernel:
    """The chunked delta rule of a stage's Gated DeltaNet layers: fla's fused kernel when importable, else the
    torch path above. `kernel` says which."""

    def __init__(self, device: torch.device) -> None:
        self.fused = fla_available(device.type)
        self.kernel = DELTANET_FLA if self.fused else DELTANET_TORCH

    def __call__(
        self, q, k, v, g, beta, chunk_size: int, initial_state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.fused:
            return chunk_gated_delta_rule(q, k, v, g, beta, chunk_size, initial_state)
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_chunk

        # fla takes (batch, T, heads, dim) with q, k, v of one dtype; q is already scaled (scale 1).
        q, k = q.to(v.dtype), k.to(v.dtype)
        o, state = fla_chunk(
            q=q[None],
            k=k[None],
            v=v[None],
            g=g[None].float(),
            beta=beta[None].to(v.dtype),
            scale=1.0,
            initial_state=initial_state[None].float(),
            output_final_state=True,
        )
        return o[0].float(), state[0].float()


class GatedDeltaNet(nn.Module):
    """in_proj_qkvz -> q, k, v, z; in_proj_ba -> beta, the decay's input; causal conv + SiLU over q, k, v; the gated
    delta rule; RMSNorm per head gated by silu(z); out_proj. Hv / Hk value heads share a key head.

    Under TP (`tp`), as SGLang's and vLLM's Qwen3-Next split it: this rank's key heads and value heads (a value head's
    key head is on the same rank: both split evenly), in_proj_qkvz, in_proj_ba and the conv column-parallel by head,
    A and dt bias its heads', the per-head norm whole, out_proj row-parallel, then the all-reduce. Its conv and
    recurrent states in the Mamba-pool slot are its heads' only."""

    def __init__(
        self,
        spec: ModelSpec,
        layer_id: int,
        *,
        dtype: torch.dtype,
        device: str | torch.device,
        kernel: DeltaNetKernel | None = None,
        tp: TPComm = NO_TP,
    ) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.kernel = kernel or DeltaNetKernel(torch.device(device))
        self.tp = tp
        shapes = rank_shapes(spec, tp.size, tp.rank)
        k_heads, v_heads = shapes.deltanet_key_heads, shapes.deltanet_value_heads
        self.num_k_heads, self.num_v_heads = k_heads.size, v_heads.size
        self.k_dim, self.v_dim = spec.linear_key_head_dim, spec.linear_value_head_dim
        self.key_size, self.value_size = self.num_k_heads * self.k_dim, self.num_v_heads * self.v_dim
        self.chunk_size, self.eps = spec.deltanet_chunk_size, spec.rms_norm_eps
        kw = dict(dtype=dtype, device=device)
        h = spec.hidden_size
        conv_dim = 2 * self.key_size + self.value_size
        self.in_proj_qkvz = nn.Linear(h, conv_dim + self.value_size, bias=False, **kw)
        self.in_proj_ba = nn.Linear(h, 2 * self.num_v_heads, bias=False, **kw)
        self.conv_weight = nn.Parameter(torch.empty(conv_dim, spec.linear_conv_kernel_dim, **kw))
        # A and dt bias stay fp32, as in the reference implementation: they enter exp/softplus on every step.
        self.a_log = nn.Parameter(torch.empty(self.num_v_heads, dtype=torch.float32, device=device))
        self.dt_bias = nn.Parameter(torch.empty(self.num_v_heads, dtype=torch.float32, device=device))
        self.norm_weight = nn.Parameter(torch.empty(self.v_dim, **kw))
        self.out_proj = nn.Linear(self.value_size, h, bias=False, **kw)
        qkv = [(k_heads, self.k_dim), (k_heads, self.k_dim), (v_heads, self.v_dim)]
        mark_segments(self.in_proj_qkvz.weight, [*qkv, (v_heads, self.v_dim)], dim=0)  # q, k, v, z
        mark_segments(self.in_proj_ba.weight, [(v_heads, 1), (v_heads, 1)], dim=0)
        mark_segments(self.conv_weight, qkv, dim=0)
        for p in (self.a_log, self.dt_bias):
            mark_segments(p, [(v_heads, 1)], dim=0)
        mark_segments(self.out_proj.weight, [(v_heads, self.v_dim)], dim=1)

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator, std: float) -> None:
        """Random projections, a conv of unit gain, A in [1, 16] and dt in [1e-3, 1e-1] as Mamba2's init; drawn at
        the full (TP = 1) shapes, this rank keeping its shard."""
        for proj in (self.in_proj_qkvz, self.in_proj_ba):
            assign(proj.weight, torch.randn(full_shape(proj.weight), generator=generator) * std)
        conv_shape = full_shape(self.conv_weight)
        assign(self.conv_weight, torch.randn(conv_shape, generator=generator) / math.sqrt(conv_shape[1]))
        num_v_heads = full_shape(self.a_log)[0]
        assign(self.a_log, torch.empty(num_v_heads).uniform_(1.0, 16.0, generator=generator).log())
        dt = torch.empty(num_v_heads).uniform_(math.log(1e-3), math.log(1e-1), generator=generator).exp()
        assign(self.dt_bias, dt + torch.log(-torch.expm1(-dt)))  # inverse softplus
        assign(self.norm_weight, torch.ones(self.v_dim))
        assign(self.out_proj.weight, torch.randn(full_shape(self.out_proj.weight), generator=generator) * std)

    def forward(self, x: torch.Tensor, cache: StageCache, req: Request) -> torch.Tensor:
        """x: (n, hidden), the request's next n tokens -> (n, hidden). Reads and rewrites the conv and recurrent
        state in the request's Mamba-pool slot."""
        n = x.shape[0]
        conv_state, state = cache.mamba_states(req, self.layer_id)  # (conv_dim, kernel - 1), (Hv, dk, dv) fp32

        qkv, z = self.in_proj_qkvz(x).split([2 * self.key_size + self.value_size, self.value_size], dim=-1)
        b, a = self.in_proj_ba(x).float().split([self.num_v_heads, self.num_v_heads], dim=-1)  # (n, Hv) each
        qkv, new_conv_state = causal_conv(qkv, conv_state, self.conv_weight, None)
        conv_state.copy_(new_conv_state)
        q, k, v = F.silu(qkv).split([self.key_size, self.key_size, self.value_size], dim=-1)
        group = self.num_v_heads // self.num_k_heads
        q = q.view(n, self.num_k_heads, self.k_dim).float().repeat_interleave(group, dim=1)  # (n, Hv, dk)
        k = k.view(n, self.num_k_heads, self.k_dim).float().repeat_interleave(group, dim=1)
        q = F.normalize(q, dim=-1) * self.k_dim**-0.5
        k = F.normalize(k, dim=-1)
        v = v.view(n, self.num_v_heads, self.v_dim)
        beta = b.sigmoid()
        g = -self.a_log.exp() * F.softplus(a + self.dt_bias)  # (n, Hv), <= 0

        o, final_state = self.kernel(q, k, v, g, beta, self.chunk_size, state)  # (n, Hv, dv) fp32
        state.copy_(final_state)
        o = o * torch.rsqrt(o.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # RMSNorm per head
        o = o.to(x.dtype) * self.norm_weight * F.silu(z.view(n, self.num_v_heads, self.v_dim))
        return self.tp.all_reduce(self.out_proj(o.reshape(n, self.value_size)))  # summed over TP ranks

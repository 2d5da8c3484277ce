"""Feed-forward blocks: the gated SiLU MLP and a top-k MoE of gated MLP experts (looped, so its cost grows with the
number of tokens each expert receives, as a grouped-GEMM kernel's would)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ppprof.config import ModelSpec


def gated_silu(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: (n, 2 * inter) -> silu(gate) * up: (n, inter)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


class MLP(nn.Module):
    """down(silu(gate(x)) * up(x)), gate and up fused in one projection."""

    def __init__(self, hidden_size: int, intermediate_size: int, *, dtype: torch.dtype,
                 device: str | torch.device) -> None:
        super().__init__()
        kw = dict(bias=False, dtype=dtype, device=device)
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, **kw)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (n, hidden) -> (n, hidden)."""
        return self.down_proj(gated_silu(self.gate_up_proj(x)))


class MoE(nn.Module):
    """Softmax router, top-k experts per token (weights renormalised over the k), experts as gated SiLU MLPs."""

    def __init__(self, spec: ModelSpec, *, dtype: torch.dtype, device: str | torch.device) -> None:
        super().__init__()
        hidden, inter = spec.hidden_size, spec.moe_intermediate_size
        self.num_experts = spec.num_experts
        self.top_k = spec.num_experts_per_tok
        self.router = nn.Linear(hidden, self.num_experts, bias=False, dtype=dtype, device=device)
        # Experts stacked in two tensors, as checkpoints of fused-MoE kernels lay them out.
        self.w_gate_up = nn.Parameter(torch.empty(self.num_experts, 2 * inter, hidden, dtype=dtype, device=device))
        self.w_down = nn.Parameter(torch.empty(self.num_experts, hidden, inter, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (n, hidden) -> (n, hidden)."""
        probs = torch.softmax(self.router(x).float(), dim=-1)  # (n, experts)
        weights, experts = probs.topk(self.top_k, dim=-1)  # (n, top_k) each
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        token_idx = torch.arange(x.shape[0], device=x.device)[:, None].expand_as(experts).reshape(-1)  # (n * top_k,)
        flat_experts, flat_weights = experts.reshape(-1), weights.reshape(-1)  # (n * top_k,)
        # Sorting the (token, expert) pairs by expert gives each expert a contiguous run, found with one host sync
        # (bincount) instead of one nonzero() per expert.
        order = flat_experts.argsort(stable=True)
        counts = torch.bincount(flat_experts, minlength=self.num_experts).tolist()
        token_idx, flat_weights = token_idx[order], flat_weights[order]
        out = torch.zeros_like(x)
        start = 0
        for e, count in enumerate(counts):
            if count == 0:
                continue
            idx = token_idx[start:start + count]  # (count,)
            w = flat_weights[start:start + count, None]  # (count, 1)
            start += count
            h = gated_silu(x.index_select(0, idx) @ self.w_gate_up[e].T)  # (count, inter)
            out.index_add_(0, idx, (h @ self.w_down[e].T) * w)  # (count, hidden) added at its tokens
        return out

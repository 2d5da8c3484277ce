"""Feed-forward blocks: the MLP (gated SiLU or squared-ReLU, ModelSpec.mlp_act) and a top-k MoE of such MLP experts
(looped, so its cost grows with the number of tokens each expert receives, as a grouped-GEMM kernel's would)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ppprof.model.tp import NO_TP, TPComm, mark_segments
from ppprof.specs.spec import MLP_ACTS, SILU, ModelSpec
from ppprof.specs.tp import Shard, even_shard


def gated_silu(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: (n, 2 * inter) -> silu(gate) * up: (n, inter)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def relu2(up: torch.Tensor) -> torch.Tensor:
    """up: (n, inter) -> relu(up)^2: (n, inter) (Nemotron-H's squared ReLU, not gated)."""
    return F.relu(up).square()


def activate(h: torch.Tensor, act: str) -> torch.Tensor:
    """The output of the input projection -> the inner activation: (n, 2 * inter) for silu, (n, inter) for relu2,
    -> (n, inter)."""
    return gated_silu(h) if act == SILU else relu2(h)


def in_width(intermediate_size: int, act: str) -> int:
    """Width of the input projection: gate and up fused (2 * inter) for the gated silu, up alone for relu2."""
    if act not in MLP_ACTS:
        raise ValueError(f"mlp_act={act!r} is unknown: use one of {', '.join(MLP_ACTS)}")
    return (2 if act == SILU else 1) * intermediate_size


def in_segments(inter: Shard, act: str) -> list[tuple[Shard, int]]:
    """The input projection's rows as TP segments: gate and up each sharded (silu), or up alone (relu2)."""
    return [(inter, 1)] * (2 if act == SILU else 1)


class MLP(nn.Module):
    """down(act(in_proj(x))): silu: in_proj is gate and up fused, act silu(gate) * up; relu2: in_proj is up alone,
    act relu(up)^2. Under TP: in_proj column-parallel, down_proj row-parallel over the intermediate dimension, then
    the all-reduce."""

    def __init__(self, hidden_size: int, intermediate_size: int, *, act: str = SILU, dtype: torch.dtype,
                 device: str | torch.device, tp: TPComm = NO_TP) -> None:
        super().__init__()
        kw = dict(bias=False, dtype=dtype, device=device)
        self.act = act
        self.tp = tp
        inter = even_shard(intermediate_size, tp.size, tp.rank)
        self.in_proj = nn.Linear(hidden_size, in_width(inter.size, act), **kw)
        self.down_proj = nn.Linear(inter.size, hidden_size, **kw)
        mark_segments(self.in_proj.weight, in_segments(inter, act), dim=0)
        mark_segments(self.down_proj.weight, [(inter, 1)], dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (n, hidden) -> (n, hidden)."""
        return self.tp.all_reduce(self.down_proj(activate(self.in_proj(x), self.act)))


class MoE(nn.Module):
    """Softmax router, top-k experts per token (weights renormalised over the k), experts as MLPs with the spec's
    mlp_act. Under TP the experts are sharded by TP (not expert parallel): the router whole on every rank, every
    expert's slice of the expert intermediate dimension, then the all-reduce."""

    def __init__(self, spec: ModelSpec, *, dtype: torch.dtype, device: str | torch.device, tp: TPComm = NO_TP) -> None:
        super().__init__()
        hidden = spec.hidden_size
        shard = even_shard(spec.moe_intermediate_size, tp.size, tp.rank)
        inter = shard.size
        self.tp = tp
        self.act = spec.mlp_act
        self.num_experts = spec.num_experts
        self.top_k = spec.num_experts_per_tok
        self.router = nn.Linear(hidden, self.num_experts, bias=False, dtype=dtype, device=device)
        # Experts stacked in two tensors, as checkpoints of fused-MoE kernels lay them out.
        self.w_in = nn.Parameter(torch.empty(self.num_experts, in_width(inter, self.act), hidden, dtype=dtype,
                                             device=device))
        self.w_down = nn.Parameter(torch.empty(self.num_experts, hidden, inter, dtype=dtype, device=device))
        mark_segments(self.w_in, in_segments(shard, self.act), dim=1)
        mark_segments(self.w_down, [(shard, 1)], dim=2)

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
            h = activate(x.index_select(0, idx) @ self.w_in[e].T, self.act)  # (count, inter)
            out.index_add_(0, idx, (h @ self.w_down[e].T) * w)  # (count, hidden) added at its tokens
        return self.tp.all_reduce(out)

"""Feed-forward blocks: the MLP (gated SiLU or squared-ReLU, ModelSpec.mlp_act) and a top-k MoE of such MLP experts
(looped, so its cost grows with the number of tokens each expert receives, as a grouped-GEMM kernel's would), with
the routers of the MoE families (softmax or sigmoid scores, grouped selection) and their shared experts."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ppprof.model.tp import NO_TP, TPComm, mark_segments
from ppprof.specs.spec import MLP_ACTS, SIGMOID, SILU, ModelSpec
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

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        *,
        act: str = SILU,
        dtype: torch.dtype,
        device: str | torch.device,
        tp: TPComm = NO_TP,
    ) -> None:
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


@dataclass(frozen=True, slots=True)
class Routing:
    """A router's rule (route): how many experts a token takes and how they are scored, grouped and weighted; the
    spec's (MoE)."""

    top_k: int
    scoring: str
    """Experts a token takes, and their scores: SIGMOID (each its own) or softmax (over the experts)."""
    num_groups: int = 1
    topk_groups: int = 1
    """The experts' groups, and the best groups whose experts stay eligible (1, 1: no groups)."""
    norm_topk_prob: bool = True
    scaling: float = 1.0
    """The chosen weights renormalised to sum 1 or not, then times `scaling` (routed_scaling_factor)."""


def route(
    logits: torch.Tensor, routing: Routing, bias: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's experts and their weights by `routing`. logits: (n, experts) fp32 -> weights (n, top_k) fp32,
    experts (n, top_k) int64.

    1. Scores: softmax over the experts, or an independent sigmoid each (DeepSeek-V3).
    2. Choice scores: the scores plus `bias` (DeepSeek-V3's e_score_correction_bias: it moves the choice, never the
       weights).
    3. With groups: each group's score (the sum of its two best choice scores when there is a bias, noaux_tc; its best
       score otherwise, group_limited_greedy); only the topk_groups best groups stay eligible.
    4. The top_k eligible experts; their weights are their scores, renormalised to sum 1 with norm_topk_prob, times
       `scaling` (routed_scaling_factor).
    """
    top_k, num_groups, topk_groups = routing.top_k, routing.num_groups, routing.topk_groups
    scores = torch.sigmoid(logits) if routing.scoring == SIGMOID else torch.softmax(logits, dim=-1)
    choice = scores if bias is None else scores + bias.float()
    if num_groups > 1:
        n, experts = choice.shape
        grouped = choice.view(n, num_groups, experts // num_groups)
        if bias is not None:
            group_score = grouped.topk(min(2, grouped.shape[-1]), dim=-1).values.sum(dim=-1)  # (n, groups)
        else:
            group_score = grouped.max(dim=-1).values
        keep = torch.zeros_like(group_score, dtype=torch.bool)
        keep.scatter_(1, group_score.topk(topk_groups, dim=-1).indices, True)
        choice = grouped.masked_fill(~keep[..., None], -math.inf).view(n, experts)
    experts = choice.topk(top_k, dim=-1).indices  # (n, top_k)
    weights = scores.gather(1, experts)
    if routing.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
    return weights * routing.scaling, experts


class MoE(nn.Module):
    """A router (ppprof.model.mlp.route with the spec's scoring, groups, renormalisation and scaling), top-k experts
    per token as MLPs with the spec's mlp_act, and the shared expert every token runs (gated by a sigmoid in
    Qwen3-Next) when the spec has one. Under TP the experts are sharded by TP (not expert parallel): the router whole
    on every rank, every expert's slice of the expert intermediate dimension, then the all-reduce; the shared expert
    is a TP MLP of its own (its own all-reduce), its gate whole."""

    def __init__(self, spec: ModelSpec, *, dtype: torch.dtype, device: str | torch.device, tp: TPComm = NO_TP) -> None:
        super().__init__()
        hidden = spec.hidden_size
        shard = even_shard(spec.moe_intermediate_size, tp.size, tp.rank)
        inter = shard.size
        self.tp = tp
        self.act = spec.mlp_act
        self.num_experts = spec.num_experts
        self.top_k = spec.num_experts_per_tok
        self.scoring, self.norm_topk_prob = spec.moe_scoring, spec.norm_topk_prob
        self.scaling = spec.routed_scaling_factor
        self.num_groups, self.topk_groups = spec.moe_n_group, spec.moe_topk_group
        self.routing = Routing(
            self.top_k, self.scoring, self.num_groups, self.topk_groups, self.norm_topk_prob, self.scaling
        )
        self.router = nn.Linear(hidden, self.num_experts, bias=False, dtype=dtype, device=device)
        # The selection bias of sigmoid routers, fp32 as DeepSeek-V3 keeps it.
        self.score_bias = (
            nn.Parameter(torch.zeros(self.num_experts, dtype=torch.float32, device=device))
            if self.scoring == SIGMOID
            else None
        )
        # Experts stacked in two tensors, as checkpoints of fused-MoE kernels lay them out.
        self.w_in = nn.Parameter(
            torch.empty(self.num_experts, in_width(inter, self.act), hidden, dtype=dtype, device=device)
        )
        self.w_down = nn.Parameter(torch.empty(self.num_experts, hidden, inter, dtype=dtype, device=device))
        mark_segments(self.w_in, in_segments(shard, self.act), dim=1)
        mark_segments(self.w_down, [(shard, 1)], dim=2)
        shared = spec.shared_expert_intermediate_size
        self.shared = MLP(hidden, shared, act=self.act, dtype=dtype, device=device, tp=tp) if shared else None
        self.shared_gate = (
            nn.Linear(hidden, 1, bias=False, dtype=dtype, device=device) if shared and spec.shared_expert_gate else None
        )

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: (n, hidden) -> weights (n, top_k) fp32, experts (n, top_k)."""
        return route(self.router(x).float(), self.routing, self.score_bias)

    def expert(self, e: int, x: torch.Tensor) -> torch.Tensor:
        """Expert e on x: (m, hidden) -> (m, hidden) (this TP rank's part of it under TP)."""
        return activate(x @ self.w_in[e].T, self.act) @ self.w_down[e].T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: (n, hidden) -> (n, hidden)."""
        weights, experts = self.route(x)
        weights = weights.to(x.dtype)
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
            idx = token_idx[start : start + count]  # (count,)
            w = flat_weights[start : start + count, None]  # (count, 1)
            start += count
            out.index_add_(0, idx, self.expert(e, x.index_select(0, idx)) * w)  # (count, hidden) at its tokens
        return self.tp.all_reduce(out) + self.shared_output(x)  # summed over TP ranks

    def shared_output(self, x: torch.Tensor) -> torch.Tensor:
        """The shared expert's part of the output (0 without one). x: (n, hidden) -> (n, hidden)."""
        if self.shared is None:
            return torch.zeros_like(x)
        out = self.shared(x)
        return out if self.shared_gate is None else out * torch.sigmoid(self.shared_gate(x))

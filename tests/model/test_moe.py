"""The MoE families' routers and shared experts: routing is a function of the seed; the expert loop equals a dense
reference (every expert on every token, weighted by the routing matrix); grouped selection keeps a token's experts
inside its best groups; the selection bias moves the choice, not the weights."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ppprof.model.mlp import MoE, Routing, activate, route
from ppprof.specs import load_spec

TOL = dict(rtol=1e-5, atol=1e-6)

ROUTERS = {
    "qwen3_moe": dict(moe_scoring="softmax", norm_topk_prob=False),
    "deepseek_v2": dict(
        moe_scoring="softmax",
        moe_n_group=4,
        moe_topk_group=2,
        norm_topk_prob=False,
        routed_scaling_factor=16.0,
        shared_expert_intermediate_size=64,
    ),
    "deepseek_v3": dict(
        moe_scoring="sigmoid",
        moe_n_group=4,
        moe_topk_group=2,
        routed_scaling_factor=2.5,
        shared_expert_intermediate_size=32,
    ),
    "qwen3_next": dict(moe_scoring="softmax", shared_expert_intermediate_size=32, shared_expert_gate=True),
}


def _moe(router: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> MoE:
    spec = dataclasses.replace(
        load_spec("tiny-mla"),
        **{"moe_n_group": 1, "moe_topk_group": 1, "shared_expert_intermediate_size": 0, **ROUTERS[router]},
    )
    torch.manual_seed(seed)
    moe = MoE(spec, dtype=dtype, device="cpu")
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, dtype=dtype) * 0.3)
    return moe


def dense_reference(moe: MoE, x: torch.Tensor) -> torch.Tensor:
    """Every expert on every token, combined through the (tokens, experts) routing matrix."""
    weights, experts = moe.route(x)
    combine = x.new_zeros(x.shape[0], moe.num_experts).scatter(1, experts, weights.to(x.dtype))  # (n, experts)
    every = torch.stack(
        [activate(x @ moe.w_in[e].T, moe.act) @ moe.w_down[e].T for e in range(moe.num_experts)], dim=1
    )  # (n, experts, hidden)
    return (combine[..., None] * every).sum(dim=1) + moe.shared_output(x)


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_expert_loop_equals_dense_reference(router):
    """In float64: the two sum the experts in another order, which float32 (with deepseek_v2's routed scale of 16)
    tells apart by 3e-5 on some CPUs' kernels."""
    moe = _moe(router, dtype=torch.float64)
    x = torch.randn(37, moe.w_in.shape[2], generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    torch.testing.assert_close(moe(x), dense_reference(moe, x), **TOL)


@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_routing_is_deterministic_from_the_seed(router):
    x = torch.randn(50, 64, generator=torch.Generator().manual_seed(1))
    a, b, c = _moe(router, 0).route(x), _moe(router, 0).route(x), _moe(router, 1).route(x)
    assert torch.equal(a[1], b[1]) and torch.equal(a[0], b[0])
    assert not torch.equal(a[1], c[1]), "another seed routes differently"


def test_grouped_selection_stays_in_the_best_groups():
    logits = torch.randn(200, 8, generator=torch.Generator().manual_seed(0))
    _, experts = route(logits, Routing(top_k=2, scoring="sigmoid", num_groups=4, topk_groups=2), torch.zeros(8))
    groups = experts // 2  # (n, 2): the group of each chosen expert
    scores = torch.sigmoid(logits).view(200, 4, 2).sum(-1)  # two experts a group: the sum of both is its score
    best = scores.topk(2, dim=-1).indices
    for row, chosen in enumerate(groups.tolist()):
        assert set(chosen) <= set(best[row].tolist()), f"{row=}"


def test_bias_moves_the_choice_not_the_weights():
    logits = torch.zeros(1, 4)
    logits[0, 0] = 3.0
    bias = torch.tensor([-10.0, 0.0, 0.0, 10.0])
    weights, experts = route(logits, Routing(top_k=2, scoring="sigmoid", norm_topk_prob=False), bias)
    assert experts.tolist() == [[3, 1]] or experts.tolist() == [[3, 2]]
    torch.testing.assert_close(weights, torch.full((1, 2), 0.5))


def test_norm_and_scaling():
    logits = torch.randn(5, 8, generator=torch.Generator().manual_seed(0))
    weights, _ = route(logits, Routing(top_k=3, scoring="softmax", norm_topk_prob=True, scaling=2.5))
    torch.testing.assert_close(weights.sum(-1), torch.full((5,), 2.5))

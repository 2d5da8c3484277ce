"""FFN numerics: the MLP and the MoE's expert loop == per-token references written from the definitions, for the gated
SiLU (Llama) and the non-gated squared-ReLU (Nemotron-H) activations."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from ppprof.model.mlp import MLP, MoE
from ppprof.model.stage import Stage
from ppprof.specs.spec import LayerSpec, ModelSpec

from .helpers import tiny_hybrid

HIDDEN, INTER = 16, 24


def expert_ref(x: torch.Tensor, w_in: torch.Tensor, w_down: torch.Tensor, act: str) -> torch.Tensor:
    """One token through one MLP. x: (hidden,); w_in: (2 * inter, hidden) gate then up, or (inter, hidden) up;
    w_down: (hidden, inter)."""
    if act == "silu":
        inter = w_down.shape[1]
        h = F.silu(w_in[:inter] @ x) * (w_in[inter:] @ x)
    else:
        h = torch.relu(w_in @ x) ** 2
    return w_down @ h


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.Generator:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return gen


@pytest.mark.parametrize("act, num_matrices", [("silu", 3), ("relu2", 2)])
def test_mlp_equals_reference(act, num_matrices):
    mlp = MLP(HIDDEN, INTER, act=act, dtype=torch.float32, device="cpu")
    assert sum(p.numel() for p in mlp.parameters()) == num_matrices * HIDDEN * INTER
    gen = randomize(mlp)
    x = torch.randn(7, HIDDEN, generator=gen)
    with torch.no_grad():
        got = mlp(x)
        want = torch.stack([expert_ref(t, mlp.in_proj.weight, mlp.down_proj.weight, act) for t in x])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_relu2_is_squared_relu_not_gated():
    """relu2 on an up projection that is negative for half the units: those units contribute nothing."""
    mlp = MLP(2, 2, act="relu2", dtype=torch.float32, device="cpu")
    with torch.no_grad():
        mlp.in_proj.weight.copy_(torch.tensor([[1.0, 0.0], [-1.0, 0.0]]))
        mlp.down_proj.weight.copy_(torch.eye(2))
        got = mlp(torch.tensor([[3.0, 5.0]]))
    assert torch.equal(got, torch.tensor([[9.0, 0.0]])), f"{got=}"


@pytest.mark.parametrize("act", ["silu", "relu2"])
def test_moe_equals_per_token_reference(act):
    spec = dataclasses.replace(tiny_hybrid(), mlp_act=act)
    moe = MoE(spec, dtype=torch.float32, device="cpu")
    inter, hidden, experts = spec.moe_intermediate_size, spec.hidden_size, spec.num_experts
    assert moe.w_in.shape == (experts, (2 if act == "silu" else 1) * inter, hidden), f"{moe.w_in.shape=}"
    gen = randomize(moe)
    x = torch.randn(9, hidden, generator=gen)
    with torch.no_grad():
        got = moe(x)
        probs = torch.softmax(x @ moe.router.weight.T, dim=-1)
        want = torch.zeros_like(x)
        for t in range(x.shape[0]):
            weights, top = probs[t].topk(spec.num_experts_per_tok)
            for w, e in zip(weights / weights.sum(), top.tolist()):
                want[t] += w * expert_ref(x[t], moe.w_in[e], moe.w_down[e], act)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("act, num_matrices", [("silu", 3), ("relu2", 2)])
def test_stage_builds_the_spec_activation(act, num_matrices):
    """A layer's MLP and MoE take the spec's mlp_act: relu2 holds 2 matrices an expert, silu 3."""
    spec = ModelSpec(
        name="t",
        family="nemotron_h",
        layers=(LayerSpec(ffn="mlp"), LayerSpec(ffn="moe")),
        hidden_size=HIDDEN,
        vocab_size=32,
        intermediate_size=INTER,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=8,
        mlp_act=act,
    )
    stage = Stage(spec, range(2))
    mlp, moe = stage.layers["0"].ffn, stage.layers["1"].ffn
    assert mlp.act == moe.act == act
    assert sum(p.numel() for p in mlp.parameters()) == num_matrices * HIDDEN * INTER
    assert sum(p.numel() for n, p in moe.named_parameters() if n != "router.weight") == num_matrices * 2 * HIDDEN * 8

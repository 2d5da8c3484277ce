"""MoE numerics: the expert loop == a per-token dense computation of the same routing."""

from __future__ import annotations

import torch

from ppprof.model.mlp import MoE, gated_silu

from .helpers import tiny_hybrid


def test_moe_equals_per_token_reference():
    spec = tiny_hybrid()
    moe = MoE(spec, dtype=torch.float32, device="cpu")
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in moe.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    x = torch.randn(9, spec.hidden_size, generator=gen)
    with torch.no_grad():
        got = moe(x)
        probs = torch.softmax(x @ moe.router.weight.T, dim=-1)
        want = torch.zeros_like(x)
        for t in range(x.shape[0]):
            weights, experts = probs[t].topk(spec.num_experts_per_tok)
            for w, e in zip(weights / weights.sum(), experts.tolist()):
                want[t] += w * (gated_silu(x[t:t + 1] @ moe.w_gate_up[e].T) @ moe.w_down[e].T)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

"""The dry run's per-rank figures against counts made another way: each model's parameters written out by hand from
its config.json (its own field names, not ppprof's spec), split as SGLang and vLLM shard them over TP ranks, the
published total divided in the proportions of the layout, and the pools from their published shapes."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from ppprof.specs import split_layers
from tests.run.dry_runs import DATA, HEADLINE, PUBLISHED_PARAMS, published_dry_run

BF16, FP32 = 2, 4


@dataclass
class Count:
    """Parameters at TP 1 (`full`), those one TP rank holds (`held`), and of those the fp32 ones."""

    tp: int
    full: int = 0
    held: int = 0
    fp32: int = 0

    def split(self, n: int, fp32: bool = False) -> None:
        assert n % self.tp == 0, f"{n=} {self.tp=}"
        self.full += n
        self.held += n // self.tp
        self.fp32 += n // self.tp if fp32 else 0

    def whole(self, n: int, fp32: bool = False) -> None:
        self.full += n
        self.held += n
        self.fp32 += n if fp32 else 0

    def kv_heads(self, h: int, kv_heads: int, head_dim: int) -> None:
        """k and v projections: split by KV head, or one head a rank where there are fewer heads than ranks."""
        self.full += 2 * h * kv_heads * head_dim
        self.held += 2 * h * head_dim * max(1, kv_heads // self.tp)


def is_attention(c: dict, i: int) -> bool:
    """Qwen3-Next: every full_attention_interval-th layer is full attention, the rest Gated DeltaNet."""
    return (i + 1) % c.get("full_attention_interval", 1) == 0


def count_layer(c: dict, i: int, count: Count) -> None:
    h = c["hidden_size"]
    heads = c["num_attention_heads"]
    if "kv_lora_rank" in c:  # MLA: the latent projections whole on every rank, the per-head ones split
        qr, lat, dn, dr, dv = (
            c[k] for k in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        )
        count.whole(h * qr + qr + h * (lat + dr) + lat)
        count.split(qr * heads * (dn + dr) + lat * heads * (dn + dv) + heads * dv * h)
    elif is_attention(c, i):  # GQA (+ the output gate of Qwen3-Next), q/k norms whole
        d = c["head_dim"]
        count.split((3 if "full_attention_interval" in c else 2) * h * heads * d)
        count.kv_heads(h, c["num_key_value_heads"], d)
        count.whole(2 * d)
    else:  # Gated DeltaNet: heads split, the gated norm whole, A_log and dt_bias fp32
        hk, hv, dk, dv = (
            c[k]
            for k in ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
        )
        conv = 2 * hk * dk + hv * dv
        count.split(h * (2 * hk * dk + 2 * hv * dv) + h * 2 * hv + conv * c["linear_conv_kernel_dim"] + hv * dv * h)
        count.split(2 * hv, fp32=True)
        count.whole(dv)
    experts = c.get("n_routed_experts") or c.get("num_experts")
    if i < c.get("first_k_dense_replace", 0):
        count.split(3 * h * c["intermediate_size"])
    else:  # router whole (and its fp32 selection bias with sigmoid scores); experts and shared expert split
        count.whole(h * experts)
        if c.get("scoring_func") == "sigmoid":
            count.whole(experts, fp32=True)
        shared = c.get("n_shared_experts", 0) * c["moe_intermediate_size"] + c.get("shared_expert_intermediate_size", 0)
        count.split(3 * h * c["moe_intermediate_size"] * experts + 3 * h * shared)
        if "shared_expert_intermediate_size" in c:
            count.whole(h)  # Qwen3-Next's shared-expert gate
    count.whole(2 * h)  # the two norms


def count_stage(c: dict, layers: range, tp: int) -> Count:
    count = Count(tp)
    for i in layers:
        count_layer(c, i, count)
    h, vocab = c["hidden_size"], c["vocab_size"]
    for end in (layers.start == 0, layers.stop == c["num_hidden_layers"]):  # embedding; LM head
        if end:
            count.full += vocab * h
            count.held += -(-vocab // tp) * h  # vocab-parallel, the last shard padded
    if layers.stop == c["num_hidden_layers"]:
        count.whole(h)  # final norm
    return count


def pool_bytes(c: dict, layers: range, tp: int, kv_slots: int, mamba_slots: int) -> tuple[int, int]:
    """(KV or latent pool, Mamba pool) bytes of one TP rank in bf16: MLA's latent + RoPE key whole on every rank; K
    and V of the rank's KV heads; a Gated DeltaNet slot's conv state for the rank's channels and its heads' fp32
    recurrent state."""
    kv = state = 0
    for i in layers:
        if "kv_lora_rank" in c:
            kv += (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * BF16
        elif is_attention(c, i):
            kv += 2 * max(1, c["num_key_value_heads"] // tp) * c["head_dim"] * BF16
        else:
            hk, hv, dk, dv = (
                c[k]
                for k in (
                    "linear_num_key_heads",
                    "linear_num_value_heads",
                    "linear_key_head_dim",
                    "linear_value_head_dim",
                )
            )
            conv = (2 * hk * dk + hv * dv) // tp * (c["linear_conv_kernel_dim"] - 1) * BF16
            state += conv + hv // tp * dk * dv * FP32
    return kv * kv_slots, state * mamba_slots


@pytest.fixture(scope="module", params=HEADLINE, ids=[f"{f}-pp{p}-tp{t}" for f, p, t in HEADLINE])
def deployment(request):
    folder = request.param[0]
    cfg, run = published_dry_run(*request.param)
    return folder, json.loads((DATA / folder / "config.json").read_text()), cfg, run


def test_the_hand_count_is_the_published_total_within_1_percent(deployment):
    folder, c, _, run = deployment
    total = sum(
        count_stage(c, layers, run.tp_size).full for layers in split_layers(c["num_hidden_layers"], run.pp_size)
    )
    assert abs(total / PUBLISHED_PARAMS[folder] - 1) < 0.01, f"{folder=} {total=:,}"


def test_every_rank_agrees_with_the_hand_count_and_the_published_total_divided_within_1_percent(deployment):
    folder, c, cfg, run = deployment
    stages = [count_stage(c, layers, run.tp_size) for layers in split_layers(c["num_hidden_layers"], run.pp_size)]
    total = sum(s.full for s in stages)
    kv_slots = (cfg.pools.max_total_tokens // cfg.pools.page_size + 1) * cfg.pools.page_size
    for r in run.ranks:
        hand = stages[r.stage_idx]
        published_divided = (
            PUBLISHED_PARAMS[folder] * hand.held / total
        )  # the published total, as the layout divides it
        weights = (hand.held - hand.fp32) * BF16 + hand.fp32 * FP32
        kv, mamba = pool_bytes(c, r.layers, run.tp_size, kv_slots, cfg.pools.max_mamba_cache_size + 1)
        for what, measured, counted in (
            ("params (hand)", r.num_params, hand.held),
            ("params (published)", r.num_params, published_divided),
            ("weights", r.weights, weights),
            ("kv pool", r.kv_pool, kv),
            ("mamba pool", r.mamba_pool, mamba),
        ):
            assert measured == counted == 0 or abs(measured / counted - 1) < 0.01, (
                f"{r.rank=} {what} {measured=:,} {counted=:,.0f}"
            )

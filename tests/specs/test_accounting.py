"""Per-stage accounting, exact for a tiny spec computed by hand."""

from __future__ import annotations

import dataclasses

import pytest

from ppprof.specs import kv_bytes_per_token, layer_params, load_spec, mamba_bytes_per_slot, stage_accounts, stage_params
from ppprof.specs.spec import ATTENTION, MAMBA, MLP, MOE, LayerSpec, ModelSpec, layers_pattern


@pytest.fixture
def spec():
    # Layers: attention + MLP, mamba only, MoE only.
    return ModelSpec(
        name="hand",
        family="nemotron_h",
        layers=(LayerSpec(mixers=(ATTENTION,), ffn=MLP), LayerSpec(mixers=(MAMBA,)), LayerSpec(ffn=MOE)),
        hidden_size=8,
        vocab_size=10,
        intermediate_size=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=4,
        mamba_num_heads=2,
        mamba_head_dim=4,
        ssm_state_size=3,
        conv_kernel=4,
        mamba_n_groups=1,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=5,
    )


def test_layer_params_by_hand(spec):
    # attention: q 8*8 + o 8*8 + k 8*4 + v 8*4 = 192; mlp 3*8*16 = 384; two norms 2*8.
    assert layer_params(spec, spec.layers[0]) == dict(attention=192, deltanet=0, mamba=0, mlp=384, moe=0, norm=16)
    # mamba: d_inner 8, conv_dim 8 + 2*1*3 = 14; in_proj 8*(16+6+2) = 192; conv 14*4 + 14 = 70;
    # dt_bias, A_log, D 3*2 = 6; gated norm 8; out_proj 8*8 = 64 -> 340; one norm 8.
    assert layer_params(spec, spec.layers[1]) == dict(attention=0, deltanet=0, mamba=340, mlp=0, moe=0, norm=8)
    # moe: router 8*2 = 16, experts 2*3*8*5 = 240; one norm 8.
    assert layer_params(spec, spec.layers[2]) == dict(attention=0, deltanet=0, mamba=0, mlp=0, moe=256, norm=8)


def test_relu2_mlp_and_experts_have_two_matrices(spec):
    """mlp_act relu2 (Nemotron-H): up and down only, in the MLP and in every MoE expert."""
    spec = dataclasses.replace(spec, mlp_act="relu2")
    # mlp 2*8*16 = 256; moe: router 16 + experts 2*2*8*5 = 160.
    assert layer_params(spec, spec.layers[0])["mlp"] == 256
    assert layer_params(spec, spec.layers[2])["moe"] == 176


def test_stage_params_by_hand(spec):
    first = stage_params(spec, range(0, 2))
    assert first == dict(
        embedding=80, attention=192, deltanet=0, mamba=340, mlp=384, moe=0, norm=24, lm_head=0, total=1020
    )
    last = stage_params(spec, range(2, 3))
    # final norm 8 and lm_head 10*8 on the last stage.
    assert last == dict(embedding=0, attention=0, deltanet=0, mamba=0, mlp=0, moe=256, norm=16, lm_head=80, total=352)
    whole = stage_params(spec, range(3))
    assert whole["total"] == first["total"] + last["total"]


def test_kv_and_mamba_bytes_by_hand(spec):
    # KV: 2 * kv_heads 1 * head_dim 4 * bytes, one attention layer.
    assert kv_bytes_per_token(spec, dtype="bfloat16") == 16
    assert kv_bytes_per_token(spec, dtype="float32") == 32
    assert kv_bytes_per_token(spec, range(1, 3), dtype="float32") == 0
    # Mamba: conv 14 * 3 * bytes + ssm 2*4*3 * 4 (fp32 always).
    assert mamba_bytes_per_slot(spec, dtype="bfloat16") == 14 * 3 * 2 + 96 == 180
    assert mamba_bytes_per_slot(spec, dtype="float32") == 14 * 3 * 4 + 96 == 264
    assert mamba_bytes_per_slot(spec, range(2, 3), dtype="float32") == 0
    # Default: the spec's dtype, else bfloat16.
    assert kv_bytes_per_token(spec) == 16


def test_stage_accounts(spec):
    stages = stage_accounts(spec, 2, [2, 1], dtype="float32")
    assert [(s.stage_idx, s.layers) for s in stages] == [(0, range(0, 2)), (1, range(2, 3))]
    assert [s.num_params["total"] for s in stages] == [1020, 352]
    assert [s.kv_bytes_per_token for s in stages] == [32, 0]
    assert [s.mamba_bytes_per_slot for s in stages] == [264, 0]
    assert [s.layout for s in stages] == ["*- M", "E"]
    d = stages[0].to_dict()
    assert (d["layer_start"], d["layer_stop"], d["pattern"]) == (0, 2, layers_pattern(spec.layers[:2]))
    with pytest.raises(ValueError, match="cannot be greater than layers"):
        stage_accounts(spec, 4)


def test_llama3_8b_matches_published_count():
    # Meta-Llama-3-8B has 8,030,261,248 parameters (untied embeddings).
    spec = load_spec("llama3-8b")
    assert sum(s.num_params["total"] for s in stage_accounts(spec, 4)) == 8_030_261_248
    # 32 layers * 2 * 8 kv heads * 128 * 2 bytes = 128 KiB per token.
    assert kv_bytes_per_token(spec, dtype="bf16") == 131072


def test_nemotron_h_8b_matches_published_size():
    # Nemotron-H-8B-Base is published as ~8.1B parameters; with a gated MLP (3 matrices) ppprof counted 10.2B.
    spec = load_spec("nemotron-h-8b")
    total = sum(s.num_params["total"] for s in stage_accounts(spec, 4))
    assert total == 8_100_852_736, f"{total=:,}"


def test_stage_totals_add_up_for_every_preset():
    for name in ("tiny-dense", "tiny-hybrid", "nemotron-h-8b", "jamba-mini"):
        spec = load_spec(name)
        one = stage_accounts(spec, 1)[0]
        many = stage_accounts(spec, 4)
        assert sum(s.num_params["total"] for s in many) == one.num_params["total"], f"{name=}"
        assert sum(s.kv_bytes_per_token for s in many) == one.kv_bytes_per_token
        assert sum(s.mamba_bytes_per_slot for s in many) == one.mamba_bytes_per_slot

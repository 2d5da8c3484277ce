"""HuggingFace config.json loading, one small real-looking config per supported family."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ppprof.specs import SUPPORTED_MODEL_TYPES, load_spec
from ppprof.specs.pattern import format_layers

DATA = Path(__file__).parent / "data"

# family -> (layout, expected fields)
EXPECTED = {
    "llama": (
        "*- x4",
        dict(
            hidden_size=256,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=32,
            intermediate_size=512,
            vocab_size=1000,
            rope_theta=500000.0,
            rms_norm_eps=1e-5,
        ),
    ),
    "qwen2": (
        "*- x3",
        dict(
            hidden_size=256,
            num_attention_heads=8,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=768,
            vocab_size=1024,
            rope_theta=1e6,
            rms_norm_eps=1e-6,
        ),
    ),
    "qwen3": (
        "*- x4",
        dict(
            hidden_size=256,
            num_attention_heads=8,
            num_key_value_heads=4,
            head_dim=64,
            intermediate_size=640,
            vocab_size=2048,
            rope_theta=1e6,
        ),
    ),
    # num_key_value_heads missing: MistralConfig's default 8.
    "mistral": (
        "*- x2",
        dict(
            hidden_size=256,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=16,
            intermediate_size=896,
            vocab_size=32768,
            rope_theta=10000.0,
        ),
    ),
    "nemotron_h": (
        "M-M*-ME",
        dict(
            hidden_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            intermediate_size=384,
            mamba_num_heads=8,
            mamba_head_dim=32,
            ssm_state_size=16,
            mamba_n_groups=2,
            conv_kernel=4,
            mamba_chunk_size=64,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=64,
            mlp_act="relu2",
        ),
    ),
    "jamba": (
        "(M- ME *- ME) x2",
        dict(
            hidden_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            mamba_num_heads=4,
            mamba_head_dim=64,
            mamba_n_groups=1,
            ssm_state_size=16,
            conv_kernel=4,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=256,
            rms_norm_eps=1e-6,
        ),
    ),
    "bamba": (
        "(M- M- *-) x2",
        dict(
            hidden_size=128,
            intermediate_size=320,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            mamba_num_heads=8,
            mamba_head_dim=32,
            mamba_n_groups=1,
            ssm_state_size=64,
            conv_kernel=4,
            mamba_chunk_size=256,
        ),
    ),
    # The published configs (SOURCES.md): DeepSeek-V3, Kimi-K2, DeepSeek-V2.5, Qwen3-235B-A22B, Qwen3-Next-80B-A3B.
    "deepseek_v3": (
        "L- x3 + LE x58",
        dict(
            hidden_size=7168,
            num_attention_heads=128,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_nope_head_dim=128,
            qk_rope_head_dim=64,
            v_head_dim=128,
            num_experts=256,
            num_experts_per_tok=8,
            moe_intermediate_size=2048,
            intermediate_size=18432,
            moe_scoring="sigmoid",
            moe_n_group=8,
            moe_topk_group=4,
            routed_scaling_factor=2.5,
            shared_expert_intermediate_size=2048,
            num_mtp_layers=1,
            vocab_size=129280,
        ),
    ),
    "kimi_k2": (
        "L- + LE x60",
        dict(
            hidden_size=7168,
            num_attention_heads=64,
            q_lora_rank=1536,
            kv_lora_rank=512,
            num_experts=384,
            num_experts_per_tok=8,
            moe_n_group=1,
            moe_topk_group=1,
            routed_scaling_factor=2.827,
            num_mtp_layers=0,
            vocab_size=163840,
        ),
    ),
    "deepseek_v2": (
        "L- + LE x59",
        dict(
            hidden_size=5120,
            num_experts=160,
            num_experts_per_tok=6,
            moe_scoring="softmax",
            norm_topk_prob=False,
            moe_n_group=8,
            moe_topk_group=3,
            shared_expert_intermediate_size=2 * 1536,
            routed_scaling_factor=16.0,
        ),
    ),
    "qwen3_moe": (
        "*E x94",
        dict(
            hidden_size=4096,
            num_attention_heads=64,
            num_key_value_heads=4,
            head_dim=128,
            num_experts=128,
            num_experts_per_tok=8,
            moe_intermediate_size=1536,
            qk_norm=True,
            norm_topk_prob=True,
            shared_expert_intermediate_size=0,
            rope_theta=1e6,
        ),
    ),
    "qwen3_next": (
        "(DE DE DE *E) x12",
        dict(
            hidden_size=2048,
            num_attention_heads=16,
            num_key_value_heads=2,
            head_dim=256,
            linear_num_key_heads=16,
            linear_num_value_heads=32,
            linear_key_head_dim=128,
            linear_value_head_dim=128,
            linear_conv_kernel_dim=4,
            num_experts=512,
            num_experts_per_tok=10,
            moe_intermediate_size=512,
            shared_expert_intermediate_size=512,
            shared_expert_gate=True,
            attn_output_gate=True,
            qk_norm=True,
            rope_theta=5e6,
        ),
    ),
    "qwen3_5_moe": (
        "(DE DE DE *E) x2",
        dict(
            hidden_size=256,
            num_experts=16,
            linear_num_value_heads=8,
            num_mtp_layers=1,
            rope_theta=1e7,
            attn_output_gate=True,
        ),
    ),
    "qwen3_5": ("(D- *-) x2", dict(hidden_size=256, intermediate_size=512, linear_num_key_heads=4, num_experts=0)),
    "falcon_h1": (
        "*M- x4",
        dict(
            hidden_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            mamba_num_heads=6,
            mamba_head_dim=32,
            ssm_state_size=16,
            mamba_n_groups=1,
            rope_theta=1e11,
        ),
    ),
}


def test_mlp_act_per_family():
    """Only Nemotron-H's MLP (and MoE experts) is squared-ReLU, not gated; every other fixture's MLP is gated SiLU."""
    acts = {family: load_spec(DATA / family / "config.json").mlp_act for family in EXPECTED}
    assert acts == {family: "relu2" if family == "nemotron_h" else "silu" for family in EXPECTED}, f"{acts=}"


def test_mlp_act_from_hidden_act(tmp_path):
    # NemotronHMLP is never gated: relu2 without mlp_hidden_act, too.
    assert load_spec(write(tmp_path, {"model_type": "nemotron_h"})).mlp_act == "relu2"
    for key in ("hidden_act", "mlp_hidden_act"):
        assert load_spec(write(tmp_path, {"model_type": "llama", key: "relu2"})).mlp_act == "relu2", f"{key=}"
    assert load_spec(write(tmp_path, {"model_type": "llama", "hidden_act": "gelu"})).mlp_act == "silu"


def test_attention_details_recorded(tmp_path):
    """Qwen2's q/k/v biases are not modelled but kept in extra; Qwen3's q/k norms are modelled (qk_norm)."""
    qwen2 = load_spec(DATA / "qwen2" / "config.json")
    assert qwen2.extra["qkv_bias"] is True and not qwen2.qk_norm
    qwen3 = load_spec(DATA / "qwen3" / "config.json")
    assert (qwen3.qk_norm, qwen3.extra["qkv_bias"]) == (True, False)
    assert load_spec(write(tmp_path, {"model_type": "qwen3", "attention_bias": True})).extra["qkv_bias"] is True
    assert "qkv_bias" not in load_spec(DATA / "llama" / "config.json").extra


def test_every_supported_family_has_a_fixture():
    assert set(EXPECTED) == set(SUPPORTED_MODEL_TYPES)


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_hf_config_file(family):
    layout, fields = EXPECTED[family]
    spec = load_spec(DATA / family / "config.json")
    assert spec.family == family
    assert format_layers(spec.layers) == layout, f"{format_layers(spec.layers)=}"
    got = {k: getattr(spec, k) for k in fields}
    assert got == fields
    assert spec.dtype is None, "HF torch_dtype is kept for the record only"
    assert spec.extra["model_type"] == family


@pytest.mark.parametrize("family", ["llama", "nemotron_h"])
def test_hf_folder(family):
    assert load_spec(DATA / family).layers == load_spec(DATA / family / "config.json").layers


def test_folder_without_config(tmp_path):
    with pytest.raises(ValueError, match="holds no config.json"):
        load_spec(tmp_path)


def write(tmp_path, cfg) -> Path:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def test_unsupported_model_type_lists_supported(tmp_path):
    with pytest.raises(ValueError) as e:
        load_spec(write(tmp_path, {"model_type": "gpt2", "n_layer": 2}))
    msg = str(e.value)
    assert "'gpt2'" in msg and all(t in msg for t in SUPPORTED_MODEL_TYPES)


def test_unsupported_architecture_lists_supported(tmp_path):
    with pytest.raises(ValueError) as e:
        load_spec(write(tmp_path, {"architectures": ["GPT2LMHeadModel"]}))
    assert "LlamaForCausalLM" in str(e.value) and "nemotron_h" in str(e.value)


def test_architecture_without_model_type(tmp_path):
    assert load_spec(write(tmp_path, {"architectures": ["Qwen2ForCausalLM"], "num_hidden_layers": 2})).family == "qwen2"


def test_family_defaults(tmp_path):
    """Missing fields take the family's transformers defaults."""
    s = load_spec(write(tmp_path, {"model_type": "qwen3"}))
    assert (s.num_layers, s.hidden_size, s.head_dim, s.num_key_value_heads, s.vocab_size) == (32, 4096, 128, 32, 151936)
    s = load_spec(write(tmp_path, {"model_type": "llama"}))
    assert (s.num_key_value_heads, s.head_dim, s.intermediate_size) == (32, 128, 11008)
    s = load_spec(write(tmp_path, {"model_type": "nemotron_h"}))
    assert format_layers(s.layers) == "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    assert s.num_experts == 0, "no MoE layer: MoE fields stay unset"
    s = load_spec(write(tmp_path, {"model_type": "jamba"}))
    assert (s.num_layers, s.mamba_num_heads, s.mamba_head_dim, s.ssm_state_size, s.num_experts) == (32, 128, 64, 16, 16)
    s = load_spec(write(tmp_path, {"model_type": "bamba", "num_hidden_layers": 3}))
    assert format_layers(s.layers) == "M- x3" and s.num_attention_heads == 0
    assert (s.mamba_num_heads, s.mamba_head_dim, s.ssm_state_size) == (128, 64, 256)
    s = load_spec(write(tmp_path, {"model_type": "falcon_h1", "num_hidden_layers": 2}))
    assert (s.mamba_num_heads, s.mamba_head_dim, s.head_dim) == (128, 8, 128)
    assert s.rope_theta == 100000.0, "FalconH1Config's rope_theta default"


def test_nemotron_layers_block_type(tmp_path):
    cfg = json.loads((DATA / "nemotron_h" / "config.json").read_text())
    del cfg["hybrid_override_pattern"]
    cfg["layers_block_type"] = ["mamba", "mlp", "linear_attention", "full_attention", "moe"]
    assert format_layers(load_spec(write(tmp_path, cfg)).layers) == "M-M*E"
    cfg["layers_block_type"] = ["mamba", "conv"]
    with pytest.raises(ValueError, match="unknown types \\['conv'\\]"):
        load_spec(write(tmp_path, cfg))


def test_bad_hf_values(tmp_path):
    with pytest.raises(ValueError, match="attn_layer_indices \\[9\\]"):
        load_spec(write(tmp_path, {"model_type": "bamba", "num_hidden_layers": 4, "attn_layer_indices": [9]}))
    with pytest.raises(ValueError, match="not valid JSON"):
        (tmp_path / "config.json").write_text("{")
        load_spec(tmp_path / "config.json")
    with pytest.raises(ValueError, match="num_key_value_heads"):
        load_spec(write(tmp_path, {"model_type": "llama", "num_attention_heads": 8, "num_key_value_heads": 3}))

"""HuggingFace config.json -> ModelSpec, for the dense Llama/Qwen2/Qwen3/Mistral and the hybrid NemotronH/Jamba/Bamba/
FalconH1 families here, the MLA and MoE families (DeepSeek, Kimi-K2, Qwen3-MoE, Qwen3-Next, Qwen3.5) in hf_moe.py.
Field names and defaults follow each family's transformers configuration_*.py; a missing field takes that family's
default."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ppprof.checks import is_int, short
from ppprof.specs.hf_fields import attention_fields as _attention_fields
from ppprof.specs.hf_fields import num_layers as _num_layers
from ppprof.specs.hf_fields import read_float as _float
from ppprof.specs.hf_fields import read_int as _int
from ppprof.specs.hf_moe import MOE_ARCHITECTURES, MOE_FAMILIES, MOE_RECORD_KEYS
from ppprof.specs.pattern import layer_kinds, parse_pattern
from ppprof.specs.spec import ATTENTION, DELTANET, MAMBA, MLA, MLP, MOE, RELU2, SILU, LayerSpec, ModelSpec

FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=None,
        head_dim=None,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
    ),
    "mistral": dict(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=None,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
    ),
    "qwen2": dict(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=22016,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        head_dim=None,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
    ),
    "qwen3": dict(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=22016,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
    ),
    "nemotron_h": dict(
        vocab_size=131072,
        hidden_size=4096,
        intermediate_size=21504,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=128,
        rope_theta=10000.0,
    ),
    "jamba": dict(
        vocab_size=65536,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
    ),
    "bamba": dict(
        vocab_size=128000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
    ),
    "falcon_h1": dict(
        vocab_size=128000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        rms_norm_eps=1e-5,
        rope_theta=100000.0,
    ),
}
"""Each family's defaults (transformers' configuration_*.py) for the fields a config may leave out."""

NEMOTRON_H_8B_PATTERN = "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
"""Nemotron-H-8B's hybrid_override_pattern, the default of NemotronHConfig before layers_block_type."""

JAMBA_MAMBA_HEAD_DIM = 64
"""Jamba's Mamba is Mamba1; ppprof runs it as a Mamba2 layer with d_inner = mamba_expand * hidden split into heads of
64, one group, the same d_state and conv kernel. The state per slot then matches Mamba1's (d_inner x d_state), the
projections differ slightly (Mamba2's B, C and dt come from in_proj instead of x_proj/dt_proj)."""

# Nemotron-H layers_block_type names, old and new, to pattern characters.
NEMOTRON_BLOCK_TYPES = {
    "mamba": "M",
    "linear_attention": "M",
    "attention": "*",
    "full_attention": "*",
    "mlp": "-",
    "moe": "E",
}

# Fields kept in ModelSpec.extra for the record when present.
RECORD_KEYS = (
    "model_type",
    "architectures",
    "torch_dtype",
    "dtype",
    "max_position_embeddings",
    "tie_word_embeddings",
    "hidden_act",
    "mlp_hidden_act",
    "attention_bias",
    "sliding_window",
    "n_shared_experts",
    "moe_shared_expert_intermediate_size",
    "mamba_expand",
    "expand",
)


def _mlp_act(cfg: dict, family: str) -> str:
    """ModelSpec.mlp_act of a HF config. NemotronHMLP is never gated (down(act(up x))): relu2 whatever its
    mlp_hidden_act (default relu2; another activation costs the same two matrices and is kept in extra). Other
    families have gated MLPs unless their hidden_act or mlp_hidden_act is relu2."""
    if family == "nemotron_h":
        return RELU2
    return RELU2 if RELU2 in (cfg.get("hidden_act"), cfg.get("mlp_hidden_act")) else SILU


def _dense(cfg: dict, family: str) -> tuple[tuple[LayerSpec, ...], dict]:
    d = FAMILY_DEFAULTS[family]
    n = _num_layers(cfg, d["num_hidden_layers"])
    return (LayerSpec(mixers=(ATTENTION,), ffn=MLP),) * n, _attention_fields(cfg, d)


def _nemotron_h(cfg: dict, family: str) -> tuple[tuple[LayerSpec, ...], dict]:
    fields = _attention_fields(cfg, FAMILY_DEFAULTS[family])
    fields["rms_norm_eps"] = _float(cfg, "layer_norm_epsilon", "rms_norm_eps", default=1e-5)
    blocks = cfg.get("layers_block_type") or cfg.get("layer_types")
    if cfg.get("hybrid_override_pattern"):
        if not isinstance(cfg["hybrid_override_pattern"], str):
            raise ValueError(
                f"hybrid_override_pattern={short(cfg['hybrid_override_pattern'])} must be a string of "
                'layer characters, e.g. "M-M*-"; fix the config'
            )
        layers = parse_pattern(cfg["hybrid_override_pattern"])
    elif blocks:
        if not isinstance(blocks, list) or not all(isinstance(b, str) for b in blocks):
            raise ValueError(f"layers_block_type={short(blocks)} must be a list of block names; fix the config")
        unknown = sorted(set(blocks) - set(NEMOTRON_BLOCK_TYPES))
        if unknown:
            raise ValueError(f"layers_block_type has unknown types {unknown}: use {', '.join(NEMOTRON_BLOCK_TYPES)}")
        layers = parse_pattern("".join(NEMOTRON_BLOCK_TYPES[b] for b in blocks))
    else:
        layers = parse_pattern(NEMOTRON_H_8B_PATTERN)
    fields.update(
        mamba_num_heads=_int(cfg, "mamba_num_heads", default=128),
        mamba_head_dim=_int(cfg, "mamba_head_dim", default=64),
        ssm_state_size=_int(cfg, "ssm_state_size", "mamba_d_state", default=128),
        mamba_n_groups=_int(cfg, "n_groups", "mamba_n_groups", default=8),
        conv_kernel=_int(cfg, "conv_kernel", "mamba_d_conv", default=4),
        mamba_chunk_size=_int(cfg, "chunk_size", "mamba_chunk_size", default=128),
        num_experts=_int(cfg, "n_routed_experts", "num_local_experts", default=8),
        num_experts_per_tok=_int(cfg, "num_experts_per_tok", default=2),
        moe_intermediate_size=_int(cfg, "moe_intermediate_size", default=7688),
    )
    return layers, fields


def _jamba(cfg: dict, family: str) -> tuple[tuple[LayerSpec, ...], dict]:
    fields = _attention_fields(cfg, FAMILY_DEFAULTS[family])
    n = _num_layers(cfg, FAMILY_DEFAULTS[family]["num_hidden_layers"])
    attn_period, attn_offset = _int(cfg, "attn_layer_period", default=8), _int(cfg, "attn_layer_offset", default=4)
    moe_period, moe_offset = _int(cfg, "expert_layer_period", default=2), _int(cfg, "expert_layer_offset", default=1)
    num_experts = _int(cfg, "num_experts", default=16)
    for what, period, offset in (("attn", attn_period, attn_offset), ("expert", moe_period, moe_offset)):
        if not 0 <= offset < period:
            raise ValueError(
                f"{what}_layer_offset ({offset}) must be in 0..{what}_layer_period-1 ({period - 1}); fix the config"
            )
    layers = tuple(
        LayerSpec(
            mixers=(ATTENTION,) if i % attn_period == attn_offset else (MAMBA,),
            ffn=MOE if num_experts > 1 and i % moe_period == moe_offset else MLP,
        )
        for i in range(n)
    )
    d_inner = _int(cfg, "mamba_expand", default=2) * fields["hidden_size"]
    if d_inner % JAMBA_MAMBA_HEAD_DIM:
        raise ValueError(
            f"Jamba d_inner = mamba_expand * hidden_size = {d_inner} is not a multiple of "
            f"{JAMBA_MAMBA_HEAD_DIM}, the Mamba2 head dim ppprof uses for Jamba: use a hidden_size "
            "that makes it one"
        )
    fields.update(
        mamba_num_heads=d_inner // JAMBA_MAMBA_HEAD_DIM,
        mamba_head_dim=JAMBA_MAMBA_HEAD_DIM,
        ssm_state_size=_int(cfg, "mamba_d_state", default=16),
        mamba_n_groups=1,
        conv_kernel=_int(cfg, "mamba_d_conv", default=4),
        num_experts=num_experts,
        num_experts_per_tok=_int(cfg, "num_experts_per_tok", default=2),
        # Jamba's experts are full-size MLPs.
        moe_intermediate_size=fields["intermediate_size"],
    )
    return layers, fields


def _mamba2_fields(cfg: dict, hidden: int, d_inner: int) -> dict[str, Any]:
    """Bamba / FalconH1 Mamba2 fields; mamba_d_head "auto" (or missing) means d_inner / mamba_n_heads."""
    heads = _int(cfg, "mamba_n_heads", default=128)
    head_dim = "auto" if cfg.get("mamba_d_head") in (None, "auto") else _int(cfg, "mamba_d_head", default=None)
    if head_dim == "auto":
        if heads <= 0 or d_inner % heads:
            raise ValueError(
                f"mamba_n_heads ({heads}) does not divide the mamba inner size ({d_inner}): "
                "give mamba_d_head or a divisor"
            )
        head_dim = d_inner // heads
    return dict(
        mamba_num_heads=heads,
        mamba_head_dim=head_dim,
        ssm_state_size=_int(cfg, "mamba_d_state", default=256),
        mamba_n_groups=_int(cfg, "mamba_n_groups", default=1),
        conv_kernel=_int(cfg, "mamba_d_conv", default=4),
        mamba_chunk_size=_int(cfg, "mamba_chunk_size", default=256),
    )


def _bamba(cfg: dict, family: str) -> tuple[tuple[LayerSpec, ...], dict]:
    fields = _attention_fields(cfg, FAMILY_DEFAULTS[family])
    n = _num_layers(cfg, FAMILY_DEFAULTS[family]["num_hidden_layers"])
    attn = cfg.get("attn_layer_indices") or []
    if not isinstance(attn, list) or not all(is_int(i) for i in attn):
        raise ValueError(f"attn_layer_indices={short(attn)} must be a list of integer layer indices; fix the config")
    attn = set(attn)
    bad = sorted(i for i in attn if not 0 <= i < n)
    if bad:
        raise ValueError(f"attn_layer_indices {bad} are outside 0..{n - 1}: fix the config")
    layers = tuple(LayerSpec(mixers=(ATTENTION,) if i in attn else (MAMBA,), ffn=MLP) for i in range(n))
    hidden = fields["hidden_size"]
    fields.update(_mamba2_fields(cfg, hidden, _int(cfg, "mamba_expand", default=2) * hidden))
    return layers, fields


def _falcon_h1(cfg: dict, family: str) -> tuple[tuple[LayerSpec, ...], dict]:
    fields = _attention_fields(cfg, FAMILY_DEFAULTS[family])
    n = _num_layers(cfg, FAMILY_DEFAULTS[family]["num_hidden_layers"])
    hidden = fields["hidden_size"]
    # mamba_d_ssm is the Mamba inner size; None means mamba_expand * hidden (FalconH1Config).
    if "mamba_d_ssm" in cfg and cfg["mamba_d_ssm"] is None:
        d_inner = _int(cfg, "mamba_expand", default=2) * hidden
    else:
        d_inner = _int(cfg, "mamba_d_ssm", default=1024)
    fields.update(_mamba2_fields(cfg, hidden, d_inner))
    return (LayerSpec(mixers=(ATTENTION, MAMBA), ffn=MLP),) * n, fields


FAMILIES: dict[str, Callable[[dict, str], tuple[tuple[LayerSpec, ...], dict]]] = {
    "llama": _dense,
    "qwen2": _dense,
    "qwen3": _dense,
    "mistral": _dense,
    "nemotron_h": _nemotron_h,
    "jamba": _jamba,
    "bamba": _bamba,
    "falcon_h1": _falcon_h1,
    **MOE_FAMILIES,
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
    "NemotronHForCausalLM": "nemotron_h",
    "JambaForCausalLM": "jamba",
    "BambaForCausalLM": "bamba",
    "FalconH1ForCausalLM": "falcon_h1",
    **MOE_ARCHITECTURES,
}


def hf_family(cfg: dict) -> str:
    """The family of a HF config: its model_type, else its first known architecture."""
    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ValueError(f'model_type={short(model_type)} must be a string, e.g. "llama"; fix the config')
    if model_type:
        if model_type not in FAMILIES:
            raise ValueError(
                f"model_type {model_type!r} is not supported: use a config with model_type one of "
                f"{', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        return model_type
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise ValueError(
            f'architectures={short(archs)} must be a list of class names, e.g. ["LlamaForCausalLM"]; fix the config'
        )
    for arch in archs:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    raise ValueError(
        f"architectures {archs} without a model_type are not supported: use one of "
        f"{', '.join(ARCHITECTURES)} (model_type {', '.join(SUPPORTED_MODEL_TYPES)})"
    )


def spec_from_hf_config(cfg: dict, *, name: str) -> ModelSpec:
    """A ModelSpec from a parsed HF config.json; fields of layer kinds the model lacks keep ModelSpec's defaults."""
    if not isinstance(cfg, dict):
        raise ValueError(f"{name}: a HF config.json must hold a JSON object, got {type(cfg).__name__}")
    try:
        family = hf_family(cfg)
        layers, fields = FAMILIES[family](cfg, family)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    kinds = set().union(*(layer_kinds(layer) for layer in layers))
    unused = {
        ATTENTION: ("num_key_value_heads", "head_dim", "qk_norm", "attn_output_gate"),
        MLA: ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
        MAMBA: (
            "mamba_num_heads",
            "mamba_head_dim",
            "ssm_state_size",
            "conv_kernel",
            "mamba_n_groups",
            "mamba_chunk_size",
        ),
        DELTANET: (
            "linear_num_key_heads",
            "linear_num_value_heads",
            "linear_key_head_dim",
            "linear_value_head_dim",
            "linear_conv_kernel_dim",
        ),
        MOE: (
            "num_experts",
            "num_experts_per_tok",
            "moe_intermediate_size",
            "moe_scoring",
            "norm_topk_prob",
            "routed_scaling_factor",
            "moe_n_group",
            "moe_topk_group",
            "shared_expert_intermediate_size",
            "shared_expert_gate",
        ),
    }
    if not kinds & {ATTENTION, MLA}:
        for key in ("num_attention_heads", "rope_theta"):
            fields.pop(key, None)
    for kind, keys in unused.items():
        if kind not in kinds:
            for key in keys:
                fields.pop(key, None)
    fields["mlp_act"] = _mlp_act(cfg, family)
    extra = {k: cfg[k] for k in RECORD_KEYS + MOE_RECORD_KEYS if k in cfg}
    # Attention details ppprof does not model (small next to the projections), kept for the record: Qwen2Attention
    # always has q/k/v biases; Qwen3Attention always RMS-normalises q and k per head, biases only with attention_bias.
    if family == "qwen2":
        extra["qkv_bias"] = True
    elif family == "qwen3":
        fields["qk_norm"] = True
        extra["qkv_bias"] = bool(cfg.get("attention_bias", False))
    if family == "jamba":
        extra["mamba_approximation"] = (
            f"Mamba1 run as Mamba2: heads = mamba_expand*hidden/{JAMBA_MAMBA_HEAD_DIM}, "
            f"head_dim {JAMBA_MAMBA_HEAD_DIM}, n_groups 1"
        )
    return ModelSpec(name=name, family=family, layers=layers, extra=extra, **fields)

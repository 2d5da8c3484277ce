"""HuggingFace config.json -> ModelSpec: which family a config is, the dense Llama/Qwen2/Qwen3/Mistral families
here, the hybrid NemotronH/Jamba/Bamba/FalconH1 families in hf_hybrid.py, the MLA and MoE families (DeepSeek, Kimi-K2,
Qwen3-MoE, Qwen3-Next, Qwen3.5) in hf_moe.py; then the fields of layer kinds the model lacks dropped and the details
ppprof does not model kept for the record. Field names and defaults follow each family's transformers
configuration_*.py; a missing field takes that family's default."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ppprof.checks import short
from ppprof.specs.hf_fields import attention_fields as _attention_fields
from ppprof.specs.hf_fields import num_layers as _num_layers
from ppprof.specs.hf_hybrid import HYBRID_ARCHITECTURES, HYBRID_FAMILIES, JAMBA_MAMBA_HEAD_DIM
from ppprof.specs.hf_moe import MOE_ARCHITECTURES, MOE_FAMILIES, MOE_RECORD_KEYS
from ppprof.specs.layer import ATTENTION, DELTANET, MAMBA, MLA, MLP, MOE, RELU2, SILU, LayerSpec
from ppprof.specs.pattern import layer_kinds
from ppprof.specs.spec import ModelSpec

DENSE_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
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
}
"""Each family's defaults (transformers' configuration_*.py) for the fields a config may leave out."""

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
    d = DENSE_FAMILY_DEFAULTS[family]
    n = _num_layers(cfg, d["num_hidden_layers"])
    return (LayerSpec(mixers=(ATTENTION,), ffn=MLP),) * n, _attention_fields(cfg, d)


FAMILIES: dict[str, Callable[[dict, str], tuple[tuple[LayerSpec, ...], dict]]] = {
    "llama": _dense,
    "qwen2": _dense,
    "qwen3": _dense,
    "mistral": _dense,
    **HYBRID_FAMILIES,
    **MOE_FAMILIES,
}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MistralForCausalLM": "mistral",
    **HYBRID_ARCHITECTURES,
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


KIND_FIELDS = {
    ATTENTION: ("num_key_value_heads", "head_dim", "qk_norm", "attn_output_gate"),
    MLA: ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"),
    MAMBA: ("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "conv_kernel", "mamba_n_groups", "mamba_chunk_size"),
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
"""The fields only a layer kind uses: a model without that kind keeps ModelSpec's defaults for them."""
ATTENTION_KIND_FIELDS = ("num_attention_heads", "rope_theta")
"""Fields attention and MLA share: a model with neither keeps ModelSpec's defaults for them."""


def spec_from_hf_config(cfg: dict, *, name: str) -> ModelSpec:
    """A ModelSpec from a parsed HF config.json; fields of layer kinds the model lacks keep ModelSpec's defaults."""
    if not isinstance(cfg, dict):
        raise ValueError(f"{name}: a HF config.json must hold a JSON object, got {type(cfg).__name__}")
    try:
        family = hf_family(cfg)
        layers, fields = FAMILIES[family](cfg, family)
    except ValueError as e:
        raise ValueError(f"{name}: {e}") from None
    drop_unused_fields(fields, layers)
    fields["mlp_act"] = _mlp_act(cfg, family)
    if family == "qwen3":  # Qwen3Attention always RMS-normalises q and k per head
        fields["qk_norm"] = True
    return ModelSpec(name=name, family=family, layers=layers, extra=record_fields(cfg, family), **fields)


def drop_unused_fields(fields: dict, layers: tuple[LayerSpec, ...]) -> None:
    """Remove from `fields` those of the layer kinds no layer has (KIND_FIELDS, ATTENTION_KIND_FIELDS)."""
    kinds = set().union(*(layer_kinds(layer) for layer in layers))
    if not kinds & {ATTENTION, MLA}:
        for key in ATTENTION_KIND_FIELDS:
            fields.pop(key, None)
    for kind, keys in KIND_FIELDS.items():
        if kind not in kinds:
            for key in keys:
                fields.pop(key, None)


def record_fields(cfg: dict, family: str) -> dict:
    """ModelSpec.extra: the config's RECORD_KEYS and MOE_RECORD_KEYS, and what ppprof runs differently."""
    extra = {k: cfg[k] for k in RECORD_KEYS + MOE_RECORD_KEYS if k in cfg}
    # Attention details ppprof does not model (small next to the projections), kept for the record: Qwen2Attention
    # always has q/k/v biases; Qwen3Attention has them only with attention_bias (its q/k norm is modelled).
    if family == "qwen2":
        extra["qkv_bias"] = True
    elif family == "qwen3":
        extra["qkv_bias"] = bool(cfg.get("attention_bias", False))
    if family == "jamba":
        extra["mamba_approximation"] = (
            f"Mamba1 run as Mamba2: heads = mamba_expand*hidden/{JAMBA_MAMBA_HEAD_DIM}, "
            f"head_dim {JAMBA_MAMBA_HEAD_DIM}, n_groups 1"
        )
    return extra

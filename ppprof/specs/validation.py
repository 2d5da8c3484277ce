"""The checks a ModelSpec passes at construction: every field of its type, then the fields each layer kind it has
uses positive and consistent (heads a multiple of their groups, experts split evenly, one KV and one Mamba-pool layout
a model). Each error names the model and the field, and says what to change. `spec` is a ppprof.specs.spec.ModelSpec
(not imported: it calls these checks from its __post_init__)."""

from __future__ import annotations

import math
from dataclasses import fields

from ppprof.checks import a_type, is_int, is_number, short
from ppprof.specs.layer import MAX_LAYERS, MLP, MLP_ACTS, MOE, MOE_SCORINGS, LayerSpec

FLOAT_FIELDS = ("rms_norm_eps", "rope_theta", "routed_scaling_factor")
TEXT_FIELDS = ("name", "family", "mlp_act", "moe_scoring")
BOOL_FIELDS = ("qk_norm", "attn_output_gate", "norm_topk_prob", "shared_expert_gate")


def check_spec(spec) -> None:
    """All of a ModelSpec's checks, in order: types, layers, the model-wide sizes, then each layer kind's fields."""
    check_types(spec)
    if not spec.layers:
        raise ValueError(f"model {spec.name!r} has no layers: give at least one layer")
    _positive(spec, "hidden_size", "vocab_size")
    if spec.mlp_act not in MLP_ACTS:
        raise ValueError(f"model {spec.name!r}: mlp_act={spec.mlp_act!r} is unknown: use one of {', '.join(MLP_ACTS)}")
    if any(layer.ffn == MLP for layer in spec.layers):
        _positive(spec, "intermediate_size")
    if any(layer.has_attention for layer in spec.layers):
        _check_attention(spec)
    if any(layer.has_mamba for layer in spec.layers):
        _check_mamba(spec)
    if any(layer.has_mla for layer in spec.layers):
        _check_mla(spec)
    if any(layer.has_deltanet for layer in spec.layers):
        _check_deltanet(spec)
    if any(layer.ffn == MOE for layer in spec.layers):
        _check_moe(spec)


def _check_attention(spec) -> None:
    _positive(spec, "num_attention_heads", "num_key_value_heads", "head_dim")
    if spec.num_attention_heads % spec.num_key_value_heads:
        raise ValueError(
            f"num_attention_heads ({spec.num_attention_heads}) is not a multiple of num_key_value_heads "
            f"({spec.num_key_value_heads}): use a divisor of num_attention_heads"
        )


def _check_mamba(spec) -> None:
    _positive(
        spec, "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "conv_kernel", "mamba_n_groups", "mamba_chunk_size"
    )
    if spec.mamba_num_heads % spec.mamba_n_groups:
        raise ValueError(
            f"mamba_num_heads ({spec.mamba_num_heads}) is not a multiple of mamba_n_groups "
            f"({spec.mamba_n_groups}): use a divisor of mamba_num_heads"
        )


def _check_mla(spec) -> None:
    _positive(spec, "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    if spec.qk_rope_head_dim % 2:
        raise ValueError(
            f"model {spec.name!r}: qk_rope_head_dim={spec.qk_rope_head_dim} must be even "
            "(RoPE rotates pairs); fix the config"
        )
    if any(layer.has_attention for layer in spec.layers):
        raise ValueError(
            f"model {spec.name!r} mixes MLA and attention layers: ppprof keeps one KV pool layout a model; use one kind"
        )


def _check_deltanet(spec) -> None:
    _positive(
        spec,
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
        "deltanet_chunk_size",
    )
    if spec.linear_num_value_heads % spec.linear_num_key_heads:
        raise ValueError(
            f"model {spec.name!r}: linear_num_value_heads ({spec.linear_num_value_heads}) is not a multiple "
            f"of linear_num_key_heads ({spec.linear_num_key_heads}): use a divisor of linear_num_value_heads"
        )
    if any(layer.has_mamba for layer in spec.layers):
        raise ValueError(
            f"model {spec.name!r} mixes Mamba2 and Gated DeltaNet layers: ppprof keeps one "
            "Mamba-pool layout a model; use one kind"
        )


def _check_moe(spec) -> None:
    _positive(spec, "num_experts", "num_experts_per_tok", "moe_intermediate_size", "moe_n_group", "moe_topk_group")
    if spec.num_experts_per_tok > spec.num_experts:
        raise ValueError(
            f"num_experts_per_tok ({spec.num_experts_per_tok}) exceeds num_experts ({spec.num_experts}): "
            "lower num_experts_per_tok"
        )
    _check_groups(spec)
    if spec.moe_scoring not in MOE_SCORINGS:
        raise ValueError(
            f"model {spec.name!r}: moe_scoring={spec.moe_scoring!r} is unknown: use one of {', '.join(MOE_SCORINGS)}"
        )


def _check_groups(spec) -> None:
    """Grouped routing: the groups split the experts evenly, a token's groups hold its top-k."""
    experts, groups, top_groups = spec.num_experts, spec.moe_n_group, spec.moe_topk_group
    if experts % groups:
        raise ValueError(
            f"model {spec.name!r}: moe_n_group ({groups}) does not divide num_experts ({experts}): use "
            "a divisor (1: no groups)"
        )
    if top_groups > groups:
        raise ValueError(
            f"model {spec.name!r}: moe_topk_group ({top_groups}) exceeds moe_n_group ({groups}): lower moe_topk_group"
        )
    if spec.num_experts_per_tok > top_groups * (experts // groups):
        raise ValueError(
            f"model {spec.name!r}: num_experts_per_tok ({spec.num_experts_per_tok}) exceeds the "
            f"experts of moe_topk_group ({top_groups}) groups of {experts // groups}: raise "
            "moe_topk_group"
        )


def _positive(spec, *names: str) -> None:
    for name in names:
        value = getattr(spec, name)
        if not is_int(value) or value <= 0:
            raise ValueError(f"model {spec.name!r}: {name}={value!r} must be a positive integer; set it in the config")


def check_types(spec) -> None:
    """Every field of its type: integer fields integers >= 0 (a float, 4096.0 too, a string, a bool or a list is
    refused; those a layer kind uses must be positive, checked after), float fields finite positive numbers, names
    strings, at most MAX_LAYERS layers."""
    for name in TEXT_FIELDS:
        value = getattr(spec, name)
        if not isinstance(value, str) or not value:
            raise ValueError(f"model {short(spec.name)}: {name}={short(value)} must be a non-empty string")
    for name in BOOL_FIELDS:
        value = getattr(spec, name)
        if not isinstance(value, bool):
            raise ValueError(f"model {spec.name!r}: {name}={short(value)} must be true or false; fix the config")
    for f in fields(spec):
        value = getattr(spec, f.name)
        if f.type == "int" and (not is_int(value) or value < 0):
            raise ValueError(
                f"model {spec.name!r}: {f.name}={short(value)} must be an integer >= 0"
                + ("" if is_int(value) else f", not {a_type(value)}")
                + "; fix the config"
            )
    for name in FLOAT_FIELDS:
        value = getattr(spec, name)
        if not is_number(value) or not math.isfinite(value) or value <= 0:
            raise ValueError(
                f"model {spec.name!r}: {name}={short(value)} must be a finite positive number; fix the config"
            )
    if not isinstance(spec.layers, tuple) or not all(isinstance(layer, LayerSpec) for layer in spec.layers):
        raise ValueError(f"model {spec.name!r}: layers must be layer specs (give `pattern` or `layers`)")
    if len(spec.layers) > MAX_LAYERS:
        raise ValueError(f"model {spec.name!r} has {len(spec.layers)} layers: use at most {MAX_LAYERS}")
    if not isinstance(spec.extra, dict):
        raise ValueError(f"model {spec.name!r}: extra={short(spec.extra)} must be a mapping")

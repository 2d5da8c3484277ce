"""HuggingFace config.json -> layers and fields, for the hybrid families (Mamba2, or Jamba's Mamba1 run as Mamba2,
beside attention): NemotronH, Jamba, Bamba and FalconH1. Field names and defaults follow each family's transformers
configuration_*.py; a missing field takes that family's default."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ppprof.checks import is_int, short
from ppprof.specs.hf_fields import attention_fields as _attention_fields
from ppprof.specs.hf_fields import num_layers as _num_layers
from ppprof.specs.hf_fields import read_float as _float
from ppprof.specs.hf_fields import read_int as _int
from ppprof.specs.layer import ATTENTION, MAMBA, MLP, MOE, LayerSpec
from ppprof.specs.pattern import parse_pattern

HYBRID_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
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


def _nemotron_h(cfg: dict, family: str) -> tuple[tuple[LayerSpec, ...], dict]:
    fields = _attention_fields(cfg, HYBRID_FAMILY_DEFAULTS[family])
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
    fields = _attention_fields(cfg, HYBRID_FAMILY_DEFAULTS[family])
    n = _num_layers(cfg, HYBRID_FAMILY_DEFAULTS[family]["num_hidden_layers"])
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
    fields = _attention_fields(cfg, HYBRID_FAMILY_DEFAULTS[family])
    n = _num_layers(cfg, HYBRID_FAMILY_DEFAULTS[family]["num_hidden_layers"])
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
    fields = _attention_fields(cfg, HYBRID_FAMILY_DEFAULTS[family])
    n = _num_layers(cfg, HYBRID_FAMILY_DEFAULTS[family]["num_hidden_layers"])
    hidden = fields["hidden_size"]
    # mamba_d_ssm is the Mamba inner size; None means mamba_expand * hidden (FalconH1Config).
    if "mamba_d_ssm" in cfg and cfg["mamba_d_ssm"] is None:
        d_inner = _int(cfg, "mamba_expand", default=2) * hidden
    else:
        d_inner = _int(cfg, "mamba_d_ssm", default=1024)
    fields.update(_mamba2_fields(cfg, hidden, d_inner))
    return (LayerSpec(mixers=(ATTENTION, MAMBA), ffn=MLP),) * n, fields


HYBRID_FAMILIES: dict[str, Callable[[dict, str], tuple[tuple[LayerSpec, ...], dict]]] = {
    "nemotron_h": _nemotron_h,
    "jamba": _jamba,
    "bamba": _bamba,
    "falcon_h1": _falcon_h1,
}
HYBRID_ARCHITECTURES = {
    "NemotronHForCausalLM": "nemotron_h",
    "JambaForCausalLM": "jamba",
    "BambaForCausalLM": "bamba",
    "FalconH1ForCausalLM": "falcon_h1",
}

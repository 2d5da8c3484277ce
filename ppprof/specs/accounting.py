"""Per-stage accounting of a ModelSpec: parameters, KV-cache bytes per token, Mamba-state bytes per slot. Pure: no torch.

Parameter counts (no biases except the Mamba conv's; what ppprof's synthetic model builds):
- embedding vocab*hidden on the first stage; lm_head vocab*hidden and the final norm (hidden) on the last stage
  (counted untied: under PP each end holds its own copy);
- attention: q and o heads*head_dim*hidden each, k and v kv_heads*head_dim*hidden each;
- mamba (Mamba2): in_proj hidden*(2*d_inner + 2*groups*d_state + heads), conv1d conv_dim*kernel + conv_dim bias,
  dt_bias, A_log and D (heads each), gated norm d_inner, out_proj d_inner*hidden;
- mlp: 3*hidden*intermediate when gated (mlp_act silu), 2*hidden*intermediate for relu2 (up, down);
  moe: router hidden*experts + experts*(3 or 2)*hidden*moe_intermediate, the experts gated as the MLP;
- norm: one RMSNorm (hidden) before the mixers and one before the FFN of each layer that has them.
Bytes: every parameter in the pipeline dtype except Mamba's A_log, dt_bias and D, which stay fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ppprof.specs.spec import LayerSpec, ModelSpec, MLP, MOE, layers_pattern
from ppprof.specs.partition import split_layers
from ppprof.specs.dtypes import AUTO_DTYPE_GPU, SSM_STATE_BYTES, dtype_bytes, normalize_dtype
from ppprof.specs.pattern import format_layers

PARAM_KEYS = ("embedding", "attention", "mamba", "mlp", "moe", "norm", "lm_head")
MAMBA_FP32_PARAMS_PER_HEAD = 3
"""A_log, dt_bias and D: one value a head each, kept fp32 whatever the dtype (ppprof.model.mamba.Mamba2)."""
FP32_BYTES = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class StageAccount:
    """What one pipeline stage holds."""

    stage_idx: int
    layers: range
    pattern: str
    """The stage's layers in the layer notation, uncompressed (ModelSpec.pattern)."""
    layout: str
    """The same, compressed where a block repeats (ppprof.specs.pattern.format_layers)."""
    num_params: dict
    """Parameter counts by part (PARAM_KEYS) and their "total"."""
    kv_bytes_per_token: int
    mamba_bytes_per_slot: int

    def to_dict(self) -> dict:
        return {
            "stage_idx": self.stage_idx,
            "layer_start": self.layers.start,
            "layer_stop": self.layers.stop,
            "pattern": self.pattern,
            "layout": self.layout,
            "num_params": dict(self.num_params),
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "mamba_bytes_per_slot": self.mamba_bytes_per_slot,
        }


def accounting_dtype(spec: ModelSpec, dtype: str | None = None) -> str:
    """The dtype the byte counts use: `dtype`, else the spec's, else bfloat16 (the GPU run-time default)."""
    return normalize_dtype(dtype) or spec.dtype or AUTO_DTYPE_GPU


def layer_params(spec: ModelSpec, layer: LayerSpec) -> dict[str, int]:
    """Parameters of one layer by part: attention, mamba, mlp, moe, norm."""
    h = spec.hidden_size
    out = dict.fromkeys(("attention", "mamba", "mlp", "moe", "norm"), 0)
    if layer.has_attention:
        q_dim, kv_dim = spec.num_attention_heads * spec.head_dim, spec.num_key_value_heads * spec.head_dim
        out["attention"] = 2 * h * q_dim + 2 * h * kv_dim
    if layer.has_mamba:
        d_inner, heads, conv_dim = spec.mamba_d_inner, spec.mamba_num_heads, spec.mamba_conv_dim
        in_proj = h * (2 * d_inner + 2 * spec.mamba_n_groups * spec.ssm_state_size + heads)
        conv = conv_dim * spec.conv_kernel + conv_dim
        out["mamba"] = in_proj + conv + 3 * heads + d_inner + d_inner * h
    num_matrices = 3 if spec.mlp_gated else 2
    if layer.ffn == MLP:
        out["mlp"] = num_matrices * h * spec.intermediate_size
    elif layer.ffn == MOE:
        out["moe"] = h * spec.num_experts + spec.num_experts * num_matrices * h * spec.moe_intermediate_size
    out["norm"] = h * (bool(layer.mixers) + bool(layer.ffn))
    return out


def stage_params(spec: ModelSpec, layers: range) -> dict[str, int]:
    """Parameters of the stage holding `layers`, by part (PARAM_KEYS) plus "total". The first stage (layers from 0)
    holds the embedding; the last (layers up to num_layers) the final norm and lm_head."""
    out = dict.fromkeys(PARAM_KEYS, 0)
    for i in layers:
        for key, n in layer_params(spec, spec.layers[i]).items():
            out[key] += n
    if layers.start == 0:
        out["embedding"] = spec.vocab_size * spec.hidden_size
    if layers.stop == spec.num_layers:
        out["lm_head"] = spec.vocab_size * spec.hidden_size
        out["norm"] += spec.hidden_size
    out["total"] = sum(out[k] for k in PARAM_KEYS)
    return out


def stage_weight_bytes(spec: ModelSpec, layers: range, *, dtype: str | None = None) -> int:
    """Bytes of the stage's parameters (stage_params): the pipeline dtype, except Mamba's fp32 A_log, dt_bias, D."""
    fp32 = MAMBA_FP32_PARAMS_PER_HEAD * spec.mamba_num_heads * sum(spec.layers[i].has_mamba for i in layers)
    rest = stage_params(spec, layers)["total"] - fp32
    return rest * dtype_bytes(accounting_dtype(spec, dtype)) + fp32 * FP32_BYTES


def kv_bytes_per_token(spec: ModelSpec, layers: range | None = None, *, dtype: str | None = None) -> int:
    """KV-cache bytes one token takes on `layers` (default all): 2 * kv_heads * head_dim * dtype bytes per
    attention layer."""
    layers = range(spec.num_layers) if layers is None else layers
    num_attention = sum(spec.layers[i].has_attention for i in layers)
    return 2 * spec.num_key_value_heads * spec.head_dim * dtype_bytes(accounting_dtype(spec, dtype)) * num_attention


def mamba_bytes_per_slot(spec: ModelSpec, layers: range | None = None, *, dtype: str | None = None) -> int:
    """Mamba-state bytes one request slot takes on `layers` (default all), per Mamba layer: the conv state
    conv_dim * (kernel - 1) in the dtype, plus the SSM state heads * head_dim * d_state in fp32."""
    layers = range(spec.num_layers) if layers is None else layers
    num_mamba = sum(spec.layers[i].has_mamba for i in layers)
    if not num_mamba:
        return 0
    conv = spec.mamba_conv_dim * (spec.conv_kernel - 1) * dtype_bytes(accounting_dtype(spec, dtype))
    ssm = spec.mamba_num_heads * spec.mamba_head_dim * spec.ssm_state_size * SSM_STATE_BYTES
    return num_mamba * (conv + ssm)


def stage_accounts(spec: ModelSpec, num_stages: int = 1, partition: Sequence[int] | None = None, *,
                   dtype: str | None = None) -> list[StageAccount]:
    """One StageAccount per pipeline stage, the layers split by ppprof.specs.partition.split_layers."""
    out = []
    for stage_idx, layers in enumerate(split_layers(spec.num_layers, num_stages, partition)):
        out.append(StageAccount(
            stage_idx=stage_idx,
            layers=layers,
            pattern=layers_pattern([spec.layers[i] for i in layers]),
            layout=format_layers([spec.layers[i] for i in layers]),
            num_params=stage_params(spec, layers),
            kv_bytes_per_token=kv_bytes_per_token(spec, layers, dtype=dtype),
            mamba_bytes_per_slot=mamba_bytes_per_slot(spec, layers, dtype=dtype),
        ))
    return out


def describe(spec: ModelSpec, num_stages: int = 1, partition: list[int] | None = None,
             dtype: str | None = None) -> dict:
    """spec.to_dict() plus the byte dtype and one entry per stage (StageAccount.to_dict())."""
    stages = stage_accounts(spec, num_stages, partition, dtype=dtype)
    return {
        **spec.to_dict(),
        "num_layers": spec.num_layers,
        "layout": format_layers(spec.layers),
        "accounting_dtype": accounting_dtype(spec, dtype),
        "stages": [s.to_dict() for s in stages],
    }

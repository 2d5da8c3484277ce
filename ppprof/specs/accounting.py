"""Per-stage accounting of a ModelSpec: parameters, KV-cache bytes per token, Mamba-state bytes per slot. Pure: no torch.

Parameter counts (no biases except the Mamba conv's; what ppprof's synthetic model builds):
- embedding vocab*hidden on the first stage; lm_head vocab*hidden and the final norm (hidden) on the last stage
  (counted untied: under PP each end holds its own copy);
- attention: q and o heads*head_dim*hidden each (q twice with attn_output_gate: the gate), k and v
  kv_heads*head_dim*hidden each, q/k norms 2*head_dim with qk_norm;
- MLA (H heads): q_a hidden*q_lora_rank, its norm, q_b q_lora_rank*H*(nope + rope) (or one q_proj
  hidden*H*(nope + rope) when q_lora_rank is 0), kv_a hidden*(kv_lora_rank + rope), its norm kv_lora_rank, kv_b
  kv_lora_rank*H*(nope + v), o H*v*hidden;
- deltanet (Gated DeltaNet, Hk key heads of dk, Hv value heads of dv): in_proj_qkvz hidden*(2 Hk dk + 2 Hv dv),
  in_proj_ba hidden*2 Hv, conv1d (2 Hk dk + Hv dv)*kernel (no bias), A_log and dt_bias (Hv each), the gated norm dv,
  out_proj Hv dv*hidden;
- mamba (Mamba2): in_proj hidden*(2*d_inner + 2*groups*d_state + heads), conv1d conv_dim*kernel + conv_dim bias,
  dt_bias, A_log and D (heads each), gated norm d_inner, out_proj d_inner*hidden;
- mlp: 3*hidden*intermediate when gated (mlp_act silu), 2*hidden*intermediate for relu2 (up, down);
  moe: router hidden*experts (+ experts, the selection bias, with sigmoid scoring) + experts*(3 or 2)*hidden*
  moe_intermediate, the experts gated as the MLP, + the shared expert (3 or 2)*hidden*shared_intermediate and its
  gate (hidden) when the model has them;
- norm: one RMSNorm (hidden) before the mixers and one before the FFN of each layer that has them.
- mtp (counted, not run): a module of enorm, hnorm, eh_proj 2*hidden*hidden, one decoder layer like the last and its
  final norm (the embedding and head are the main model's) a MTP layer.
Active parameters a token: the stage's, less the embedding (a lookup) and the routed experts a token is not sent to
(experts - top_k a MoE layer): DeepSeek-V3's 36.6B "activated, including the 0.9B output head".
Bytes: every parameter in the pipeline dtype except Mamba's A_log, dt_bias and D and the Gated DeltaNet's A_log and
dt_bias, which stay fp32.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ppprof.specs.dtypes import AUTO_DTYPE_GPU, SSM_STATE_BYTES, dtype_bytes, normalize_dtype
from ppprof.specs.partition import split_layers
from ppprof.specs.pattern import format_layers
from ppprof.specs.spec import ATTENTION, MLA, MLP, MOE, SIGMOID, LayerSpec, ModelSpec, layers_pattern

PARAM_KEYS = ("embedding", "attention", "deltanet", "mamba", "mlp", "moe", "norm", "lm_head")
MAMBA_FP32_PARAMS_PER_HEAD = 3
"""A_log, dt_bias and D: one value a head each, kept fp32 whatever the dtype (ppprof.model.mamba.Mamba2)."""
DELTANET_FP32_PARAMS_PER_HEAD = 2
"""A_log and dt_bias: one value a value head each, kept fp32 (ppprof.model.deltanet.GatedDeltaNet)."""
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
    num_active_params: int
    """Parameters a token's forward uses on this stage (see the module docstring)."""
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
            "num_active_params": self.num_active_params,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "mamba_bytes_per_slot": self.mamba_bytes_per_slot,
        }


def accounting_dtype(spec: ModelSpec, dtype: str | None = None) -> str:
    """The dtype the byte counts use: `dtype`, else the spec's, else bfloat16 (the GPU run-time default)."""
    return normalize_dtype(dtype) or spec.dtype or AUTO_DTYPE_GPU


def layer_params(spec: ModelSpec, layer: LayerSpec) -> dict[str, int]:
    """Parameters of one layer by part: attention (GQA or MLA), deltanet, mamba, mlp, moe, norm."""
    h = spec.hidden_size
    out = dict.fromkeys(("attention", "deltanet", "mamba", "mlp", "moe", "norm"), 0)
    if layer.has_attention:
        q_dim, kv_dim = spec.num_attention_heads * spec.head_dim, spec.num_key_value_heads * spec.head_dim
        out["attention"] = (
            h * q_dim * (2 if spec.attn_output_gate else 1)
            + q_dim * h
            + 2 * h * kv_dim
            + 2 * spec.head_dim * spec.qk_norm
        )
    if layer.has_mla:
        out["attention"] = mla_params(spec)
    if layer.has_deltanet:
        hv, key_dim, value_dim = spec.linear_num_value_heads, spec.deltanet_key_dim, spec.deltanet_value_dim
        out["deltanet"] = (
            h * (2 * key_dim + 2 * value_dim)
            + h * 2 * hv
            + spec.deltanet_conv_dim * spec.linear_conv_kernel_dim
            + DELTANET_FP32_PARAMS_PER_HEAD * hv
            + spec.linear_value_head_dim
            + value_dim * h
        )
    if layer.has_mamba:
        d_inner, heads, conv_dim = spec.mamba_d_inner, spec.mamba_num_heads, spec.mamba_conv_dim
        in_proj = h * (2 * d_inner + 2 * spec.mamba_n_groups * spec.ssm_state_size + heads)
        conv = conv_dim * spec.conv_kernel + conv_dim
        out["mamba"] = in_proj + conv + 3 * heads + d_inner + d_inner * h
    if layer.ffn == MLP:
        out["mlp"] = mlp_params(spec, spec.intermediate_size)
    elif layer.ffn == MOE:
        out["moe"] = (
            h * spec.num_experts
            + spec.num_experts * (spec.moe_scoring == SIGMOID)
            + spec.num_experts * expert_params(spec)
            + mlp_params(spec, spec.shared_expert_intermediate_size)
            + h * spec.shared_expert_gate
        )
    out["norm"] = h * (bool(layer.mixers) + bool(layer.ffn))
    return out


def mlp_params(spec: ModelSpec, intermediate_size: int) -> int:
    """An MLP of this inner width: 3 matrices when gated (silu), 2 for relu2."""
    return (3 if spec.mlp_gated else 2) * spec.hidden_size * intermediate_size


def expert_params(spec: ModelSpec) -> int:
    """One routed expert."""
    return mlp_params(spec, spec.moe_intermediate_size)


def mla_params(spec: ModelSpec) -> int:
    """One MLA mixer (see the module docstring)."""
    h, heads = spec.hidden_size, spec.num_attention_heads
    q_out = heads * spec.qk_head_dim
    q = h * spec.q_lora_rank + spec.q_lora_rank + spec.q_lora_rank * q_out if spec.q_lora_rank else h * q_out
    kv = (
        h * spec.mla_latent_dim
        + spec.kv_lora_rank
        + spec.kv_lora_rank * heads * (spec.qk_nope_head_dim + spec.v_head_dim)
    )
    return q + kv + heads * spec.v_head_dim * h


def mtp_params(spec: ModelSpec) -> int:
    """The multi-token-prediction modules' own parameters (counted, never run): per module enorm, hnorm, eh_proj, a
    decoder layer with the model's KV mixer and FFN of its last layer, and its final norm."""
    if not spec.num_mtp_layers:
        return 0
    last = spec.layers[-1]
    mixer = MLA if any(layer.has_mla for layer in spec.layers) else ATTENTION
    layer = LayerSpec(mixers=(mixer,), ffn=last.ffn or MLP)
    h = spec.hidden_size
    return spec.num_mtp_layers * (sum(layer_params(spec, layer).values()) + 2 * h * h + 3 * h)


def active_params(spec: ModelSpec, layers: range) -> int:
    """Parameters a token's forward uses on the stage holding `layers`: all but the embedding and the routed experts
    it is not sent to."""
    num_moe = sum(spec.layers[i].ffn == MOE for i in layers)
    unused = num_moe * (spec.num_experts - spec.num_experts_per_tok) * expert_params(spec)
    params = stage_params(spec, layers)
    return params["total"] - params["embedding"] - unused


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
    """Bytes of the stage's parameters (stage_params): the pipeline dtype, except the fp32 A_log, dt_bias (and D) of
    Mamba and Gated DeltaNet."""
    fp32 = MAMBA_FP32_PARAMS_PER_HEAD * spec.mamba_num_heads * sum(
        spec.layers[i].has_mamba for i in layers
    ) + DELTANET_FP32_PARAMS_PER_HEAD * spec.linear_num_value_heads * sum(spec.layers[i].has_deltanet for i in layers)
    rest = stage_params(spec, layers)["total"] - fp32
    return rest * dtype_bytes(accounting_dtype(spec, dtype)) + fp32 * FP32_BYTES


def kv_bytes_per_token(spec: ModelSpec, layers: range | None = None, *, dtype: str | None = None) -> int:
    """KV-cache bytes one token takes on `layers` (default all), in the dtype: 2 * kv_heads * head_dim per attention
    layer (K and V), kv_lora_rank + qk_rope_head_dim per MLA layer (the latent and the shared RoPE key, as servers
    store it); Gated DeltaNet and Mamba layers keep none."""
    layers = range(spec.num_layers) if layers is None else layers
    num_attention = sum(spec.layers[i].has_attention for i in layers)
    num_mla = sum(spec.layers[i].has_mla for i in layers)
    values = 2 * spec.num_key_value_heads * spec.head_dim * num_attention + spec.mla_latent_dim * num_mla
    return values * dtype_bytes(accounting_dtype(spec, dtype))


def mamba_bytes_per_slot(spec: ModelSpec, layers: range | None = None, *, dtype: str | None = None) -> int:
    """Bytes one request's Mamba-pool slot takes on `layers` (default all), per Mamba2 layer: the conv state
    conv_dim * (kernel - 1) in the dtype, plus the SSM state heads * head_dim * d_state in fp32; per Gated DeltaNet
    layer: its conv state (2 Hk dk + Hv dv) * (kernel - 1) in the dtype, plus the recurrent state Hv * dk * dv in
    fp32."""
    layers = range(spec.num_layers) if layers is None else layers
    b = dtype_bytes(accounting_dtype(spec, dtype))
    out = 0
    num_mamba = sum(spec.layers[i].has_mamba for i in layers)
    if num_mamba:
        conv = spec.mamba_conv_dim * (spec.conv_kernel - 1) * b
        ssm = spec.mamba_num_heads * spec.mamba_head_dim * spec.ssm_state_size * SSM_STATE_BYTES
        out += num_mamba * (conv + ssm)
    num_deltanet = sum(spec.layers[i].has_deltanet for i in layers)
    if num_deltanet:
        conv, state = deltanet_state_shapes(spec)
        out += num_deltanet * (conv[0] * conv[1] * b + state[0] * state[1] * state[2] * SSM_STATE_BYTES)
    return out


def deltanet_state_shapes(spec: ModelSpec) -> tuple[tuple[int, int], tuple[int, int, int]]:
    """A Gated DeltaNet layer's slot in the Mamba pool, in MambaPool's layout: conv (channels, kernel - 1) and the
    recurrent state (value heads, key head dim, value head dim)."""
    return (
        (spec.deltanet_conv_dim, spec.linear_conv_kernel_dim - 1),
        (spec.linear_num_value_heads, spec.linear_key_head_dim, spec.linear_value_head_dim),
    )


def stage_accounts(
    spec: ModelSpec, pp_size: int = 1, partition: Sequence[int] | None = None, *, dtype: str | None = None
) -> list[StageAccount]:
    """One StageAccount per pipeline stage, the layers split by ppprof.specs.partition.split_layers."""
    out = []
    for stage_idx, layers in enumerate(split_layers(spec.num_layers, pp_size, partition)):
        out.append(
            StageAccount(
                stage_idx=stage_idx,
                layers=layers,
                pattern=layers_pattern([spec.layers[i] for i in layers]),
                layout=format_layers([spec.layers[i] for i in layers]),
                num_params=stage_params(spec, layers),
                num_active_params=active_params(spec, layers),
                kv_bytes_per_token=kv_bytes_per_token(spec, layers, dtype=dtype),
                mamba_bytes_per_slot=mamba_bytes_per_slot(spec, layers, dtype=dtype),
            )
        )
    return out


def describe(spec: ModelSpec, pp_size: int = 1, partition: list[int] | None = None, dtype: str | None = None) -> dict:
    """spec.to_dict() plus the byte dtype and one entry per stage (StageAccount.to_dict())."""
    stages = stage_accounts(spec, pp_size, partition, dtype=dtype)
    return {
        **spec.to_dict(),
        "num_layers": spec.num_layers,
        "num_params": sum(s.num_params["total"] for s in stages),
        "num_active_params": sum(s.num_active_params for s in stages),
        "num_mtp_params": mtp_params(spec),
        "layout": format_layers(spec.layers),
        "accounting_dtype": accounting_dtype(spec, dtype),
        "stages": [s.to_dict() for s in stages],
    }

"""HuggingFace config.json -> layers and fields, for the MoE families of the published PP deployments: DeepSeek-V2/V3
and Kimi-K2 (MLA + MoE), Qwen3-MoE (GQA + MoE), Qwen3-Next and the Qwen3.5 text model (Gated DeltaNet + gated
attention + MoE). Field names and defaults follow each family's transformers configuration_*.py (DeepSeek's and
Kimi-K2's configuration_deepseek.py for the fields transformers lacks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ppprof.checks import is_int, short
from ppprof.specs.hf_fields import attention_fields, num_layers, read_float, read_int
from ppprof.specs.spec import ATTENTION, DELTANET, MLA, MLP, MOE, SIGMOID, SOFTMAX, LayerSpec

MOE_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "deepseek_v2": dict(
        vocab_size=102400,
        hidden_size=4096,
        intermediate_size=11008,
        moe_intermediate_size=1407,
        num_hidden_layers=30,
        num_attention_heads=32,
        num_key_value_heads=None,
        n_shared_experts=None,
        n_routed_experts=None,
        routed_scaling_factor=1.0,
        n_group=None,
        topk_group=None,
        num_experts_per_tok=None,
        moe_layer_freq=1,
        first_k_dense_replace=0,
        norm_topk_prob=False,
        scoring_func=SOFTMAX,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        num_nextn_predict_layers=0,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
    ),
    "deepseek_v3": dict(
        vocab_size=129280,
        hidden_size=7168,
        intermediate_size=18432,
        moe_intermediate_size=2048,
        num_hidden_layers=61,
        num_attention_heads=128,
        num_key_value_heads=128,
        n_shared_experts=1,
        n_routed_experts=256,
        routed_scaling_factor=2.5,
        n_group=8,
        topk_group=4,
        num_experts_per_tok=8,
        moe_layer_freq=1,
        first_k_dense_replace=3,
        norm_topk_prob=True,
        scoring_func=SIGMOID,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        num_nextn_predict_layers=1,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
    ),
    "qwen3_moe": dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=24,
        num_attention_heads=32,
        num_key_value_heads=4,
        head_dim=128,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        decoder_sparse_step=1,
        moe_intermediate_size=768,
        num_experts_per_tok=8,
        num_experts=128,
        norm_topk_prob=False,
        shared_expert_intermediate_size=0,
    ),
    "qwen3_next": dict(
        vocab_size=151936,
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=48,
        num_attention_heads=16,
        num_key_value_heads=2,
        head_dim=256,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        decoder_sparse_step=1,
        moe_intermediate_size=512,
        num_experts_per_tok=10,
        num_experts=512,
        norm_topk_prob=True,
        shared_expert_intermediate_size=512,
        full_attention_interval=4,
        linear_conv_kernel_dim=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
    ),
}
"""Each family's defaults for the fields a config may leave out (kimi_k2 reads as deepseek_v3, qwen3_5 and
qwen3_5_moe as qwen3_next, from their text_config)."""

QWEN3_NEXT_LAYER_TYPES = {"linear_attention": DELTANET, "full_attention": ATTENTION}
DEEPSEEK_TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def _bool(cfg: dict, key: str, default: bool) -> bool:
    value = cfg.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{key}={short(value)} must be true or false; fix the config")
    return value


def _present_int(cfg: dict, key: str, default: int) -> int:
    """An integer field that must not be null when given: MLA's ranks and head dims (a null kv_lora_rank would
    otherwise read as the family's default and hide a broken config)."""
    if key in cfg and cfg[key] is None:
        raise ValueError(f"{key}=None must be a positive integer (MLA needs it); fix the config")
    return read_int(cfg, key, default=default)


def _layer_list(cfg: dict, key: str, n: int) -> set[int]:
    value = cfg.get(key) or []
    if not isinstance(value, list) or not all(is_int(i) for i in value):
        raise ValueError(f"{key}={short(value)} must be a list of integer layer indices; fix the config")
    bad = sorted(i for i in value if not 0 <= i < n)
    if bad:
        raise ValueError(f"{key} {bad} are outside 0..{n - 1}: fix the config")
    return set(value)


def _positive_field(cfg: dict, key: str, default: int) -> int:
    value = read_int(cfg, key, default=default)
    if value < 1:
        raise ValueError(f"{key}={value} must be a positive integer; fix the config")
    return value


def _deepseek(cfg: dict, family: str) -> tuple[tuple[LayerSpec, ...], dict]:
    """MLA in every layer; MoE in layer i when the config has routed experts, i >= first_k_dense_replace and
    i % moe_layer_freq == 0 (DeepseekV3DecoderLayer), else the dense MLP."""
    d = MOE_FAMILY_DEFAULTS["deepseek_v2" if family == "deepseek_v2" else "deepseek_v3"]
    fields = attention_fields(cfg, {**d, "head_dim": None})
    for key in ("num_key_value_heads", "head_dim"):
        fields.pop(key)  # MLA keys and values come from the latent, per query head
    n = num_layers(cfg, d["num_hidden_layers"])
    experts = cfg.get("n_routed_experts", d["n_routed_experts"])
    experts = 0 if experts is None else read_int(cfg, "n_routed_experts", default=experts)
    first_dense = read_int(cfg, "first_k_dense_replace", default=d["first_k_dense_replace"])
    freq = _positive_field(cfg, "moe_layer_freq", d["moe_layer_freq"])
    if first_dense < 0:
        raise ValueError(f"first_k_dense_replace={first_dense} must be >= 0; fix the config")
    layers = tuple(
        LayerSpec(mixers=(MLA,), ffn=MOE if experts and i >= first_dense and i % freq == 0 else MLP) for i in range(n)
    )
    scoring = cfg.get("scoring_func") or d["scoring_func"]
    if scoring not in (SOFTMAX, SIGMOID):
        raise ValueError(f"scoring_func={short(scoring)} is not supported: use {SOFTMAX} or {SIGMOID}")
    method = cfg.get("topk_method") or ("noaux_tc" if scoring == SIGMOID else "greedy")
    if method not in DEEPSEEK_TOPK_METHODS:
        raise ValueError(f"topk_method={short(method)} is not supported: use one of {', '.join(DEEPSEEK_TOPK_METHODS)}")
    grouped = method != "greedy"
    q_lora_rank = cfg.get("q_lora_rank", d["q_lora_rank"])
    shared = cfg.get("n_shared_experts", d["n_shared_experts"])
    shared = 0 if shared is None else read_int(cfg, "n_shared_experts", default=shared)
    moe_inter = read_int(cfg, "moe_intermediate_size", default=d["moe_intermediate_size"])
    top_k = cfg.get("num_experts_per_tok", d["num_experts_per_tok"])
    fields.update(
        q_lora_rank=0 if q_lora_rank is None else read_int(cfg, "q_lora_rank", default=q_lora_rank),
        kv_lora_rank=_present_int(cfg, "kv_lora_rank", d["kv_lora_rank"]),
        qk_nope_head_dim=_present_int(cfg, "qk_nope_head_dim", d["qk_nope_head_dim"]),
        qk_rope_head_dim=_present_int(cfg, "qk_rope_head_dim", d["qk_rope_head_dim"]),
        v_head_dim=_present_int(cfg, "v_head_dim", d["v_head_dim"]),
        num_experts=experts,
        num_experts_per_tok=0 if top_k is None else read_int(cfg, "num_experts_per_tok", default=top_k),
        moe_intermediate_size=moe_inter,
        moe_scoring=scoring,
        norm_topk_prob=_bool(cfg, "norm_topk_prob", d["norm_topk_prob"]),
        routed_scaling_factor=read_float(cfg, "routed_scaling_factor", default=d["routed_scaling_factor"]),
        moe_n_group=read_int(cfg, "n_group", default=d["n_group"] or 1) if grouped else 1,
        moe_topk_group=read_int(cfg, "topk_group", default=d["topk_group"] or 1) if grouped else 1,
        shared_expert_intermediate_size=shared * moe_inter,
        num_mtp_layers=read_int(cfg, "num_nextn_predict_layers", default=d["num_nextn_predict_layers"]),
    )
    return layers, fields


def _qwen3_moe(cfg: dict, family: str) -> tuple[tuple[LayerSpec, ...], dict]:
    """GQA with q/k norm in every layer; MoE in layer i unless i is in mlp_only_layers, when the config has experts
    and (i + 1) % decoder_sparse_step == 0 (Qwen3MoeDecoderLayer), else the dense MLP."""
    d = MOE_FAMILY_DEFAULTS["qwen3_moe"]
    fields = attention_fields(cfg, d)
    n = num_layers(cfg, d["num_hidden_layers"])
    layers = tuple(LayerSpec(mixers=(ATTENTION,), ffn=ffn) for ffn in _moe_ffns(cfg, d, n))
    fields.update(_qwen_moe_fields(cfg, d), qk_norm=True)
    return layers, fields


def _moe_ffns(cfg: dict, d: dict, n: int) -> list[str]:
    experts = read_int(cfg, "num_experts", default=d["num_experts"])
    step = _positive_field(cfg, "decoder_sparse_step", d["decoder_sparse_step"])
    dense = _layer_list(cfg, "mlp_only_layers", n)
    return [MOE if experts > 0 and i not in dense and (i + 1) % step == 0 else MLP for i in range(n)]


def _qwen_moe_fields(cfg: dict, d: dict) -> dict:
    return dict(
        num_experts=read_int(cfg, "num_experts", default=d["num_experts"]),
        num_experts_per_tok=read_int(cfg, "num_experts_per_tok", default=d["num_experts_per_tok"]),
        moe_intermediate_size=read_int(cfg, "moe_intermediate_size", default=d["moe_intermediate_size"]),
        norm_topk_prob=_bool(cfg, "norm_topk_prob", d["norm_topk_prob"]),
        shared_expert_intermediate_size=read_int(
            cfg, "shared_expert_intermediate_size", default=d["shared_expert_intermediate_size"]
        ),
    )


def _qwen3_next(cfg: dict, family: str) -> tuple[tuple[LayerSpec, ...], dict]:
    """Gated DeltaNet in layer i, gated full attention where (i + 1) % full_attention_interval == 0 (or as
    layer_types lists them); MoE as Qwen3-MoE places it, each with a sigmoid-gated shared expert. Qwen3.5's
    config holds the same fields in its text_config."""
    if family in ("qwen3_5", "qwen3_5_moe"):
        text = cfg.get("text_config")
        if not isinstance(text, dict):
            raise ValueError(f"text_config={short(text)} must hold the text model's fields; fix the config")
        cfg = text
    d = MOE_FAMILY_DEFAULTS["qwen3_next"]
    if family == "qwen3_5":  # the dense Qwen3.5: no experts unless the config gives them
        d = {**d, "num_experts": 0, "shared_expert_intermediate_size": 0}
    fields = attention_fields(cfg, d)
    n = num_layers(cfg, d["num_hidden_layers"])
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n or not all(t in QWEN3_NEXT_LAYER_TYPES for t in types):
            raise ValueError(
                f"layer_types={short(types)} must list {n} of {', '.join(QWEN3_NEXT_LAYER_TYPES)}; fix the config"
            )
        mixers = [QWEN3_NEXT_LAYER_TYPES[t] for t in types]
    else:
        interval = _positive_field(cfg, "full_attention_interval", d["full_attention_interval"])
        mixers = [ATTENTION if (i + 1) % interval == 0 else DELTANET for i in range(n)]
    layers = tuple(LayerSpec(mixers=(m,), ffn=ffn) for m, ffn in zip(mixers, _moe_ffns(cfg, d, n)))
    fields.update(
        _qwen_moe_fields(cfg, d),
        qk_norm=True,
        attn_output_gate=_bool(cfg, "attn_output_gate", default=True),
        shared_expert_gate=True,
        num_mtp_layers=read_int(cfg, "mtp_num_hidden_layers", "num_nextn_predict_layers", default=0),
    )
    for key in (
        "linear_num_key_heads",
        "linear_num_value_heads",
        "linear_key_head_dim",
        "linear_value_head_dim",
        "linear_conv_kernel_dim",
    ):
        fields[key] = read_int(cfg, key, default=d[key])
    return layers, fields


MOE_FAMILIES: dict[str, Callable[[dict, str], tuple[tuple[LayerSpec, ...], dict]]] = {
    "deepseek_v2": _deepseek,
    "deepseek_v3": _deepseek,
    "kimi_k2": _deepseek,
    "qwen3_moe": _qwen3_moe,
    "qwen3_next": _qwen3_next,
    "qwen3_5": _qwen3_next,
    "qwen3_5_moe": _qwen3_next,
}
MOE_ARCHITECTURES = {
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "Qwen3NextForCausalLM": "qwen3_next",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
}
MOE_RECORD_KEYS = (
    "n_shared_experts",
    "topk_method",
    "scoring_func",
    "partial_rotary_factor",
    "rope_scaling",
    "num_nextn_predict_layers",
    "mtp_num_hidden_layers",
    "full_attention_interval",
    "quantization_config",
)

"""Model specs: the shapes of the model being profiled (kw-only dataclasses, validated at construction).

Loading presets and HuggingFace config.json files lives beside this module (load.py, hf.py); this one holds and checks
the shapes, and writes a layer in the one layer notation (Nemotron-H's characters, see ppprof.specs.pattern).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields

from ppprof.checks import a_type, is_int, is_number, short

ATTENTION = "attention"
MLA = "mla"
"""Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): the KV pool holds one latent a token a layer."""
MAMBA = "mamba"
DELTANET = "deltanet"
"""Gated DeltaNet linear attention (Qwen3-Next): conv and recurrent state in a Mamba-pool slot, as Mamba2's."""
MLP = "mlp"
MOE = "moe"
MIXERS = (ATTENTION, MLA, MAMBA, DELTANET)
KV_MIXERS = (ATTENTION, MLA)
"""Mixers whose cache is the KV pool (one entry a token)."""
STATE_MIXERS = (MAMBA, DELTANET)
"""Mixers whose cache is a Mamba-pool slot (one a request)."""
FFNS = (MLP, MOE)
SOFTMAX = "softmax"
SIGMOID = "sigmoid"
MOE_SCORINGS = (SOFTMAX, SIGMOID)
"""How a MoE router scores experts: softmax over the experts (Qwen3-MoE, DeepSeek-V2), or an independent sigmoid
each with a selection-only bias (DeepSeek-V3's noaux_tc, Kimi-K2)."""
SILU = "silu"
RELU2 = "relu2"
MLP_ACTS = (SILU, RELU2)
"""FFN activations: silu is gated (Llama: down(silu(gate x) * up x), 3 matrices); relu2 is not (Nemotron-H:
down(relu(up x)^2), 2 matrices)."""
MIXER_CHARS = {"*": ATTENTION, "L": MLA, "M": MAMBA, "D": DELTANET}
FFN_CHARS = {"-": MLP, "E": MOE}
"""The layer notation's characters (Nemotron-H's, and two of ppprof's): M mamba, * attention, - MLP, E MoE; L latent
attention (MLA), D Gated DeltaNet."""
MAX_LAYERS = 4096
"""The most decoder layers a model spec holds (a pattern, repeat or num_hidden_layers beyond it is refused)."""
FLOAT_FIELDS = ("rms_norm_eps", "rope_theta", "routed_scaling_factor")
TEXT_FIELDS = ("name", "family", "mlp_act", "moe_scoring")
BOOL_FIELDS = ("qk_norm", "attn_output_gate", "norm_topk_prob", "shared_expert_gate")


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """One decoder layer: token mixers run in parallel on the same input (FalconH1 has both), then an optional FFN.

    Nemotron-H's separate layers map to LayerSpec(mixers=("mamba",)), LayerSpec(mixers=("attention",)),
    LayerSpec(mixers=(), ffn="mlp"); a Llama layer is LayerSpec(mixers=("attention",), ffn="mlp").
    """

    mixers: tuple[str, ...] = ()
    ffn: str | None = None

    def __post_init__(self) -> None:
        for m in self.mixers:
            if m not in MIXERS:
                raise ValueError(f"layer mixer {m!r} is unknown: use one of {', '.join(MIXERS)}")
        if self.ffn is not None and self.ffn not in FFNS:
            raise ValueError(f"layer ffn {self.ffn!r} is unknown: use one of {', '.join(FFNS)} or none")
        if not self.mixers and self.ffn is None:
            raise ValueError("a layer needs a mixer or an ffn")

    @property
    def has_attention(self) -> bool:
        return ATTENTION in self.mixers

    @property
    def has_mla(self) -> bool:
        return MLA in self.mixers

    @property
    def has_mamba(self) -> bool:
        return MAMBA in self.mixers

    @property
    def has_deltanet(self) -> bool:
        return DELTANET in self.mixers

    @property
    def has_kv(self) -> bool:
        """Whether the layer keeps entries in the KV pool (attention or MLA)."""
        return any(m in KV_MIXERS for m in self.mixers)

    @property
    def has_state(self) -> bool:
        """Whether the layer keeps state in the request's Mamba-pool slot (Mamba2 or Gated DeltaNet)."""
        return any(m in STATE_MIXERS for m in self.mixers)

    @property
    def token(self) -> str:
        """This layer in the layer notation: its mixers, then its FFN; attention + MLP -> "*-", mamba only -> "M"."""
        mixer_chars = {v: k for k, v in MIXER_CHARS.items()}
        ffn_chars = {v: k for k, v in FFN_CHARS.items()}
        return "".join(mixer_chars[m] for m in self.mixers) + (ffn_chars[self.ffn] if self.ffn else "")


def layers_pattern(layers) -> str:
    """Layers in the layer notation, uncompressed: one character a layer when every layer holds one thing ("M-M*E"),
    else space-separated tokens ("M- ME *-")."""
    tokens = [layer.token for layer in layers]
    return token_separator(tokens).join(tokens)


def token_separator(tokens: list[str]) -> str:
    """ "" when every layer is one character (a Nemotron-H pattern), else " " between layer tokens."""
    return "" if all(len(t) == 1 for t in tokens) else " "


@dataclass(kw_only=True, slots=True)
class ModelSpec:
    """Shapes of a decoder-only model with attention and/or Mamba2 layers. Weights are random (dummy), as servers do."""

    name: str
    """Preset name or the path the spec was read from."""
    family: str
    """Architecture family: llama, qwen2, qwen3, mistral, nemotron_h, jamba, bamba, falcon_h1, deepseek_v2,
    deepseek_v3, kimi_k2, qwen3_moe, qwen3_next."""
    layers: tuple[LayerSpec, ...]
    hidden_size: int
    vocab_size: int = 32000
    intermediate_size: int = 0
    """MLP inner width."""
    mlp_act: str = SILU
    """FFN activation of the MLP and of the MoE experts, one of MLP_ACTS: silu (gated, 3 matrices) or relu2
    (squared ReLU, not gated, 2 matrices)."""
    rms_norm_eps: float = 1e-5

    # attention
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    rope_theta: float = 10000.0
    qk_norm: bool = False
    """RMSNorm over each head of q and k before RoPE (Qwen3)."""
    attn_output_gate: bool = False
    """q_proj also gives a per-channel gate; the attention output is multiplied by its sigmoid (Qwen3-Next)."""

    # MLA (heads: num_attention_heads)
    q_lora_rank: int = 0
    """Rank of the query compression (q_a_proj -> norm -> q_b_proj); 0: one q_proj (DeepSeek-V2-Lite)."""
    kv_lora_rank: int = 0
    """Width of the latent each token keeps (kv_a_proj's first part, normed), up-projected by kv_b_proj."""
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    """The rotary part of each q head and of the one key every head shares (kept in the cache beside the latent)."""
    v_head_dim: int = 0

    # Gated DeltaNet
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    deltanet_chunk_size: int = 64
    """Chunk length of the chunked delta rule (an algorithmic block size, not the prefill chunk)."""

    # Mamba2
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    ssm_state_size: int = 0
    """d_state: size of the SSM state per head and head dim."""
    conv_kernel: int = 4
    mamba_n_groups: int = 1
    mamba_chunk_size: int = 128
    """Chunk length of the SSD scan (an algorithmic block size, not the prefill chunk)."""

    # MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    moe_scoring: str = SOFTMAX
    """One of MOE_SCORINGS; sigmoid also carries a per-expert selection bias (e_score_correction_bias)."""
    norm_topk_prob: bool = True
    """Renormalise the top-k weights to sum to 1."""
    routed_scaling_factor: float = 1.0
    """Multiplies the routed experts' weighted sum (DeepSeek-V3 2.5)."""
    moe_n_group: int = 1
    """Experts are split into this many groups; a token picks its experts from its best moe_topk_group groups."""
    moe_topk_group: int = 1
    shared_expert_intermediate_size: int = 0
    """Inner width of the shared expert(s) every token runs, as one MLP (DeepSeek: n_shared_experts *
    moe_intermediate_size); 0: none."""
    shared_expert_gate: bool = False
    """The shared expert's output is scaled by sigmoid(a hidden -> 1 projection) (Qwen3-Next)."""

    num_mtp_layers: int = 0
    """Multi-token-prediction modules (DeepSeek-V3's num_nextn_predict_layers, Qwen3-Next's mtp_num_hidden_layers):
    counted by `ppprof model`, never run (they serve speculative decoding, not prefill)."""

    dtype: str | None = None
    """torch dtype name (float32, bfloat16, float16); None means bf16 on GPU, fp32 on CPU."""
    extra: dict = field(default_factory=dict)
    """Fields read from a HuggingFace config that ppprof keeps for the record only."""

    def __post_init__(self) -> None:
        check_types(self)
        if not self.layers:
            raise ValueError(f"model {self.name!r} has no layers: give at least one layer")
        _positive(self, "hidden_size", "vocab_size")
        if self.mlp_act not in MLP_ACTS:
            raise ValueError(
                f"model {self.name!r}: mlp_act={self.mlp_act!r} is unknown: use one of {', '.join(MLP_ACTS)}"
            )
        if any(layer.ffn == MLP for layer in self.layers):
            _positive(self, "intermediate_size")
        if any(layer.has_attention for layer in self.layers):
            _positive(self, "num_attention_heads", "num_key_value_heads", "head_dim")
            if self.num_attention_heads % self.num_key_value_heads:
                raise ValueError(
                    f"num_attention_heads ({self.num_attention_heads}) is not a multiple of num_key_value_heads "
                    f"({self.num_key_value_heads}): use a divisor of num_attention_heads"
                )
        if any(layer.has_mamba for layer in self.layers):
            _positive(
                self,
                "mamba_num_heads",
                "mamba_head_dim",
                "ssm_state_size",
                "conv_kernel",
                "mamba_n_groups",
                "mamba_chunk_size",
            )
            if self.mamba_num_heads % self.mamba_n_groups:
                raise ValueError(
                    f"mamba_num_heads ({self.mamba_num_heads}) is not a multiple of mamba_n_groups "
                    f"({self.mamba_n_groups}): use a divisor of mamba_num_heads"
                )
        if any(layer.has_mla for layer in self.layers):
            _positive(self, "num_attention_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
            if self.qk_rope_head_dim % 2:
                raise ValueError(
                    f"model {self.name!r}: qk_rope_head_dim={self.qk_rope_head_dim} must be even "
                    "(RoPE rotates pairs); fix the config"
                )
            if any(layer.has_attention for layer in self.layers):
                raise ValueError(
                    f"model {self.name!r} mixes MLA and attention layers: ppprof keeps one KV pool "
                    "layout a model; use one kind"
                )
        if any(layer.has_deltanet for layer in self.layers):
            _positive(
                self,
                "linear_num_key_heads",
                "linear_num_value_heads",
                "linear_key_head_dim",
                "linear_value_head_dim",
                "linear_conv_kernel_dim",
                "deltanet_chunk_size",
            )
            if self.linear_num_value_heads % self.linear_num_key_heads:
                raise ValueError(
                    f"model {self.name!r}: linear_num_value_heads ({self.linear_num_value_heads}) is not a multiple "
                    f"of linear_num_key_heads ({self.linear_num_key_heads}): use a divisor of linear_num_value_heads"
                )
            if any(layer.has_mamba for layer in self.layers):
                raise ValueError(
                    f"model {self.name!r} mixes Mamba2 and Gated DeltaNet layers: ppprof keeps one "
                    "Mamba-pool layout a model; use one kind"
                )
        if any(layer.ffn == MOE for layer in self.layers):
            _positive(
                self, "num_experts", "num_experts_per_tok", "moe_intermediate_size", "moe_n_group", "moe_topk_group"
            )
            if self.num_experts_per_tok > self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok ({self.num_experts_per_tok}) exceeds num_experts ({self.num_experts}): "
                    "lower num_experts_per_tok"
                )
            _check_groups(self)
            if self.moe_scoring not in MOE_SCORINGS:
                raise ValueError(
                    f"model {self.name!r}: moe_scoring={self.moe_scoring!r} is unknown: use one of "
                    f"{', '.join(MOE_SCORINGS)}"
                )

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def pattern(self) -> str:
        """The layers in the layer notation (see layers_pattern)."""
        return layers_pattern(self.layers)

    @property
    def mlp_gated(self) -> bool:
        """Whether the FFN has a gate projection (silu) besides up and down (relu2 has not)."""
        return self.mlp_act == SILU

    @property
    def qk_head_dim(self) -> int:
        """An MLA head's query/key width: its no-RoPE and RoPE parts."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def mla_latent_dim(self) -> int:
        """Values an MLA layer keeps a token in the KV pool: the latent and the shared RoPE key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def deltanet_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def deltanet_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def deltanet_conv_dim(self) -> int:
        """Channels through the Gated DeltaNet's causal conv: q, k and v."""
        return 2 * self.deltanet_key_dim + self.deltanet_value_dim

    @property
    def mamba_d_inner(self) -> int:
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels that go through the causal conv: x, B and C."""
        return self.mamba_d_inner + 2 * self.mamba_n_groups * self.ssm_state_size

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layers"] = [{"mixers": list(layer.mixers), "ffn": layer.ffn} for layer in self.layers]
        d["pattern"] = self.pattern
        return d


def _check_groups(spec: ModelSpec) -> None:
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


def _positive(spec: ModelSpec, *names: str) -> None:
    for name in names:
        value = getattr(spec, name)
        if not is_int(value) or value <= 0:
            raise ValueError(f"model {spec.name!r}: {name}={value!r} must be a positive integer; set it in the config")


def check_types(spec: ModelSpec) -> None:
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

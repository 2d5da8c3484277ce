"""Model specs: the shapes of the model being profiled (kw-only dataclasses, validated at construction).

Loading presets and HuggingFace config.json files lives beside this module (load.py, hf.py); this one holds the shapes
and what follows from them. The layer vocabulary and LayerSpec are in layer.py (and importable from here), the checks
in validation.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ppprof.specs.layer import (
    ATTENTION,
    DELTANET,
    FFN_CHARS,
    FFNS,
    KV_MIXERS,
    MAMBA,
    MAX_LAYERS,
    MIXER_CHARS,
    MIXERS,
    MLA,
    MLP,
    MLP_ACTS,
    MOE,
    MOE_SCORINGS,
    RELU2,
    SIGMOID,
    SILU,
    SOFTMAX,
    STATE_MIXERS,
    LayerSpec,
    layers_pattern,
    token_separator,
)
from ppprof.specs.validation import check_spec

__all__ = [
    "ATTENTION",
    "DELTANET",
    "FFNS",
    "FFN_CHARS",
    "KV_MIXERS",
    "MAMBA",
    "MAX_LAYERS",
    "MIXERS",
    "MIXER_CHARS",
    "MLA",
    "MLP",
    "MLP_ACTS",
    "MOE",
    "MOE_SCORINGS",
    "RELU2",
    "SIGMOID",
    "SILU",
    "SOFTMAX",
    "STATE_MIXERS",
    "LayerSpec",
    "ModelSpec",
    "layers_pattern",
    "token_separator",
]


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
        check_spec(self)

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

"""Model specs: the shapes of the model being profiled (kw-only dataclasses, validated at construction).

Loading presets and HuggingFace config.json files lives beside this module (load.py, hf.py); this one holds and checks
the shapes, and writes a layer in the one layer notation (Nemotron-H's characters, see ppprof.specs.pattern).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import math
from dataclasses import fields

from ppprof.checks import a_type, is_int, is_number, short

ATTENTION = "attention"
MAMBA = "mamba"
MLP = "mlp"
MOE = "moe"
MIXERS = (ATTENTION, MAMBA)
FFNS = (MLP, MOE)
SILU = "silu"
RELU2 = "relu2"
MLP_ACTS = (SILU, RELU2)
"""FFN activations: silu is gated (Llama: down(silu(gate x) * up x), 3 matrices); relu2 is not (Nemotron-H:
down(relu(up x)^2), 2 matrices)."""
MIXER_CHARS = {"*": ATTENTION, "M": MAMBA}
FFN_CHARS = {"-": MLP, "E": MOE}
"""The layer notation's characters (Nemotron-H's): M mamba, * attention, - MLP, E MoE."""
MAX_LAYERS = 4096
"""The most decoder layers a model spec holds (a pattern, repeat or num_hidden_layers beyond it is refused)."""
FLOAT_FIELDS = ("rms_norm_eps", "rope_theta")
TEXT_FIELDS = ("name", "family", "mlp_act")


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
    def has_mamba(self) -> bool:
        return MAMBA in self.mixers

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
    """"" when every layer is one character (a Nemotron-H pattern), else " " between layer tokens."""
    return "" if all(len(t) == 1 for t in tokens) else " "


@dataclass(kw_only=True, slots=True)
class ModelSpec:
    """Shapes of a decoder-only model with attention and/or Mamba2 layers. Weights are random (dummy), as servers do."""

    name: str
    """Preset name or the path the spec was read from."""
    family: str
    """Architecture family: llama, qwen2, qwen3, mistral, nemotron_h, jamba, bamba, falcon_h1."""
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
            raise ValueError(f"model {self.name!r}: mlp_act={self.mlp_act!r} is unknown: use one of "
                             f"{', '.join(MLP_ACTS)}")
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
            _positive(self, "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "conv_kernel", "mamba_n_groups",
                      "mamba_chunk_size")
            if self.mamba_num_heads % self.mamba_n_groups:
                raise ValueError(
                    f"mamba_num_heads ({self.mamba_num_heads}) is not a multiple of mamba_n_groups "
                    f"({self.mamba_n_groups}): use a divisor of mamba_num_heads"
                )
        if any(layer.ffn == MOE for layer in self.layers):
            _positive(self, "num_experts", "num_experts_per_tok", "moe_intermediate_size")
            if self.num_experts_per_tok > self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok ({self.num_experts_per_tok}) exceeds num_experts ({self.num_experts}): "
                    "lower num_experts_per_tok"
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
    for f in fields(spec):
        value = getattr(spec, f.name)
        if f.type == "int" and (not is_int(value) or value < 0):
            raise ValueError(f"model {spec.name!r}: {f.name}={short(value)} must be an integer >= 0"
                             + ("" if is_int(value) else f", not {a_type(value)}") + "; fix the config")
    for name in FLOAT_FIELDS:
        value = getattr(spec, name)
        if not is_number(value) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"model {spec.name!r}: {name}={short(value)} must be a finite positive number; fix the "
                             "config")
    if not isinstance(spec.layers, tuple) or not all(isinstance(layer, LayerSpec) for layer in spec.layers):
        raise ValueError(f"model {spec.name!r}: layers must be layer specs (give `pattern` or `layers`)")
    if len(spec.layers) > MAX_LAYERS:
        raise ValueError(f"model {spec.name!r} has {len(spec.layers)} layers: use at most {MAX_LAYERS}")
    if not isinstance(spec.extra, dict):
        raise ValueError(f"model {spec.name!r}: extra={short(spec.extra)} must be a mapping")

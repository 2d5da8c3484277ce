"""The layer vocabulary of a model spec: the kinds of token mixer and FFN, the activations and MoE scorings, the layer
notation's characters (Nemotron-H's, see ppprof.specs.pattern), the most layers a spec holds, and one decoder layer
(LayerSpec) written in that notation."""

from __future__ import annotations

from dataclasses import dataclass

from ppprof.bounds import MAX_LAYERS as MAX_LAYERS  # the bound lives on the ground floor, where the policy reads it too

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

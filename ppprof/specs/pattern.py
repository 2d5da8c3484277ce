"""Layer patterns: parse the compact layer notations of presets and HF configs, and shorten a model keeping its mix.

Two notations, both built from Nemotron-H's characters (M mamba, * attention, - MLP, E MoE):
- a *pattern* (Nemotron-H's hybrid_override_pattern): one character a layer, "M-M*-E";
- *layer tokens*: one token a layer, the characters of everything in that layer: "*-" attention + MLP (Llama),
  "ME" mamba + MoE (Jamba), "*M-" attention and mamba in parallel + MLP (FalconH1), "M" mamba only.
"""

from __future__ import annotations

from ppprof.specs.spec import (
    ATTENTION,
    DELTANET,
    FFN_CHARS,
    MAMBA,
    MIXER_CHARS,
    MIXERS,
    MLA,
    MLP,
    MOE,
    LayerSpec,
    token_separator,
)

# Kinds a shortened model keeps if the full one has them, most important first.
KEEP_PRIORITY = (ATTENTION, MLA, MAMBA, DELTANET, MOE, MLP)


def parse_pattern(pattern: str) -> tuple[LayerSpec, ...]:
    """Nemotron-H pattern, one character a layer: "M-*E" -> mamba, MLP, attention, MoE layers."""
    layers = []
    for i, ch in enumerate(str(pattern)):
        if ch in MIXER_CHARS:
            layers.append(LayerSpec(mixers=(MIXER_CHARS[ch],)))
        elif ch in FFN_CHARS:
            layers.append(LayerSpec(ffn=FFN_CHARS[ch]))
        else:
            raise ValueError(
                f"pattern {pattern!r} has {ch!r} at position {i}: use M (mamba), * (attention), - (MLP), E (MoE), "
                "L (MLA), D (Gated DeltaNet)"
            )
    return tuple(layers)


def parse_layer_token(token: str) -> LayerSpec:
    """One layer from its characters: "*-" -> attention + MLP; mixers first (* before M), then at most one FFN."""
    mixers, ffn = [], None
    for ch in token:
        if ch in MIXER_CHARS and ffn is None and MIXER_CHARS[ch] not in mixers:
            mixers.append(MIXER_CHARS[ch])
        elif ch in FFN_CHARS and ffn is None:
            ffn = FFN_CHARS[ch]
        else:
            raise ValueError(
                f"layer token {token!r} is malformed at {ch!r}: write the mixers (*, L, M, D, each once) then at most one "
                "FFN (- or E), e.g. '*-' or 'ME' or '*M-'"
            )
    if not token:
        raise ValueError("empty layer token: give e.g. '*-' for an attention + MLP layer")
    return LayerSpec(mixers=tuple(sorted(mixers, key=MIXERS.index)), ffn=ffn)


def parse_layer_tokens(tokens: str | list) -> tuple[LayerSpec, ...]:
    """Layer tokens as a whitespace-separated string or a list: "M- ME *-" or ["M-", "ME", "*-"].

    List items may also be {"mixers": [...], "ffn": ...} mappings, as ModelSpec.to_dict() writes them.
    """
    items = str(tokens).split() if isinstance(tokens, str) else list(tokens)
    layers = []
    for item in items:
        if isinstance(item, dict):
            unknown = set(item) - {"mixers", "ffn"}
            if unknown:
                raise ValueError(f"layer {item!r} has unknown keys {sorted(unknown)}: use mixers and ffn")
            layers.append(LayerSpec(mixers=tuple(item.get("mixers") or ()), ffn=item.get("ffn")))
        else:
            layers.append(parse_layer_token(str(item)))
    return tuple(layers)


def layer_kinds(layer: LayerSpec) -> set[str]:
    """What a layer carries: its mixers and its FFN kind."""
    return set(layer.mixers) | ({layer.ffn} if layer.ffn else set())


def shorten_layers(layers: tuple[LayerSpec, ...], num_layers: int) -> tuple[LayerSpec, ...]:
    """The first `num_layers` layers, repaired so that the model's mix survives; the result keeps model order.

    Rule: 1. take the first N layers. 2. For each kind in the order attention, mamba, MoE, MLP that the full model has
    and the chosen layers lack, take the first layer of the full model that carries it, in place of the last chosen
    layer whose removal loses none of the kinds before it in that order. 3. A kind with no such place is left out
    (N too small). Example: Nemotron-H-8B "M-M-M-M*-..." with N=4 gives layers 0, 1, 2, 7 = "M-M*".
    """
    total = len(layers)
    if not 1 <= num_layers <= total:
        raise ValueError(f"--num-layers {num_layers} is out of range: give 1..{total} for this model")
    chosen = list(range(num_layers))
    for rank, kind in enumerate(KEEP_PRIORITY):
        if any(kind in layer_kinds(layers[i]) for i in chosen):
            continue
        source = next((i for i in range(total) if kind in layer_kinds(layers[i])), None)
        if source is None:
            continue
        protected = {k for k in KEEP_PRIORITY[:rank] if any(k in layer_kinds(layers[i]) for i in chosen)}
        for pos in reversed(range(len(chosen))):
            kept = set(layer_kinds(layers[source])).union(
                *(layer_kinds(layers[i]) for j, i in enumerate(chosen) if j != pos)
            )
            if protected <= kept:
                chosen[pos] = source
                chosen.sort()
                break
    return tuple(layers[i] for i in chosen)


def format_layers(layers: tuple[LayerSpec, ...] | list[LayerSpec]) -> str:
    """Layers in the preset notation, shortest first: a Nemotron-H pattern ("M-M*") when every layer holds one thing,
    else space-separated tokens ("M- ME *-"); a list that repeats one block prints as "(block) xK", tokens with a run of
    3 or more as runs joined by " + " ("L- x3 + LE x58")."""
    tokens = [layer.token for layer in layers]
    sep = token_separator(tokens)
    n = len(tokens)
    for period in range(1, n // 2 + 1):
        if n % period == 0 and tokens == tokens[:period] * (n // period):
            block = sep.join(tokens[:period])
            return f"{block} x{n // period}" if period == 1 and sep else f"({block}) x{n // period}"
    runs = run_lengths(tokens)
    if sep and any(count >= 3 for _, count in runs):  # DeepSeek-V3: "L- x3 + LE x58"
        return " + ".join(f"{token} x{count}" if count > 1 else token for token, count in runs)
    return sep.join(tokens)


def run_lengths(tokens: list[str]) -> list[tuple[str, int]]:
    """["a", "a", "b"] -> [("a", 2), ("b", 1)]."""
    out: list[tuple[str, int]] = []
    for token in tokens:
        if out and out[-1][0] == token:
            out[-1] = (token, out[-1][1] + 1)
        else:
            out.append((token, 1))
    return out

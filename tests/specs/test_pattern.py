"""Layer notations and the --num-layers rule that keeps a hybrid's mix."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ppprof.specs import load_spec, parse_layer_tokens, parse_pattern, shorten_layers
from ppprof.specs.pattern import KEEP_PRIORITY, format_layers, layer_kinds
from ppprof.specs.spec import ATTENTION, MAMBA, MLP, MOE, LayerSpec


def test_parse_pattern_and_tokens():
    assert parse_pattern("M*-E") == (
        LayerSpec(mixers=(MAMBA,)),
        LayerSpec(mixers=(ATTENTION,)),
        LayerSpec(ffn=MLP),
        LayerSpec(ffn=MOE),
    )
    assert parse_layer_tokens("*- ME M*-") == (
        LayerSpec(mixers=(ATTENTION,), ffn=MLP),
        LayerSpec(mixers=(MAMBA,), ffn=MOE),
        LayerSpec(mixers=(ATTENTION, MAMBA), ffn=MLP),
    )
    assert parse_layer_tokens(["*-", {"mixers": ["mamba"], "ffn": None}])[1] == LayerSpec(mixers=(MAMBA,))
    for bad in ("**", "-E", "M-*"):
        with pytest.raises(ValueError, match="malformed"):
            parse_layer_tokens(bad)


def test_format_layers_examples():
    assert format_layers(parse_pattern("M-M*-E")) == "M-M*-E"
    assert format_layers(parse_layer_tokens("*- *- *-")) == "*- x3"
    assert format_layers(parse_layer_tokens("M- ME M- ME")) == "(M- ME) x2"
    assert format_layers(parse_pattern("M-M-")) == "(M-) x2"
    assert format_layers(parse_layer_tokens("*M- M E")) == "*M- M E"


@pytest.mark.parametrize(
    "name,n,expected",
    [
        ("nemotron-h-8b", 8, "M-M-M-M*"),  # the prefix already mixes
        ("nemotron-h-8b", 4, "M-M*"),  # layer 3 (MLP) swapped for layer 7, the first attention
        ("nemotron-h-8b", 2, "M*"),  # attention first, then mamba
        ("tiny-hybrid", 3, "M*E"),
        ("jamba-mini", 4, "M- ME M- *-"),
        ("jamba-mini", 2, "ME *-"),
        ("llama3-8b", 2, "*- x2"),
    ],
)
def test_shorten_keeps_mix(name, n, expected):
    spec = load_spec(name, num_layers=n)
    assert spec.num_layers == n
    assert format_layers(spec.layers) == expected
    assert spec.extra["full_num_layers"] == load_spec(name).num_layers


def test_num_layers_out_of_range():
    for n in (0, 53):
        with pytest.raises(ValueError, match="--num-layers .* give 1..52"):
            load_spec("nemotron-h-8b", num_layers=n)


def test_num_layers_same_as_model_is_unchanged():
    assert load_spec("tiny-hybrid", num_layers=8) == load_spec("tiny-hybrid")


PATTERNS = st.text(alphabet="M*-E", min_size=1, max_size=24)


@given(PATTERNS, st.data())
def test_shorten_properties(pattern, data):
    layers = parse_pattern(pattern)
    n = data.draw(st.integers(1, len(layers)))
    short = shorten_layers(layers, n)
    assert len(short) == n
    # A subsequence of the model, in model order.
    it = iter(layers)
    assert all(any(x == y for y in it) for x in short), f"{pattern=} {n=}"
    full = set().union(*map(layer_kinds, layers))
    got = set().union(*map(layer_kinds, short))
    # The top-priority kinds the model has survive, as many as there are layers.
    wanted = [k for k in KEEP_PRIORITY if k in full][:n]
    assert set(wanted[: min(n, 2)]) <= got, f"{pattern=} {n=} {wanted=} {got=}"
    if n >= len(wanted):
        assert set(wanted) <= got, f"{pattern=} {n=}"

"""Presets and YAML specs: every preset loads with the documented shapes; lookup errors name the fix."""

from __future__ import annotations

import json

import pytest

from ppprof.specs import PRESETS_DIR, list_presets, load_spec, spec_from_dict
from ppprof.specs.pattern import format_layers, layer_kinds
from ppprof.specs.spec import ATTENTION, MAMBA, MLP, MOE, LayerSpec

PRESETS = ["jamba-mini", "llama3-8b", "nemotron-h-8b", "tiny-dense", "tiny-hybrid"]


def kinds(spec, layers=None):
    layers = spec.layers if layers is None else [spec.layers[i] for i in layers]
    return set().union(*(layer_kinds(layer) for layer in layers))


def test_presets_listed():
    assert set(PRESETS) <= set(list_presets()), f"{list_presets()=} {PRESETS_DIR=}"


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_by_name_and_path(name):
    spec = load_spec(name)
    assert spec.name == name
    assert spec.dtype is None
    by_path = load_spec(PRESETS_DIR / f"{name}.yaml")
    assert by_path.layers == spec.layers and by_path.hidden_size == spec.hidden_size


def test_llama3_8b_shapes():
    s = load_spec("llama3-8b")
    assert (
        s.family,
        s.num_layers,
        s.hidden_size,
        s.num_attention_heads,
        s.num_key_value_heads,
        s.head_dim,
        s.intermediate_size,
        s.vocab_size,
        s.rope_theta,
    ) == ("llama", 32, 4096, 32, 8, 128, 14336, 128256, 5e5)
    assert set(s.layers) == {LayerSpec(mixers=(ATTENTION,), ffn=MLP)}


def test_nemotron_h_8b_shapes():
    s = load_spec("nemotron-h-8b")
    assert format_layers(s.layers) == "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-"
    assert s.num_layers == 52
    assert sum(layer.has_attention for layer in s.layers) == 4
    assert sum(layer.has_mamba for layer in s.layers) == 24
    assert (
        s.mamba_num_heads,
        s.mamba_head_dim,
        s.ssm_state_size,
        s.mamba_n_groups,
        s.conv_kernel,
        s.intermediate_size,
        s.mlp_act,
    ) == (128, 64, 128, 8, 4, 21504, "relu2")


def test_jamba_mini_shapes():
    s = load_spec("jamba-mini")
    assert s.num_layers == 32
    attn = [i for i, layer in enumerate(s.layers) if layer.has_attention]
    moe = [i for i, layer in enumerate(s.layers) if layer.ffn == MOE]
    assert attn == list(range(4, 32, 8))
    assert moe == list(range(1, 32, 2))
    assert all(len(layer.mixers) == 1 and layer.ffn for layer in s.layers)
    assert (s.num_experts, s.num_experts_per_tok, s.moe_intermediate_size) == (16, 2, 14336)
    assert s.mamba_d_inner == 2 * s.hidden_size


def test_tiny_hybrid_two_stages_both_hybrid():
    s = load_spec("tiny-hybrid")
    assert {ATTENTION, MAMBA, MLP, MOE} <= kinds(s)
    assert sum(layer.ffn == MOE for layer in s.layers) == 1
    half = s.num_layers // 2
    for stage in (range(0, half), range(half, s.num_layers)):
        assert {ATTENTION, MAMBA} <= kinds(s, stage), f"{stage=}"


def test_tiny_presets_are_tiny():
    for name in ("tiny-dense", "tiny-hybrid"):
        s = load_spec(name)
        assert s.hidden_size <= 128 and s.num_layers <= 8, f"{name=}"


def test_unknown_preset_lists_available():
    with pytest.raises(ValueError) as e:
        load_spec("no-such-model")
    msg = str(e.value)
    assert "no-such-model" in msg and "tiny-hybrid" in msg and "llama3-8b" in msg
    assert "\n" not in msg


def test_missing_file_is_an_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_spec(tmp_path / "nope.yaml")


def test_dtype_override_and_validation():
    assert load_spec("tiny-dense", dtype="bf16").dtype == "bfloat16"
    assert load_spec("tiny-dense", dtype="float32").dtype == "float32"
    with pytest.raises(ValueError, match="float32, bfloat16, float16"):
        load_spec("tiny-dense", dtype="int8")


def test_yaml_layout_tokens_repeat_and_errors(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text(
        "family: falcon_h1\nlayers: '*M-'\nrepeat: 3\nhidden_size: 32\nintermediate_size: 64\n"
        "num_attention_heads: 2\nnum_key_value_heads: 1\nhead_dim: 16\nmamba_num_heads: 2\n"
        "mamba_head_dim: 16\nssm_state_size: 8\ndtype: fp16\n"
    )
    s = load_spec(path)
    assert s.name == "m" and s.dtype == "float16"
    assert s.layers == (LayerSpec(mixers=(ATTENTION, MAMBA), ffn=MLP),) * 3
    for bad, match in [
        ("family: llama\nhidden_size: 8\n", "exactly one of"),
        ("family: llama\npattern: '*-'\nlayers: '*-'\nhidden_size: 8\n", "exactly one of"),
        ("family: llama\npattern: '*X'\nhidden_size: 8\n", "'X' at position 1"),
        ("family: llama\nlayers: '-*'\nhidden_size: 8\n", "malformed"),
        ("family: llama\npattern: '-'\nhidden_size: 8\nbogus: 1\n", "unknown fields \\['bogus'\\]"),
        ("family: llama\npattern: '-'\nhidden_size: 8\n", "intermediate_size=0"),
        ("pattern: '-'\nhidden_size: 8\n", "missing `family`"),
        ("family: llama\npattern: '-'\nrepeat: 0\nhidden_size: 8\n", "repeat=0"),
        (
            "family: llama\npattern: '-'\nhidden_size: 8\nintermediate_size: 8\nmlp_act: gelu\n",
            "mlp_act='gelu' is unknown: use one of silu, relu2",
        ),
        ("[1, 2", "not valid YAML"),
    ]:
        path.write_text(bad)
        with pytest.raises(ValueError, match=match):
            load_spec(path)


def test_to_dict_round_trip(tmp_path):
    s = load_spec("tiny-hybrid", dtype="bf16")
    again = spec_from_dict(s.to_dict(), name="x")
    assert again.layers == s.layers and again.dtype == "bfloat16" and again.name == s.name
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(s.to_dict()))
    assert load_spec(path).layers == s.layers


def test_mlp_act_round_trip(tmp_path):
    """mlp_act survives to_dict -> spec_from_dict and a JSON file; a spec without it reads as silu."""
    s = load_spec("nemotron-h-8b", num_layers=4)
    assert s.to_dict()["mlp_act"] == "relu2"
    assert spec_from_dict(s.to_dict(), name="x").mlp_act == "relu2"
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(s.to_dict()))
    assert load_spec(path).mlp_act == "relu2"
    assert load_spec("llama3-8b").mlp_act == "silu"


def test_reads_model_json_output(tmp_path):
    from ppprof.specs.accounting import describe

    s = load_spec("jamba-mini", num_layers=8)
    path = tmp_path / "described.json"
    path.write_text(json.dumps(describe(s, 2)))
    again = load_spec(path)
    assert again.layers == s.layers and again.extra == s.extra

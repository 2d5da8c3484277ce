"""Resolve a model argument (preset name, YAML file, HF config.json or a folder holding one) into a ModelSpec.

Presets are the YAML files in <repository>/configs/models/, found relative to this source file in a source checkout
and under `pip install -e .`; a non-editable install ships the same files as the package data ppprof/presets/.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import yaml

from ppprof.checks import is_int, short
from ppprof.io import parse_json, parse_yaml, read_small_text
from ppprof.specs.dtypes import normalize_dtype
from ppprof.specs.hf import spec_from_hf_config
from ppprof.specs.pattern import parse_layer_tokens, parse_pattern, shorten_layers
from ppprof.specs.spec import MAX_LAYERS, ModelSpec


def _presets_dir() -> Path:
    source = Path(__file__).resolve().parents[2] / "configs" / "models"
    return source if source.is_dir() else Path(__file__).resolve().parents[1] / "presets"


PRESETS_DIR = _presets_dir()
PRESET_SUFFIX = ".yaml"
HF_CONFIG_NAME = "config.json"
# Keys of the YAML layout that are not ModelSpec fields.
LAYOUT_KEYS = ("pattern", "layers", "repeat")
# Keys `ppprof model --json` adds to ModelSpec.to_dict().
DERIVED_KEYS = (
    "num_layers",
    "num_params",
    "num_active_params",
    "num_mtp_params",
    "layout",
    "accounting_dtype",
    "stages",
)
SPEC_FIELDS = tuple(f.name for f in dataclasses.fields(ModelSpec))


def list_presets(presets_dir: Path = PRESETS_DIR) -> list[str]:
    """Names of the presets, sorted."""
    if not presets_dir.is_dir():
        return []
    return sorted(p.name[: -len(PRESET_SUFFIX)] for p in presets_dir.glob(f"*{PRESET_SUFFIX}"))


def preset_path(name: str, presets_dir: Path = PRESETS_DIR) -> Path:
    """The YAML file of preset `name`; ValueError listing the presets if there is none."""
    path = presets_dir / f"{name}{PRESET_SUFFIX}"
    if not path.is_file():
        available = ", ".join(list_presets(presets_dir)) or f"none (no {PRESET_SUFFIX} files in {presets_dir})"
        raise ValueError(f"unknown model preset {name!r}: use one of {available}, a YAML file or a HF config.json")
    return path


def spec_from_dict(data: dict, *, name: str) -> ModelSpec:
    """A ModelSpec from the YAML layout: ModelSpec fields plus the layers as exactly one of
    `pattern` (Nemotron-H style, one character a layer) or `layers` (one token a layer, see ppprof.specs.pattern),
    optionally repeated `repeat` times. Also reads ModelSpec.to_dict() and `ppprof model --json` output."""
    if not isinstance(data, dict):
        raise ValueError(f"{name}: a model spec must be a mapping of fields, got {type(data).__name__}")
    data = dict(data)
    if isinstance(data.get("layers"), list) and data["layers"] and all(isinstance(x, dict) for x in data["layers"]):
        # to_dict() or `ppprof model --json` output: drop what is derived from the fields.
        for key in ("pattern", *DERIVED_KEYS):
            data.pop(key, None)
    unknown = sorted(set(data) - set(SPEC_FIELDS) - set(LAYOUT_KEYS))
    if unknown:
        raise ValueError(f"{name}: unknown fields {unknown}: use ModelSpec fields or pattern/layers/repeat")
    has_pattern, has_layers = data.get("pattern") is not None, data.get("layers") is not None
    if has_pattern == has_layers:
        raise ValueError(f"{name}: give exactly one of `pattern` (e.g. 'M-*-') or `layers` (e.g. '*- *-')")
    pattern, tokens = data.pop("pattern", None), data.pop("layers", None)
    if has_pattern and not isinstance(pattern, str):
        raise ValueError(f"{name}: pattern={short(pattern)} must be a string of layer characters, e.g. 'M-*-'")
    if has_layers and not isinstance(tokens, (str, list)):
        raise ValueError(f"{name}: layers={short(tokens)} must be layer tokens, e.g. '*- *-' or ['*-', '*-']")
    layers = parse_pattern(pattern) if has_pattern else parse_layer_tokens(tokens)
    repeat = data.pop("repeat", 1)
    if not is_int(repeat) or not 1 <= repeat <= MAX_LAYERS:
        raise ValueError(f"{name}: repeat={short(repeat)} must be an integer in 1..{MAX_LAYERS}")
    if len(layers) * repeat > MAX_LAYERS:
        raise ValueError(f"{name}: {len(layers)} layers x repeat {repeat} exceeds {MAX_LAYERS} layers: lower repeat")
    data.setdefault("name", name)
    if "family" not in data:
        raise ValueError(f"{name}: missing `family`: give one, e.g. llama or nemotron_h")
    data["dtype"] = normalize_dtype(data.get("dtype"))
    if not isinstance(data.get("extra") or {}, dict):
        raise ValueError(f"{name}: extra={short(data['extra'])} must be a mapping")
    data["extra"] = dict(data.get("extra") or {})
    try:
        return ModelSpec(layers=layers * repeat, **data)
    except TypeError as e:  # a field of the wrong shape, e.g. a list where a number goes
        raise ValueError(f"{name}: {e}") from None


def read_spec_file(path: Path, *, name: str | None = None) -> ModelSpec:
    """A YAML spec file, a HF config.json (any .json with model_type or architectures), or a folder holding one."""
    path = Path(path)
    if path.is_dir():
        if not (path / HF_CONFIG_NAME).is_file():
            raise ValueError(f"folder {path} holds no {HF_CONFIG_NAME}: give a HF model folder or a config file")
        path = path / HF_CONFIG_NAME
    label = name or str(path)
    fix = "give a YAML spec or a HF config.json"
    text = read_small_text(path, "model file", fix)
    if path.suffix == ".json":
        try:
            data = parse_json(text, f"model file {path}")
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e.msg} at line {e.lineno}): fix the file") from None
        if isinstance(data, dict) and "family" in data and "layers" in data and "model_type" not in data:
            return spec_from_dict(data, name=data.get("name") or label)
        return spec_from_hf_config(data, name=label)
    try:
        data = parse_yaml(text, f"model file {path}")
    except yaml.YAMLError as e:
        raise ValueError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from None
    return spec_from_dict(data, name=name or path.stem)


def load_spec(name_or_path: str | Path, *, num_layers: int | None = None, dtype: str | None = None) -> ModelSpec:
    """Resolve a preset name, a YAML file, a HF config.json or a folder holding one into a ModelSpec.

    num_layers: keep the first N layers, repaired to keep the model's mix (see ppprof.specs.pattern.shorten_layers).
    dtype: float32 | bfloat16 | float16 (aliases fp32, bf16, fp16); None keeps the spec's (None: bf16 on GPU, fp32
    on CPU, chosen at run time).
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    if path.exists():
        spec = read_spec_file(path)
    elif "/" in text or path.suffix in (".yaml", ".yml", ".json"):
        raise ValueError(f"model file {text} does not exist: give an existing path or a preset name")
    else:
        spec = read_spec_file(preset_path(text), name=text)
    changes = {}
    if num_layers is not None and num_layers != spec.num_layers:
        changes["layers"] = shorten_layers(spec.layers, int(num_layers))
        changes["extra"] = {**spec.extra, "full_num_layers": spec.num_layers, "full_pattern": spec.pattern}
    if dtype is not None:
        changes["dtype"] = normalize_dtype(dtype)
    return dataclasses.replace(spec, **changes) if changes else spec

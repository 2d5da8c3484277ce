"""Model specs: presets (configs/models/*.yaml), YAML and HuggingFace config.json loading, and per-stage accounting.

Owns turning a model argument into a validated ModelSpec (spec.py), splitting its layers over stages (partition.py),
and what each stage needs in memory (memory.py).
"""

from ppprof.specs.accounting import (
    PARAM_KEYS,
    StageAccount,
    accounting_dtype,
    kv_bytes_per_token,
    layer_params,
    mamba_bytes_per_slot,
    stage_accounts,
    stage_params,
    stage_weight_bytes,
)
from ppprof.specs.dtypes import DTYPE_BYTES, dtype_bytes, normalize_dtype
from ppprof.specs.hf import SUPPORTED_MODEL_TYPES, spec_from_hf_config
from ppprof.specs.load import PRESETS_DIR, list_presets, load_spec, preset_path, read_spec_file, spec_from_dict
from ppprof.specs.memory import StageMemory, stage_memory
from ppprof.specs.partition import parse_partition, split_layers
from ppprof.specs.pattern import parse_layer_tokens, parse_pattern, shorten_layers
from ppprof.specs.spec import LayerSpec, ModelSpec

__all__ = [
    "DTYPE_BYTES",
    "LayerSpec",
    "ModelSpec",
    "PARAM_KEYS",
    "PRESETS_DIR",
    "SUPPORTED_MODEL_TYPES",
    "StageAccount",
    "StageMemory",
    "accounting_dtype",
    "dtype_bytes",
    "kv_bytes_per_token",
    "layer_params",
    "list_presets",
    "load_spec",
    "mamba_bytes_per_slot",
    "normalize_dtype",
    "parse_layer_tokens",
    "parse_partition",
    "parse_pattern",
    "preset_path",
    "read_spec_file",
    "shorten_layers",
    "spec_from_dict",
    "spec_from_hf_config",
    "split_layers",
    "stage_accounts",
    "stage_memory",
    "stage_params",
    "stage_weight_bytes",
]

"""Dtype names ppprof accepts for weights and caches, and their sizes; no torch needed."""

from __future__ import annotations

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DTYPE_ALIASES = {"fp32": "float32", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
SSM_STATE_BYTES = 4
"""The SSM state is kept in fp32 whatever the weight dtype (as servers do: mamba_ssm_cache_dtype float32)."""
INDEX_BYTES = 8
"""Indices are int64: the request table's entries, a MoE router's choices."""
AUTO_DTYPE_GPU = "bfloat16"
AUTO_DTYPE_CPU = "float32"


def normalize_dtype(name: str | None) -> str | None:
    """'bf16' -> 'bfloat16'; None stays None (bf16 on GPU, fp32 on CPU, chosen at run time)."""
    if name is None:
        return None
    key = str(name).strip().lower().removeprefix("torch.")
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPE_BYTES:
        raise ValueError(f"dtype {name!r} is not supported: use one of {', '.join(DTYPE_BYTES)}")
    return key


def dtype_bytes(name: str) -> int:
    """Bytes per element of a dtype name (aliases allowed)."""
    return DTYPE_BYTES[normalize_dtype(name)]

"""Which attention backend and which Mamba kernels a stage will run, as ppprof.model picks them, without importing
torch: whether flashinfer, mamba_ssm and causal_conv1d are installed here."""

from __future__ import annotations

import importlib.util

from ppprof.bounds import ATTENTION_BACKENDS

MAMBA_TORCH = "torch SSD"
MAMBA_FUSED = "mamba_ssm fused"


def resolve_backend(name: str, device: str) -> str:
    """`auto` as ppprof.model.attention_kernels.resolve_attention_backend resolves it, without importing torch:
    flashinfer on CUDA when the package is installed here, else sdpa."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"--attention-backend {name!r} is unknown: use one of {', '.join(ATTENTION_BACKENDS)}")
    if name == "auto":
        return "flashinfer" if device == "cuda" and importlib.util.find_spec("flashinfer") else "sdpa"
    if name == "flashinfer" and device != "cuda":
        raise ValueError("--attention-backend flashinfer runs on CUDA only: use sdpa (or auto) with --device cpu")
    return name


def mamba_kernel(device: str) -> str:
    """The fused kernels on CUDA when mamba_ssm and causal_conv1d are installed here (as ppprof.model.mamba picks)."""
    fused = device == "cuda" and all(importlib.util.find_spec(m) for m in ("mamba_ssm", "causal_conv1d"))
    return MAMBA_FUSED if fused else MAMBA_TORCH

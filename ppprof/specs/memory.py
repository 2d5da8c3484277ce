"""What one pipeline stage needs in memory before any rank starts: its weights (and, on CPU, the draws that initialise
them), its KV / Mamba / request pools as ppprof allocates them, and the activation peak of the largest probe request
(the model: ppprof.specs.activation). No torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ppprof.bounds import DEVICES
from ppprof.checks import require_int
from ppprof.specs.accounting import FP32_BYTES, kv_bytes_per_token, mamba_bytes_per_slot, stage_weight_bytes
from ppprof.specs.activation import ChunkRun, activation_peak
from ppprof.specs.backends import MAMBA_FUSED, MAMBA_TORCH, mamba_kernel, resolve_backend
from ppprof.specs.dtypes import AUTO_DTYPE_CPU, AUTO_DTYPE_GPU, INDEX_BYTES, dtype_bytes, normalize_dtype
from ppprof.specs.layer import MOE
from ppprof.specs.spec import ModelSpec

__all__ = [
    "INIT_DRAW_BYTES",
    "MAMBA_FUSED",
    "MAMBA_TORCH",
    "PARTS",
    "CacheSizes",
    "PeakRequest",
    "StageMemory",
    "check_stage_request",
    "format_bytes",
    "kv_pool_bytes",
    "largest_parameter",
    "mamba_kernel",
    "mamba_pool_bytes",
    "resolve_backend",
    "stage_memory",
]
PARTS = ("weights", "kv_pool", "mamba_pool", "request_table", "activation_peak")
INIT_DRAW_BYTES = 2 * FP32_BYTES
"""Stage._init_weights draws each parameter as (torch.randn(shape) * std): two fp32 tensors of its size at once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheSizes:
    """The sizes a stage's cache is built with (ppprof.model.stage.build_stage_cache) and its memory counted with
    (stage_memory): its pools and the context (ProfileConfig.cache_sizes)."""

    max_total_tokens: int
    page_size: int
    """KV cache slots per stage, and the page they come in."""
    max_mamba_cache_size: int
    max_running_requests: int
    context_len: int
    """Mamba state slots, request entries, and each entry's context (its row of the request table)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PeakRequest:
    """The largest probe request a stage runs (a `chunk_size` chunk after `prefix_len` cached tokens) and how it runs:
    `dtype` None means the spec's, else bf16 on CUDA and fp32 on CPU (as ppprof.run.rank.resolve_dtype resolves
    it)."""

    chunk_size: int
    prefix_len: int
    """The chunk, and the cached tokens before it (ProfileConfig.max_probe_chunk_size, max(resolved_prefix_lens()))."""
    dtype: str | None = None
    attention_backend: str = "auto"
    device: str = "cpu"
    """The pipeline dtype, the attention backend (`auto` resolved on `device`) and the device."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StageMemory:
    """Bytes one stage needs: weights, pools, and the activation peak of the largest probe request."""

    stage_idx: int
    layers: range
    weights: int
    kv_pool: int
    mamba_pool: int
    request_table: int
    activation_peak: int
    weights_init: int = 0
    """Bytes on top of the weights while they are drawn at start, before the pools exist: the random draws of the
    largest parameter (INIT_DRAW_BYTES a value). On CPU only: on CUDA they are drawn on the host."""
    chunk_size: int
    prefix_len: int
    dtype: str
    device: str
    attention_backend: str
    """The backend after `auto` is resolved."""
    mamba_kernel: str | None
    """MAMBA_TORCH or MAMBA_FUSED; None on a stage without Mamba layers."""
    activation_layer: int
    """The layer whose peak wins."""
    activation_terms: dict = field(default_factory=dict)
    """The named terms of activation_peak: held, the winning part of the winning layer, the prefix's noise, ..."""

    @property
    def running(self) -> int:
        """Weights, pools and the activation peak: what the stage holds during its largest forward."""
        return self.weights + self.kv_pool + self.mamba_pool + self.request_table + self.activation_peak

    @property
    def total(self) -> int:
        """The stage's peak: while it runs, or while its weights are drawn if that is more."""
        return max(self.running, self.weights + self.weights_init)

    def to_dict(self) -> dict:
        return {
            "stage_idx": self.stage_idx,
            "layer_start": self.layers.start,
            "layer_stop": self.layers.stop,
            **{part: getattr(self, part) for part in PARTS},
            "weights_init": self.weights_init,
            "running": self.running,
            "total": self.total,
            "chunk_size": self.chunk_size,
            "prefix_len": self.prefix_len,
            "dtype": self.dtype,
            "device": self.device,
            "attention_backend": self.attention_backend,
            "mamba_kernel": self.mamba_kernel,
            "activation_layer": self.activation_layer,
            "activation_terms": dict(self.activation_terms),
        }


def format_bytes(n: int) -> str:
    """1536 -> '1.5 KiB'; binary units up to TiB."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def largest_parameter(spec: ModelSpec, layers: range) -> int:
    """Values of the stage's largest parameter tensor, as ppprof.model registers them: the embedding and LM head
    (vocab x hidden), fused qkv, Mamba's in_proj, the MLP's fused gate+up, and each MoE's experts stacked in one."""
    h, out = spec.hidden_size, []
    if layers.start == 0 or layers.stop == spec.num_layers:
        out.append(spec.vocab_size * h)
    for layer in (spec.layers[i] for i in layers):
        if layer.has_attention:
            q_heads = spec.num_attention_heads * (2 if spec.attn_output_gate else 1)
            out.append(h * (q_heads + 2 * spec.num_key_value_heads) * spec.head_dim)
        if layer.has_mla:
            heads = spec.num_attention_heads
            out += [
                max(h, spec.q_lora_rank) * heads * spec.qk_head_dim,
                h * spec.mla_latent_dim,
                spec.kv_lora_rank * heads * (spec.qk_nope_head_dim + spec.v_head_dim),
                heads * spec.v_head_dim * h,
            ]
        if layer.has_deltanet:
            out.append(h * (2 * spec.deltanet_key_dim + 2 * spec.deltanet_value_dim))
        if layer.has_mamba:
            out.append(h * (spec.mamba_d_inner + spec.mamba_conv_dim + spec.mamba_num_heads))
        inner_width = 2 if spec.mlp_gated else 1
        if layer.ffn == MOE:
            out.append(spec.num_experts * inner_width * spec.moe_intermediate_size * h)
        elif layer.ffn:
            out.append(inner_width * spec.intermediate_size * h)
    return max(out, default=h)


def kv_pool_bytes(spec: ModelSpec, layers: range, *, dtype: str, max_total_tokens: int, page_size: int) -> int:
    """K and V of every slot of the stage's attention layers, as build_stage_cache allocates them: max_total_tokens
    / page_size pages and the reserved page 0. (The allocators' host-side numpy arrays, about 33 bytes a KV slot,
    are left out.)"""
    if max_total_tokens < page_size or max_total_tokens % page_size:
        raise ValueError(
            f"--max-total-tokens {max_total_tokens} must be a positive multiple of --page-size {page_size}"
        )
    total_slots = (max_total_tokens // page_size + 1) * page_size
    return total_slots * kv_bytes_per_token(spec, layers, dtype=dtype)


def mamba_pool_bytes(spec: ModelSpec, layers: range, *, dtype: str, max_mamba_cache_size: int) -> int:
    """Conv (pipeline dtype) and SSM (fp32) state of max_mamba_cache_size + 1 slots (slot 0 reserved) of the stage's
    Mamba layers."""
    return (max_mamba_cache_size + 1) * mamba_bytes_per_slot(spec, layers, dtype=dtype)


def stage_memory(
    spec: ModelSpec, layer_ids: range, sizes: CacheSizes, request: PeakRequest, stage_idx: int = 0
) -> StageMemory:
    """What the stage holding `layer_ids` needs, its pools of `sizes`, for a profile whose largest probe request is
    `request`."""
    max_total_tokens, page_size = sizes.max_total_tokens, sizes.page_size
    chunk_size, prefix_len, device = request.chunk_size, request.prefix_len, request.device
    check_stage_request(
        spec,
        layer_ids,
        device,
        (
            ("--max-total-tokens", max_total_tokens, 1),
            ("--page-size", page_size, 1),
            ("--max-mamba-cache-size", sizes.max_mamba_cache_size, 1),
            ("--max-running-requests", sizes.max_running_requests, 1),
            ("--context-len", sizes.context_len, 1),
            ("chunk_size", chunk_size, 1),
            ("prefix_len", prefix_len, 0),
        ),
    )
    dtype = normalize_dtype(request.dtype) or spec.dtype or (AUTO_DTYPE_GPU if device == "cuda" else AUTO_DTYPE_CPU)
    b = dtype_bytes(dtype)
    backend = resolve_backend(request.attention_backend, device)
    has_mamba = any(spec.layers[i].has_mamba for i in layer_ids)
    kernel = mamba_kernel(device)
    peak, layer, terms = activation_peak(spec, layer_ids, ChunkRun(chunk_size, prefix_len, b, backend, device, kernel))
    return StageMemory(
        stage_idx=stage_idx,
        layers=layer_ids,
        weights=stage_weight_bytes(spec, layer_ids, dtype=dtype),
        kv_pool=kv_pool_bytes(spec, layer_ids, dtype=dtype, max_total_tokens=max_total_tokens, page_size=page_size),
        mamba_pool=mamba_pool_bytes(spec, layer_ids, dtype=dtype, max_mamba_cache_size=sizes.max_mamba_cache_size),
        request_table=sizes.max_running_requests * sizes.context_len * INDEX_BYTES,
        activation_peak=peak,
        weights_init=INIT_DRAW_BYTES * largest_parameter(spec, layer_ids) if device == "cpu" else 0,
        chunk_size=chunk_size,
        prefix_len=prefix_len,
        dtype=dtype,
        device=device,
        attention_backend=backend,
        mamba_kernel=kernel if has_mamba else None,
        activation_layer=layer,
        activation_terms=terms,
    )


def check_stage_request(spec: ModelSpec, layer_ids: range, device: str, counts) -> None:
    """stage_memory's arguments: each (label, value, lowest) of `counts` an integer from its lowest, a known device, and
    layer_ids a non-empty contiguous range of the model's layers."""
    for label, value, low in counts:
        require_int(label, value, low)
    if device not in DEVICES:
        raise ValueError(f"--device {device!r} is not supported: use cpu or cuda")
    if len(layer_ids) == 0 or layer_ids.step != 1 or layer_ids.start < 0 or layer_ids.stop > spec.num_layers:
        raise ValueError(
            f"layer_ids {layer_ids} must be a non-empty contiguous range inside [0, {spec.num_layers}): "
            "use a range from ppprof.specs.partition.split_layers"
        )

"""Attention of one prefill chunk over its request's prefix + chunk, K/V read from the paged pool: the backends a
profile can time, and which one `auto` picks.

- `sdpa`: 4-D q (1, heads, n, d) against K/V (1, kv_heads, L + n, d) gathered from the pool, GQA without repeating
  K/V, and the chunk's causal-with-prefix structure (query i sees keys 0..L+i: causal aligned to the lower right)
  without any dense mask. On CUDA that is SDPA with torch's lower-right CausalBias, which runs the flash or the
  memory-efficient kernel. On CPU torch's CausalBias would fall back to a dense mask, and the CPU flash kernel's own
  causal flag is aligned to the upper left, so the prefix part (no mask) and the chunk part (causal, square) run as
  two flash calls whose results are merged exactly by their log-sum-exp, as FlashAttention merges its blocks.
- `flashinfer`: FlashInfer's paged prefill straight from the KV pages (as SGLang runs it), on CUDA when the package
  is importable.
- `reference`: the oracle: 3-D SDPA with a dense boolean mask (n x group, L + n); slow, kept for the tests.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from ppprof.bounds import ATTENTION_BACKENDS

CPU_FLASH = "cpu-flash (prefix and chunk parts merged by log-sum-exp)"
FLASHINFER_WORKSPACE_BYTES = 128 * 2**20


def flashinfer_available() -> bool:
    return importlib.util.find_spec("flashinfer") is not None


def resolve_attention_backend(name: str, device_type: str) -> str:
    """The backend that `name` means on `device_type`; ValueError (naming the flag and the fix) when it cannot run."""
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"--attention-backend {name!r} is unknown: use one of {', '.join(ATTENTION_BACKENDS)}")
    if name == "auto":
        return "flashinfer" if device_type == "cuda" and flashinfer_available() else "sdpa"
    if name == "flashinfer":
        if device_type != "cuda":
            raise ValueError("--attention-backend flashinfer runs on CUDA only: use sdpa (or auto) with --device cpu")
        if not flashinfer_available():
            raise ValueError(
                "--attention-backend flashinfer: the flashinfer package is not importable; install "
                "ppprof[gpu] (flashinfer-python) or use --attention-backend sdpa"
            )
    return name


def gather_kv(k_buf: torch.Tensor, v_buf: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """K/V of the request's positions from the pool. k_buf, v_buf: (total_slots, kv_heads, d); slots: (L + n,) ->
    k, v: (1, kv_heads, L + n, d)."""
    k = k_buf.index_select(0, slots).transpose(0, 1)[None]
    v = v_buf.index_select(0, slots).transpose(0, 1)[None]
    return k, v


def _check_slots(q: torch.Tensor, slots: torch.Tensor, prefix_len: int) -> None:
    if slots.numel() != prefix_len + q.shape[0]:
        raise ValueError(f"slots has {slots.numel()} entries but prefix_len + n is {prefix_len + q.shape[0]}")


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor) -> torch.Tensor:
    """Exact softmax attention over the union of two key sets from each set's output and log-sum-exp.
    out: (1, heads, n, d); lse: (1, heads, n) fp32. The weight of each part is its share of the total exp-sum."""
    return merge_attention_lse(out_a, lse_a, out_b, lse_b)[0]


def merge_attention_lse(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """merge_attention, and the log-sum-exp of the union (1, heads, n) fp32, so that more parts can be merged in."""
    m = torch.maximum(lse_a, lse_b)
    w_a, w_b = torch.exp(lse_a - m)[..., None], torch.exp(lse_b - m)[..., None]  # (1, heads, n, 1)
    total = w_a + w_b
    out = ((out_a.float() * w_a + out_b.float() * w_b) / total).to(out_a.dtype)
    return out, m + total[..., 0].log()


def attention_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """One attention call that also gives its log-sum-exp, to be merged (merge_attention_lse). q: (1, heads, n, d);
    k, v: (1, kv_heads, t, d), t == n where `causal` (square) -> (1, heads, n, d), lse (1, heads, n) fp32. CPU: the
    flash kernel; CUDA: the memory-efficient kernel (its log-sum-exp is padded past n), the KV heads repeated."""
    if q.device.type == "cuda":
        if k.shape[1] != q.shape[1]:  # the kernel takes no GQA: each query head its own K/V
            k, v = (x.expand(-1, q.shape[1], -1, -1).contiguous() for x in (k, v))
        efficient = torch.ops.aten._scaled_dot_product_efficient_attention
        out, lse, _, _ = efficient(q, k, v, None, True, 0.0, causal, scale=scale)
        return out, lse[..., : q.shape[2]].float()
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out, lse = flash(q, k, v, 0.0, causal, scale=scale)
    return out, lse


def cpu_prefix_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int, scale: float | None = None
) -> torch.Tensor:
    """q: (1, heads, n, d); k, v: (1, kv_heads, L + n, d) -> (1, heads, n, d), with CPU flash calls only."""
    out, lse = attention_lse(
        q, k[:, :, prefix_len:], v[:, :, prefix_len:], causal=True, scale=scale
    )  # chunk: causal, square
    if prefix_len == 0:
        return out
    out_prefix, lse_prefix = attention_lse(q, k[:, :, :prefix_len], v[:, :, :prefix_len], causal=False, scale=scale)
    return merge_attention(out_prefix, lse_prefix, out, lse)


def cuda_sdpa_kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """The kernel torch's lower-right CausalBias dispatch picks for these inputs: flash, efficient, or math (a dense
    mask: what the fast path exists to avoid)."""
    from torch.backends.cuda import SDPAParams, can_use_efficient_attention, can_use_flash_attention

    params = SDPAParams(q, k, v, None, 0.0, False, True)
    if can_use_flash_attention(params):
        return "flash"
    return "efficient" if can_use_efficient_attention(params) else "math (dense mask)"


def sdpa_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    slots: torch.Tensor,
    prefix_len: int,
    scale: float | None = None,
) -> tuple[torch.Tensor, str]:
    """The fast path. q: (n, heads, d) for positions [L, L + n); k_buf, v_buf: (total_slots, kv_heads, d);
    slots: (L + n,). Returns (n, heads, d) and the name of the kernel that ran."""
    _check_slots(q, slots, prefix_len)
    q4 = q.transpose(0, 1)[None]  # (1, heads, n, d)
    k, v = gather_kv(k_buf, v_buf, slots)  # (1, kv_heads, L + n, d) each
    out, kernel = dense_prefix_attention(q4, k, v, prefix_len, scale)
    return out[0].transpose(0, 1), kernel  # (n, heads, d)


def dense_prefix_attention(
    q4: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prefix_len: int, scale: float | None = None
) -> tuple[torch.Tensor, str]:
    """A chunk's queries over its prefix + chunk keys, already gathered. q4: (1, heads, n, d); k: (1, kv_heads,
    L + n, d); v: (1, kv_heads, L + n, dv) with dv <= d (a narrower V is zero-padded to d for the flash kernels, as
    vLLM does for MLA's prefill, and the padding cut from the output) -> (1, heads, n, dv), the kernel's name."""
    n, d, dv = q4.shape[2], q4.shape[3], v.shape[3]
    if dv < d:
        v = F.pad(v, (0, d - dv))
    if q4.device.type == "cuda":
        from torch.nn.attention.bias import causal_lower_right

        kernel = cuda_sdpa_kernel(q4, k, v)
        if prefix_len == 0:
            out = F.scaled_dot_product_attention(q4, k, v, is_causal=True, scale=scale, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(
                q4, k, v, attn_mask=causal_lower_right(n, prefix_len + n), scale=scale, enable_gqa=True
            )
    else:
        kernel = CPU_FLASH
        out = cpu_prefix_attention(q4, k, v, prefix_len, scale)
    return out[..., :dv], kernel


def prefix_causal_mask(chunk_size: int, prefix_len: int, device: torch.device) -> torch.Tensor:
    """Boolean mask (chunk_size, prefix_len + chunk_size), True where a query may attend: new token i sits at
    position prefix_len + i and sees every key at positions <= prefix_len + i (the whole prefix, causal in the chunk)."""
    total = prefix_len + chunk_size
    return torch.ones(chunk_size, total, dtype=torch.bool, device=device).tril(diagonal=prefix_len)


def reference_attention(
    q: torch.Tensor,
    k_buf: torch.Tensor,
    v_buf: torch.Tensor,
    slots: torch.Tensor,
    prefix_len: int,
    scale: float | None = None,
) -> tuple[torch.Tensor, str]:
    """The oracle: 3-D SDPA, the query heads sharing a KV head stacked along the query axis, a dense mask tiled to
    match (so SDPA runs its math path). Same arguments and result as sdpa_attention."""
    _check_slots(q, slots, prefix_len)
    n, num_heads, head_dim = q.shape
    num_kv_heads = k_buf.shape[1]
    group = num_heads // num_kv_heads
    k = k_buf.index_select(0, slots).transpose(0, 1)  # (num_kv_heads, total, head_dim)
    v = v_buf.index_select(0, slots).transpose(0, 1)  # (num_kv_heads, total, head_dim)
    q = q.view(n, num_kv_heads, group, head_dim).permute(1, 2, 0, 3).reshape(num_kv_heads, group * n, head_dim)
    mask = prefix_causal_mask(n, prefix_len, q.device).repeat(group, 1)  # (group * n, total)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)  # (num_kv_heads, group * n, head_dim)
    out = out.view(num_kv_heads, group, n, head_dim).permute(2, 0, 1, 3)  # (n, num_kv_heads, group, head_dim)
    return out.reshape(n, num_heads, head_dim), "math (dense mask)"


class FlashInferAttention:
    """FlashInfer's paged prefill (flashinfer >= 0.2: plan / run), reading K/V straight from the pool's pages.
    One plan per chunk serves every attention layer of the stage (they share the request's pages)."""

    def __init__(self, device: torch.device) -> None:
        import flashinfer

        workspace = torch.empty(FLASHINFER_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(workspace, kv_layout="NHD")
        self._planned = None

    def __call__(
        self,
        q: torch.Tensor,
        k_buf: torch.Tensor,
        v_buf: torch.Tensor,
        slots: torch.Tensor,
        prefix_len: int,
        page_size: int,
        chunk_id: tuple,
    ) -> tuple[torch.Tensor, str]:
        """`chunk_id` names the chunk (request, prefix, size): a new one makes a new plan."""
        _check_slots(q, slots, prefix_len)
        n, num_heads, head_dim = q.shape
        num_kv_heads, total = k_buf.shape[1], slots.numel()
        key = (chunk_id, page_size, q.dtype)
        if self._planned != key:
            pages = (slots[::page_size] // page_size).to(torch.int32)  # a request's positions fill its pages in order
            dev = q.device
            self.wrapper.plan(
                torch.tensor([0, n], dtype=torch.int32, device=dev),
                torch.tensor([0, pages.numel()], dtype=torch.int32, device=dev),
                pages,
                torch.tensor([total - (pages.numel() - 1) * page_size], dtype=torch.int32, device=dev),
                num_heads,
                num_kv_heads,
                head_dim,
                page_size,
                causal=True,
                q_data_type=q.dtype,
                kv_data_type=k_buf.dtype,
            )
            self._planned = key
        paged = (k_buf.view(-1, page_size, num_kv_heads, head_dim), v_buf.view(-1, page_size, num_kv_heads, head_dim))
        return self.wrapper.run(q.contiguous(), paged), "flashinfer paged prefill"


class AttentionKernel:
    """The chosen backend of a stage, shared by its attention layers; remembers the kernel that ran last."""

    def __init__(self, backend: str, device: torch.device) -> None:
        self.backend = resolve_attention_backend(backend, device.type)
        self.kernel: str | None = None
        self._flashinfer = FlashInferAttention(device) if self.backend == "flashinfer" else None

    def __call__(self, q, k_buf, v_buf, slots, prefix_len: int, page_size: int, chunk_id: tuple) -> torch.Tensor:
        """q: (n, heads, d); k_buf, v_buf: (total_slots, kv_heads, d); slots: (L + n,) -> (n, heads, d)."""
        if self.backend == "sdpa":
            out, self.kernel = sdpa_attention(q, k_buf, v_buf, slots, prefix_len)
        elif self.backend == "reference":
            out, self.kernel = reference_attention(q, k_buf, v_buf, slots, prefix_len)
        else:
            out, self.kernel = self._flashinfer(q, k_buf, v_buf, slots, prefix_len, page_size, chunk_id)
        return out

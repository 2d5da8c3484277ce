"""The activation model of one stage: the transient bytes of each part of a layer (attention, MLA, Mamba2, Gated
DeltaNet, MLP, MoE, the norm) on a chunk of n tokens after a cached prefix, the layer whose peak wins, and what a
probe holds beyond the layers (activation_peak says how each term is counted). No torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ppprof.bounds import MLA_PREFIX_SPAN_TOKENS
from ppprof.chunks import align_up
from ppprof.specs.accounting import FP32_BYTES, deltanet_state_shapes
from ppprof.specs.backends import MAMBA_FUSED
from ppprof.specs.dtypes import INDEX_BYTES
from ppprof.specs.layer import MOE, LayerSpec
from ppprof.specs.spec import ModelSpec

FLASHINFER_WORKSPACE_BYTES = 128 * 2**20
"""FlashInfer's workspace buffer (ppprof.model.attention_kernels), allocated by every stage that uses the backend."""


def attention_bytes(spec: ModelSpec, n: int, total: int, b: int, backend: str, device: str) -> int:
    """Transient of one attention layer: n query tokens over `total` = L + n keys (see activation_peak)."""
    heads, kv_heads, d = spec.num_attention_heads, spec.num_key_value_heads, spec.head_dim
    group = heads // kv_heads
    out = n * (2 * heads + 3 * kv_heads) * d * b  # qkv, roped q and k
    if backend == "flashinfer":
        return out + n * heads * d * b
    out += 2 * kv_heads * total * d * b  # K/V gathered from the pool
    if backend == "sdpa":
        if device == "cuda" or total == n:  # one flash call (no prefix on CPU: no second call, no merge)
            return out + n * heads * d * b
        return out + 2 * n * heads * d * b + 3 * n * heads * d * FP32_BYTES
    upcast = (n * heads * d + 2 * kv_heads * total * d) * FP32_BYTES if b < FP32_BYTES else 0
    return (
        out
        + n * heads * d * (b + FP32_BYTES)
        + group * n * total * (1 + FP32_BYTES)
        + heads * n * total * (2 * FP32_BYTES + 1)
        + upcast
    )


def mla_bytes(
    spec: ModelSpec, n: int, total: int, b: int, backend: str, device: str, span: int = MLA_PREFIX_SPAN_TOKENS
) -> int:
    """Transient of one MLA layer on n tokens after total - n cached ones, a prefix longer than `span` decompressed
    a span at a time (see activation_peak)."""
    heads, d, c, dr = spec.num_attention_heads, spec.qk_head_dim, spec.kv_lora_rank, spec.qk_rope_head_dim
    dv = spec.v_head_dim
    spanned = backend != "reference" and total - n > span
    rows = max(n, span) if spanned else total  # positions decompressed at once
    out = n * (spec.q_lora_rank + 2 * heads * d + c + dr) * b  # q_a, q and its RoPE'd copy, kv_a
    out += total * (c + dr) * b  # the rows read from the pool
    keys = rows * heads * (spec.qk_nope_head_dim + dv) * b + rows * heads * d * b * (2 if dv < d else 1)
    if spanned:  # a span's keys and output beside the running fp32 output, or the merge (its keys freed by then)
        running = n * heads * dv * FP32_BYTES
        return out + max(keys + n * heads * d * b + running, 5 * running)
    out += keys  # decompressed, the keys, and V padded to the key width
    if backend == "reference":
        return out + n * total * (1 + FP32_BYTES) + heads * n * total * (2 * FP32_BYTES + 1)
    if device == "cuda" or total == n:
        return out + n * heads * d * b
    return out + 2 * n * heads * d * b + 3 * n * heads * d * FP32_BYTES


def deltanet_bytes(spec: ModelSpec, n: int, b: int) -> int:
    """Transient of one Gated DeltaNet mixer on n tokens, the torch path (see activation_peak)."""
    hv, dk, dv, q = (
        spec.linear_num_value_heads,
        spec.linear_key_head_dim,
        spec.linear_value_head_dim,
        spec.deltanet_chunk_size,
    )
    conv_dim = spec.deltanet_conv_dim
    padded = align_up(n, q)
    io = n * (2 * spec.deltanet_key_dim + 2 * spec.deltanet_value_dim) * b + 2 * n * hv * FP32_BYTES
    io += (n + spec.linear_conv_kernel_dim - 1) * conv_dim * b + n * conv_dim * b  # the conv's input and output
    io += n * hv * (2 * dk + dv) * FP32_BYTES  # q, k per value head and v, fp32
    blocks = 3 * hv * padded * q * FP32_BYTES  # decay, the triangular system, the intra-block scores
    vectors = hv * padded * (4 * dk + 3 * dv) * FP32_BYTES  # k_beta, w, q_decayed, k_to_end; uv, v_beta, out
    gated_norm = 2 * n * hv * dv * FP32_BYTES
    return io + max(blocks + vectors, gated_norm)


def mamba_bytes(spec: ModelSpec, n: int, b: int, kernel: str) -> int:
    """Transient of one Mamba2 mixer on n tokens (see activation_peak)."""
    heads, head_dim, state = spec.mamba_num_heads, spec.mamba_head_dim, spec.ssm_state_size
    conv_dim, q = spec.mamba_conv_dim, spec.mamba_chunk_size
    d_inner = spec.mamba_d_inner
    in_width = d_inner + conv_dim + heads
    padded = align_up(n, q)
    decay = heads * padded * q  # Q
    states = (padded // q + 1) * heads * head_dim * state  # S
    fused = kernel == MAMBA_FUSED
    io = n * (in_width + (1 if fused else 2) * conv_dim) * b
    if fused:
        scan = 2 * states * FP32_BYTES + spec.mamba_n_groups * padded * q * FP32_BYTES + n * d_inner * (b + FP32_BYTES)
    else:
        scan = padded * heads * (head_dim + 2 * state) * b + max(
            3 * decay * FP32_BYTES,
            3 * decay * b + 2 * padded * heads * state * b,
            decay * b + 4 * states * FP32_BYTES + padded * heads * head_dim * b,
        )
    gated_norm = 4 * n * d_inner * FP32_BYTES
    return io + max(scan, gated_norm)


def ffn_bytes(spec: ModelSpec, layer: LayerSpec, n: int, b: int) -> int:
    """Transient of the layer's MLP or MoE on n tokens (see activation_peak)."""
    inner = 4 if spec.mlp_gated else 3
    if layer.ffn != MOE:
        return inner * n * spec.intermediate_size * b
    h, experts, top_k = spec.hidden_size, spec.num_experts, spec.num_experts_per_tok
    routing = n * experts * (b + 3 * FP32_BYTES) + 6 * INDEX_BYTES * n * top_k + n * h * b
    shared = n * (inner * spec.shared_expert_intermediate_size + h) * b  # the shared expert, then its output
    return routing + max(n * (3 * h * b + inner * spec.moe_intermediate_size * b), shared)


@dataclass(frozen=True, slots=True)
class ChunkRun:
    """A chunk of `n` tokens after `prefix_len` cached ones, as a stage runs it (activation_peak)."""

    n: int
    prefix_len: int
    """The chunk's tokens, and the cached tokens before it."""
    b: int
    """The pipeline dtype's bytes."""
    backend: str
    device: str
    kernel: str
    """The attention backend (resolved), the device, and the Mamba kernel (MAMBA_TORCH or MAMBA_FUSED)."""


def layer_terms(spec: ModelSpec, layer: LayerSpec, chunk: ChunkRun) -> dict[str, int]:
    """The transient of each part of `layer` that it has: norm, attention, mamba, mlp or moe."""
    n, prefix_len, b, backend, device = chunk.n, chunk.prefix_len, chunk.b, chunk.backend, chunk.device
    out = {"norm": 2 * n * spec.hidden_size * FP32_BYTES}
    if layer.has_attention:
        out["attention"] = attention_bytes(spec, n, prefix_len + n, b, backend, device)
    if layer.has_mla:
        out["attention"] = mla_bytes(spec, n, prefix_len + n, b, backend, device)
    if layer.has_deltanet:
        out["deltanet"] = deltanet_bytes(spec, n, b)
    if layer.has_mamba:
        out["mamba"] = mamba_bytes(spec, n, b, chunk.kernel)
    if layer.ffn:
        out[layer.ffn] = ffn_bytes(spec, layer, n, b)
    return out


def prefix_noise_bytes(spec: ModelSpec, layers: range, prefix_len: int, b: int) -> int:
    """The random prefix a probe writes: one block of L K/V rows (KVPool.fill_random keeps it) and one Mamba slot's
    conv and SSM state (MambaPool.fill_random), held on every stage that has such layers."""
    if not prefix_len:
        return 0
    out = 0
    if any(spec.layers[i].has_attention for i in layers):
        out += prefix_len * spec.num_key_value_heads * spec.head_dim * b
    if any(spec.layers[i].has_mla for i in layers):
        out += prefix_len * spec.mla_latent_dim * b  # LatentPool.fill_random's block
    if any(spec.layers[i].has_mamba for i in layers):
        out += (
            spec.mamba_conv_dim * (spec.conv_kernel - 1) * b
            + spec.mamba_num_heads * spec.mamba_head_dim * spec.ssm_state_size * FP32_BYTES
        )
    if any(spec.layers[i].has_deltanet for i in layers):
        (conv_dim, width), (hv, dk, dv) = deltanet_state_shapes(spec)
        out += conv_dim * width * b + hv * dk * dv * FP32_BYTES
    return out


def activation_peak(spec: ModelSpec, layers: range, chunk: ChunkRun) -> tuple[int, int, dict[str, int]]:
    """(peak bytes, the layer whose peak wins, its named terms) of `chunk`: n tokens after L = prefix_len cached
    ones (T = L + n), hidden h, the pipeline dtype b bytes, fp32 4 bytes.

    Every layer's peak is `held` plus the largest transient of one of its parts; the largest layer's peak wins.
    - held, 5 n h b: the pending output and residual handed in, the new residual, the normed input, and a mixer's
      output while the FFN (or a second mixer) runs.
    - norm, 2 n h 4: RMSNorm's fp32 copy and its scaled result.
    - attention (H heads, K kv heads of d, group g = H / K): qkv and the roped q, k, n (2 H + 3 K) d b; then
      sdpa: K/V of the T positions gathered, 2 K T d b, and on CPU two flash calls (prefix, chunk), 2 n H d b, merged
      by log-sum-exp in fp32, 3 n H d 4; on CUDA one flash or memory-efficient call, n H d b (no score matrix while
      torch picks one of those for the lower-right causal bias: run.json names the kernel);
      reference: the gather, the regrouped and scaled q, n H d (b + 4), the dense bool mask tiled over the group
      and its fp32 form, g n T 5, and SDPA's math path: fp32 scores, their softmax and a bool test for fully masked
      rows, 9 H n T (plus fp32 copies of q, K, V below fp32);
      flashinfer: reads the pages in place: its output, n H d b, and a 128 MiB workspace on every stage.
    - mamba (Hm heads of P, state N, G groups, C conv channels, in_proj width W, SSD block q, n' = n rounded up to q;
      Q = Hm n' q, the (heads, blocks, q, q) decay tensors; S = (n' / q + 1) Hm P N, the block states): in_proj
      output and the conv's output, n (W + C) b, the torch conv's input copy (kept), n C b, and the largest of
      torch SSD: x dt, B and C per head, n' Hm (P + 2 N) b, plus the largest of segsum (masked copy, cumsum,
      result), 3 Q 4; the diagonal einsum (decay, two intermediates, operand copies), 3 Q b + 2 n' Hm N b; the
      block states (decay kept; fp32 states, their cat, einsum and copy), Q b + 4 S 4 + n' Hm P b;
      fused (mamba_ssm, CUDA): fp32 chunk states twice, 2 S 4, C.B per group, G n' q 4, y and its fp32 copy,
      n Hm P (b + 4), far below the torch path's decay tensors;
      the gated norm after the scan, 4 n Hm P 4.
    - mlp (I inner): silu: gate+up, silu(gate), their product, 4 n I b; relu2: up, relu, square, 3 n I b.
    - moe (E experts, top k): router logits, fp32 scores and choice scores n E (b + 12), routing indices 48 n k, the
      output n h b, and the larger of one expert on every token (the worst case; a random router gives each about
      n k / E): gathered input, inner, down and weighted outputs, n (3 h + m I) b, m = 4 (silu) or 3 (relu2), and
      the shared expert (inner width Is), n (m Is + h) b.
    - MLA (H heads, query/key width d = dn + dr, latent c, value dv): q_a, q and its RoPE'd copy and kv_a,
      n (q_lora + 2 H d + c + dr) b; the T rows read from the pool and decompressed, T (c + dr) b + T H (dn + dv) b;
      the keys, and V zero-padded to d, 2 T H d b; then attention as sdpa's (reference: the dense mask and fp32
      scores). Past P = MLA_PREFIX_SPAN_TOKENS cached tokens, a span at a time: the T rows, then the larger of a
      span (max(n, P) positions decompressed, their keys and padded V, its output n H d b, the running fp32 output
      n H dv 4) and the log-sum-exp merge (running and span outputs, two weighted copies, their sum: 5 n H dv 4);
      DeepSeek-V3's MLA layer (bf16, TP 1, n = 8192, L = 131072) holds 3.4 GiB so, 22.6 GiB at once.
    - deltanet (Hv value heads of dv, key heads of dk repeated to Hv, block q, n' = n rounded up to q): in_proj and
      the conv's input and output, fp32 q, k, v per value head; then the larger of the chunked rule's block tensors,
      3 Hv n' q 4, with its per-token vectors, Hv n' (4 dk + 3 dv) 4, and the gated norm, 2 n Hv dv 4.
    Beyond the layers: a probe's synthetic prefix (the random K/V block of L rows that KVPool.fill_random keeps, one
    Mamba slot's state; MLA's latent block; a Gated DeltaNet slot) and FlashInfer's workspace. Not modelled: allocator caching and fragmentation (CUDA caching
    allocator, glibc heaps), the CUDA context, each rank's torch runtime. On CPU in fp32 (tiny presets, both
    backends, scripts/benchmarks/memory.py) the estimate is 1.00-1.06 of the measured peak of the live tensors, 0.76-1.00
    of the RSS peak under glibc's default malloc (freed heap memory stays resident); CPU bf16 takes more (matmuls
    upcast internally)."""
    held = 5 * chunk.n * spec.hidden_size * chunk.b
    best_layer, best = largest_layer_part(spec, layers, chunk)
    terms = {"held": held, **best}
    noise = prefix_noise_bytes(spec, layers, chunk.prefix_len, chunk.b)
    if noise:
        terms["prefix_noise"] = noise
    if chunk.backend == "flashinfer":
        terms["flashinfer_workspace"] = FLASHINFER_WORKSPACE_BYTES
    return sum(terms.values()), best_layer, terms


def largest_layer_part(spec: ModelSpec, layers: range, chunk: ChunkRun) -> tuple[int, dict[str, int]]:
    """The layer whose largest part's transient is the largest of the stage (the first such), and {that part: bytes}."""
    best_layer, best = layers.start, {}
    for i in layers:
        parts = layer_terms(spec, spec.layers[i], chunk)
        part = max(parts, key=parts.get)
        if not best or parts[part] > max(best.values()):
            best_layer, best = i, {part: parts[part]}
    return best_layer, best

"""Tiny specs and a prefill driver shared by the model tests (fp32, CPU)."""

from __future__ import annotations

import torch

from ppprof.mem.cache import Request, StageCache
from ppprof.model.stage import Stage, build_stage_cache
from ppprof.specs.memory import CacheSizes
from ppprof.specs.spec import LayerSpec, ModelSpec

HIDDEN = 64
VOCAB = 128


def tiny_dense() -> ModelSpec:
    """4 layers of attention + MLP, GQA with 4 query heads on 2 KV heads."""
    return ModelSpec(
        name="test-dense",
        family="llama",
        layers=(LayerSpec(mixers=("attention",), ffn="mlp"),) * 4,
        hidden_size=HIDDEN,
        vocab_size=VOCAB,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
    )


def tiny_hybrid() -> ModelSpec:
    """5 layers: m A - E P (Mamba only, attention + MLP, MLP only, Mamba + MoE, attention || Mamba + MLP)."""
    layers = (
        LayerSpec(mixers=("mamba",)),
        LayerSpec(mixers=("attention",), ffn="mlp"),
        LayerSpec(ffn="mlp"),
        LayerSpec(mixers=("mamba",), ffn="moe"),
        LayerSpec(mixers=("attention", "mamba"), ffn="mlp"),
    )
    return ModelSpec(
        name="test-hybrid",
        family="falcon_h1",
        layers=layers,
        hidden_size=HIDDEN,
        vocab_size=VOCAB,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        mamba_num_heads=4,
        mamba_head_dim=16,
        ssm_state_size=16,
        conv_kernel=4,
        mamba_n_groups=1,
        mamba_chunk_size=16,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
    )


def make_cache(spec: ModelSpec, layer_ids: range, page_size: int = 1) -> StageCache:
    return build_stage_cache(
        spec,
        layer_ids,
        CacheSizes(
            max_total_tokens=256, page_size=page_size, max_mamba_cache_size=4, max_running_requests=4, context_len=128
        ),
        dtype=torch.float32,
        device="cpu",
    )


def prefill(
    stages: list[Stage], caches: list[StageCache], tokens: torch.Tensor, chunk_lens: list[int], rid: int = 0
) -> tuple[torch.Tensor, list[Request]]:
    """Prefill `tokens` chunk by chunk through the stages in order; returns the last chunk's logits and the requests
    (one per stage, still admitted)."""
    reqs = [Request(rid) for _ in stages]
    for cache, req in zip(caches, reqs):
        assert cache.admit(req)
    prefix_len, logits = 0, None
    for n in chunk_lens:
        x, residual = tokens[prefix_len : prefix_len + n], None
        for stage, cache, req in zip(stages, caches, reqs):
            assert cache.extend(req, n) is not None
            x, residual = stage(cache, req, x, residual, prefix_len)
        logits = x
        prefix_len += n
    assert prefix_len == tokens.numel()
    return logits, reqs


def chunked_logits(
    spec: ModelSpec,
    chunk_sizes: list[int],
    page_size: int = 1,
    attention_backend: str = "sdpa",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> torch.Tensor:
    """Logits of the last chunk of one prompt (random tokens from `seed`) prefilled chunk by chunk through the whole
    model as one stage."""
    layers = range(spec.num_layers)
    stage = Stage(spec, layers, dtype=dtype, seed=seed, attention_backend=attention_backend)
    cache = build_stage_cache(
        spec,
        layers,
        CacheSizes(
            max_total_tokens=256, page_size=page_size, max_mamba_cache_size=4, max_running_requests=4, context_len=256
        ),
        dtype=dtype,
        device="cpu",
    )
    tokens = torch.randint(spec.vocab_size, (sum(chunk_sizes),), generator=torch.Generator().manual_seed(seed))
    logits, _ = prefill([stage], [cache], tokens, chunk_sizes)
    return logits

"""Tensor parallelism on real gloo ranks: a TP = 2 stage, built from the same seed's weights sharded, computes what the
TP = 1 stage computes (hidden states between stages and the logits, chunk after chunk through the KV and Mamba
pools), for dense, hybrid Mamba2, MoE (with a shared expert, sigmoid routing, gated attention), and the replicated cases (fewer KV heads or Mamba groups than TP ranks, a
vocabulary TP does not divide)."""

import dataclasses
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ppprof.distributed.mesh import build_mesh
from ppprof.mem.cache import Request
from ppprof.mem.pools import LatentPool
from ppprof.model.deltanet import GatedDeltaNet, recurrent_gated_delta_rule
from ppprof.model.mla import MLAttention
from ppprof.model.stage import Stage, build_stage_cache
from ppprof.specs import LayerSpec, load_spec
from ppprof.specs.memory import CacheSizes
from tests.model.helpers import prefill
from tests.multirank import free_port

TP = 2
CHUNKS = [24, 17]


def specs():
    hybrid = load_spec("tiny-hybrid")
    moe = dataclasses.replace(hybrid, name="moe-only", layers=(LayerSpec(mixers=("attention",), ffn="moe"),) * 2)
    replicated = dataclasses.replace(hybrid, name="replicated", num_key_value_heads=1, mamba_n_groups=1, vocab_size=509)
    qwen3_moe = load_spec("tiny-moe")  # q/k norms, softmax routing
    # Qwen3-Next's gated attention and sigmoid-gated shared expert, DeepSeek-V3's sigmoid routing with its bias
    shared = dataclasses.replace(
        qwen3_moe,
        name="shared-expert",
        attn_output_gate=True,
        moe_scoring="sigmoid",
        shared_expert_intermediate_size=64,
        shared_expert_gate=True,
    )
    return [
        load_spec("tiny-dense"),
        hybrid,
        moe,
        replicated,
        qwen3_moe,
        shared,
        load_spec("tiny-mla"),
        load_spec("tiny-gdn"),
    ]


def recurrent_kernel(q, k, v, g, beta, chunk_size, initial_state):
    """The Gated DeltaNet's token-by-token recurrence in place of its chunked kernel (same call)."""
    return recurrent_gated_delta_rule(q, k, v, g, beta, initial_state)


def other_forms(module) -> None:
    """MLA absorbed, its prefix decompressed 5 tokens at a time (CHUNKS' second chunk has a 24-token prefix: 5
    spans); the Gated DeltaNet by its recurrence."""
    if isinstance(module, MLAttention):
        module.absorb, module.prefix_span_len = True, 5
    if isinstance(module, GatedDeltaNet):
        module.kernel = recurrent_kernel


def run_stages(spec, tp, tp_rank: int, variant=None):
    """The spec split in two stages (one process runs both), prefilled in CHUNKS: (stage 0's last hidden, logits);
    `variant` applied to every module of the stages first."""
    half = spec.num_layers // 2
    ranges = [range(0, half), range(half, spec.num_layers)]
    kw = {} if tp is None else {"tp": tp}
    stages = [Stage(spec, r, seed=3, **kw) for r in ranges]
    for stage in stages if variant else ():
        stage.apply(variant)
    caches = [
        build_stage_cache(
            spec,
            r,
            CacheSizes(
                max_total_tokens=128, page_size=1, max_mamba_cache_size=2, max_running_requests=2, context_len=128
            ),
            tp_size=TP if tp else 1,
            tp_rank=tp_rank,
        )
        for r in ranges
    ]
    tokens = torch.randint(spec.vocab_size, (sum(CHUNKS),), generator=torch.Generator().manual_seed(1))
    logits, reqs = prefill(stages, caches, tokens, CHUNKS)
    # Stage 0 alone on another request: its hidden states and residual, what a stage boundary carries.
    fresh = Request(99)
    assert caches[0].admit(fresh) and caches[0].extend(fresh, 8) is not None
    h, residual = stages[0](caches[0], fresh, tokens[:8], None, 0)
    for cache, r in zip(caches, reqs):
        cache.release(r)
    caches[0].release(fresh)
    for cache in caches:
        assert not cache.leaks(), cache.leaks()
    return h, residual, logits, caches


def worker(rank: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=TP)
    try:
        mesh = build_mesh("cpu", TP, rank, TP)
        assert mesh.coords.stage == 0 and mesh.coords.tp_rank == rank
        for spec in specs():
            ref = run_stages(spec, None, 0)
            runs = {"": run_stages(spec, mesh.tp, rank)}
            if spec.name in ("tiny-mla", "tiny-gdn"):
                runs["absorbed, spans / recurrent"] = run_stages(spec, mesh.tp, rank, other_forms)
            for form, got in runs.items():
                for name, a, b in zip(("hidden", "residual", "logits"), got[:3], ref[:3]):
                    torch.testing.assert_close(
                        a, b, rtol=1e-4, atol=1e-5, msg=lambda m, s=spec, n=name, f=form: f"{s.name} {f} {n}: {m}"
                    )
            check_pools(spec.name, ref[3][0], runs[""][3][0])
    finally:
        dist.destroy_process_group()


def check_pools(name, ref, got) -> None:
    """The rank's pools hold its heads only: KV of its KV heads, MLA's latent whole, Mamba / Gated DeltaNet state of
    its heads."""
    pool, ref_pool = got.kv_pool, ref.kv_pool
    if isinstance(pool, LatentPool):
        lid = pool.layer_ids[0]
        assert pool.latent[lid].shape == ref_pool.latent[lid].shape, name
    elif pool is not None:
        lid = pool.layer_ids[0]
        assert pool.k[lid].shape[1] == max(1, ref_pool.k[lid].shape[1] // TP), (name, pool.k[lid].shape)
    if got.mamba_pool is not None and name == "tiny-gdn":
        lid = got.mamba_pool.layer_ids[0]
        ref_conv, ref_ssm = ref.mamba_pool.conv[lid].shape, ref.mamba_pool.ssm[lid].shape
        assert got.mamba_pool.conv[lid].shape[1] * TP == ref_conv[1], (name, got.mamba_pool.conv[lid].shape)
        assert got.mamba_pool.ssm[lid].shape[1] * TP == ref_ssm[1], (name, got.mamba_pool.ssm[lid].shape)


@pytest.mark.multirank
@pytest.mark.timeout(240)
def test_tp2_stage_equals_tp1():
    mp.start_processes(worker, args=(free_port(),), nprocs=TP, start_method="spawn", join=True)

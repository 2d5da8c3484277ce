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
from ppprof.model.stage import Stage, build_stage_cache
from ppprof.specs import LayerSpec, load_spec
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
    return [load_spec("tiny-dense"), hybrid, moe, replicated, qwen3_moe, shared]


def run_stages(spec, tp, tp_rank: int):
    """The spec split in two stages (one process runs both), prefilled in CHUNKS: (stage 0's last hidden, logits)."""
    half = spec.num_layers // 2
    ranges = [range(0, half), range(half, spec.num_layers)]
    kw = {} if tp is None else {"tp": tp}
    stages = [Stage(spec, r, seed=3, **kw) for r in ranges]
    caches = [
        build_stage_cache(
            spec,
            r,
            max_total_tokens=128,
            page_size=1,
            max_mamba_cache_size=2,
            max_running_requests=2,
            context_len=128,
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
            got = run_stages(spec, mesh.tp, rank)
            for name, a, b in zip(("hidden", "residual", "logits"), got[:3], ref[:3]):
                torch.testing.assert_close(
                    a, b, rtol=1e-4, atol=1e-5, msg=lambda m, spec=spec, name=name: f"{spec.name} {name}: {m}"
                )
            # the rank's pools hold its heads only
            ref_pool, pool = ref[3][0].kv_pool, got[3][0].kv_pool
            if pool is not None:
                lid = pool.layer_ids[0]
                assert pool.k[lid].shape[1] == max(1, ref_pool.k[lid].shape[1] // TP), (spec.name, pool.k[lid].shape)
    finally:
        dist.destroy_process_group()


@pytest.mark.multirank
@pytest.mark.timeout(240)
def test_tp2_stage_equals_tp1():
    mp.start_processes(worker, args=(free_port(),), nprocs=TP, start_method="spawn", join=True)

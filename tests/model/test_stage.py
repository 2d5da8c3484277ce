"""Stage numerics: chunked prefill == one-shot prefill; a split pipeline == the unsplit model; per-stage pools."""

from __future__ import annotations

import pytest
import torch

from ppprof.mem.cache import Request, StageCache
from ppprof.model import Stage, build_stage_cache, split_layers
from ppprof.specs.memory import CacheSizes

from .helpers import VOCAB, make_cache, prefill, tiny_dense, tiny_hybrid

NUM_TOKENS = 40
CHUNKINGS = [[1, 39], [16, 16, 8], [7, 1, 20, 12], [39, 1]]
TOL = dict(rtol=1e-4, atol=1e-5)


def tokens(seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (NUM_TOKENS,), generator=torch.Generator().manual_seed(seed))


def kv_by_position(cache: StageCache, req: Request) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """K and V of every attention layer, gathered by position through the request's table: (kv_len, kv_heads, dim)."""
    if cache.kv_pool is None:
        return {}
    slots = cache.req_pool.slots(req.req_pool_idx, req.kv_len)
    return {i: (cache.kv_pool.k[i][slots], cache.kv_pool.v[i][slots]) for i in cache.kv_pool.layer_ids}


def mamba_state(cache: StageCache, req: Request) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    if cache.mamba_pool is None:
        return {}
    slot = cache.mamba_slot(req)
    return {i: (cache.mamba_pool.conv[i][slot], cache.mamba_pool.ssm[i][slot]) for i in cache.mamba_pool.layer_ids}


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("chunk_lens", CHUNKINGS, ids=lambda c: "-".join(map(str, c)))
def test_chunked_prefill_equals_one_shot(spec, page_size, chunk_lens):
    layer_ids = range(spec.num_layers)
    stage = Stage(spec, layer_ids, seed=3)
    ids = tokens()
    ref_cache, cache = make_cache(spec, layer_ids, page_size), make_cache(spec, layer_ids, page_size)
    ref_logits, (ref_req,) = prefill([stage], [ref_cache], ids, [NUM_TOKENS])
    logits, (req,) = prefill([stage], [cache], ids, chunk_lens)

    assert logits.shape == (VOCAB,) and torch.isfinite(logits).all()
    torch.testing.assert_close(logits, ref_logits, **TOL)
    for got, want in (
        (kv_by_position(cache, req), kv_by_position(ref_cache, ref_req)),
        (mamba_state(cache, req), mamba_state(ref_cache, ref_req)),
    ):
        assert got.keys() == want.keys()
        for i in want:
            torch.testing.assert_close(got[i], want[i], **TOL, msg=lambda m, i=i: f"layer {i}: {m}")
    assert kv_by_position(cache, req), "every spec under test has attention"
    if spec.name == "test-hybrid":
        assert set(mamba_state(cache, req)) == {0, 3, 4}


@pytest.mark.parametrize(
    "make_spec,partition",
    [
        (tiny_dense, [2, 2]),
        (tiny_dense, [1, 3]),
        (tiny_dense, None),
        (tiny_hybrid, [2, 3]),
        (tiny_hybrid, [1, 1, 3]),
        (tiny_hybrid, [4, 1]),
        (tiny_hybrid, None),
    ],
    ids=lambda v: getattr(v, "__name__", None) or ("even" if v is None else "-".join(map(str, v))),
)
def test_split_stages_equal_unsplit(make_spec, partition):
    spec = make_spec()
    pp_size = 2 if partition is None else len(partition)
    ranges = split_layers(spec.num_layers, pp_size, partition)
    ids, chunk_lens = tokens(1), [17, 1, 22]
    whole = Stage(spec, range(spec.num_layers), seed=5)
    ref_logits, _ = prefill([whole], [make_cache(spec, range(spec.num_layers), 4)], ids, chunk_lens)
    stages = [Stage(spec, r, seed=5) for r in ranges]  # built separately, as on different ranks
    logits, _ = prefill(stages, [make_cache(spec, r, 4) for r in ranges], ids, chunk_lens)
    torch.testing.assert_close(logits, ref_logits, **TOL)
    assert [s.is_first for s in stages] == [True] + [False] * (pp_size - 1)
    assert [s.is_last for s in stages] == [False] * (pp_size - 1) + [True]


def test_stage_weights_depend_only_on_seed_and_layer_id():
    spec = tiny_hybrid()
    whole, tail = Stage(spec, range(5), seed=7), Stage(spec, range(2, 5), seed=7)
    tail_state = tail.state_dict()
    for name, value in whole.state_dict().items():
        if name in tail_state:
            torch.testing.assert_close(tail_state[name], value, rtol=0, atol=0, msg=lambda m, n=name: f"{n}: {m}")
    assert any(k.startswith("layers.2.") for k in tail_state) and "embed.weight" not in tail_state
    other = Stage(spec, range(5), seed=8)
    assert not torch.equal(other.layers["1"].attention.qkv_proj.weight, whole.layers["1"].attention.qkv_proj.weight)


def test_intermediate_stage_returns_hidden_and_residual():
    spec = tiny_dense()
    stage, cache = Stage(spec, range(2), seed=0), make_cache(spec, range(2))
    req = Request(0)
    assert cache.admit(req) and cache.extend(req, 5) is not None
    hidden, residual = stage(cache, req, tokens()[:5], None, 0)
    assert hidden.shape == residual.shape == (5, spec.hidden_size)


def test_stage_rejects_bad_inputs():
    spec = tiny_dense()
    first, cache = Stage(spec, range(2)), make_cache(spec, range(2))
    req = Request(0)
    assert cache.admit(req) and cache.extend(req, 4) is not None
    with pytest.raises(ValueError, match="token ids"):
        first(cache, req, torch.zeros(4, spec.hidden_size), None, 0)
    with pytest.raises(ValueError, match="cache.extend"):
        first(cache, req, tokens()[:6], None, 0)
    with pytest.raises(ValueError, match="contiguous range"):
        Stage(spec, range(3, 6))


def test_build_stage_cache_pools_only_own_layers():
    spec = tiny_hybrid()  # m A - E P
    kw = CacheSizes(max_total_tokens=64, page_size=4, max_mamba_cache_size=2, max_running_requests=2, context_len=32)
    head = build_stage_cache(spec, range(0, 1), kw)
    assert head.kv_pool is None and head.kv_alloc is not None and head.mamba_pool.layer_ids == [0]
    mid = build_stage_cache(spec, range(1, 3), kw)
    assert mid.kv_pool.layer_ids == [1] and mid.mamba_alloc is None and mid.mamba_pool is None
    tail = build_stage_cache(spec, range(3, 5), kw)
    assert tail.kv_pool.layer_ids == [4] and tail.mamba_pool.layer_ids == [3, 4]
    assert tail.kv_pool.total_slots == 68 and tail.mamba_pool.total_slots == 3


def test_prefill_then_release_leaves_no_leaks():
    spec = tiny_hybrid()
    ranges = split_layers(spec.num_layers, 2, [2, 3])
    stages = [Stage(spec, r) for r in ranges]
    caches = [make_cache(spec, r, 4) for r in ranges]
    _, reqs = prefill(stages, caches, tokens(), [10, 30])
    for cache, req in zip(caches, reqs):
        cache.release(req)
        cache.check_no_leaks()


@pytest.mark.parametrize("preset", ["tiny-dense", "tiny-hybrid", "tiny-mla", "tiny-moe", "tiny-gdn"])
def test_presets_chunked_and_split_equal_one_shot(preset):
    specs = pytest.importorskip("ppprof.specs")
    spec = specs.load_spec(preset)
    ids = torch.randint(0, spec.vocab_size, (NUM_TOKENS,), generator=torch.Generator().manual_seed(2))
    whole = range(spec.num_layers)
    ref_logits, _ = prefill([Stage(spec, whole)], [make_cache(spec, whole)], ids, [NUM_TOKENS])
    ranges = split_layers(spec.num_layers, 2)
    logits, _ = prefill([Stage(spec, r) for r in ranges], [make_cache(spec, r, 4) for r in ranges], ids, [1, 25, 14])
    torch.testing.assert_close(logits, ref_logits, **TOL)

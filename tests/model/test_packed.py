"""A packed forward (several requests' chunks, each at its own prefix, in one forward) computes what each chunk's own
forward computes: the same logits, the same KV and Mamba state left behind."""

import pytest
import torch

from ppprof.mem.cache import Request
from ppprof.model import Stage, split_layers
from ppprof.model.layer import Piece

from .helpers import VOCAB, make_cache, tiny_dense, tiny_hybrid

TOL = dict(rtol=1e-4, atol=1e-5)
PROMPTS = [(0, 12, 9), (1, 0, 5), (2, 30, 3)]
"""(rid, prefix_len, chunk_size) of each request in the packed batch: one starts at 0, two carry a prefix."""


def run(spec, packed: bool, page_size: int = 4):
    ranges = split_layers(spec.num_layers, 2)
    stages = [Stage(spec, r) for r in ranges]
    caches = [make_cache(spec, r, page_size) for r in ranges]
    gen = torch.Generator().manual_seed(3)
    tokens = {rid: torch.randint(0, VOCAB, (prefix + n,), generator=gen) for rid, prefix, n in PROMPTS}
    reqs = {rid: [Request(rid) for _ in stages] for rid, _, _ in PROMPTS}
    for rid, prefix, _ in PROMPTS:  # each prefix prefilled alone
        x = residual = None
        for s, cache, req in zip(stages, caches, reqs[rid]):
            assert cache.admit(req)
            if prefix:
                cache.extend(req, prefix)
                x, residual = s(cache, req, tokens[rid][:prefix] if s.is_first else x, residual, 0)
    if packed:
        x, residual = torch.cat([tokens[rid][prefix:] for rid, prefix, _ in PROMPTS]), None
        for i, (s, cache) in enumerate(zip(stages, caches)):
            pieces = []
            for rid, prefix, n in PROMPTS:
                cache.extend(reqs[rid][i], n)
                pieces.append(Piece(reqs[rid][i], prefix, n))
            x, residual = s.forward_packed(cache, pieces, x, residual)
        logits = x
    else:
        out = []
        for rid, prefix, n in PROMPTS:
            x = residual = None
            for i, (s, cache) in enumerate(zip(stages, caches)):
                cache.extend(reqs[rid][i], n)
                x, residual = s(cache, reqs[rid][i], tokens[rid][prefix:] if s.is_first else x, residual, prefix)
            out.append(x)
        logits = torch.stack(out)
    return logits, caches, reqs


@pytest.mark.parametrize("make", [tiny_dense, tiny_hybrid], ids=["dense", "hybrid"])
def test_a_packed_forward_equals_each_chunk_alone(make):
    spec = make()
    packed, caches_p, reqs_p = run(spec, packed=True)
    alone, caches_a, reqs_a = run(spec, packed=False)
    assert packed.shape == (len(PROMPTS), VOCAB)
    torch.testing.assert_close(packed, alone, **TOL)
    for cp, ca in zip(caches_p, caches_a):  # the state each request leaves behind
        if cp.kv_pool is not None:
            torch.testing.assert_close(cp.kv_pool.k, ca.kv_pool.k, **TOL)
        if cp.mamba_pool is not None:
            torch.testing.assert_close(cp.mamba_pool.ssm, ca.mamba_pool.ssm, **TOL)
    for caches, reqs in ((caches_p, reqs_p), (caches_a, reqs_a)):
        for i, cache in enumerate(caches):
            for per_stage in reqs.values():
                cache.release(per_stage[i])
            assert cache.leaks() == {}


def test_pieces_that_do_not_cover_the_tokens_are_refused():
    spec = tiny_dense()
    stage, cache = Stage(spec, range(spec.num_layers)), make_cache(spec, range(spec.num_layers))
    req = Request(0)
    assert cache.admit(req)
    cache.extend(req, 4)
    with pytest.raises(ValueError, match=r"sizes \[3\] do not cover the 4 tokens"):
        stage.forward_packed(cache, [Piece(req, 0, 3)], torch.zeros(4, dtype=torch.int64), None)
    cache.release(req)

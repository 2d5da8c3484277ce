"""A cached prefix written into a stage's pools (ppprof.probe.request.write_prefix: the probes' synthetic prefix, and
a replayed trace's cache hit on the real pipeline): its KV slots and Mamba state are what the next chunk attends
over, and they leave with the request in the one release order."""

import torch

from ppprof.mem.cache import Request
from ppprof.model import Stage
from ppprof.model.layer import Piece
from ppprof.probe.request import write_prefix
from tests.model.helpers import VOCAB, make_cache, tiny_hybrid


def test_a_written_prefix_is_what_the_chunk_attends_over_and_leaves_with_the_request():
    spec = tiny_hybrid()
    layers = range(spec.num_layers)
    stage, cache = Stage(spec, layers), make_cache(spec, layers, page_size=4)
    x = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(0))
    out = {}
    for name, prefix_len in (("cold", 0), ("hit", 24), ("hit again", 24)):
        req = Request(0)
        assert cache.admit(req) and write_prefix(cache, req, prefix_len, torch.Generator().manual_seed(1))
        assert req.kv_len == prefix_len, f"{name}: {req.kv_len=}"
        cache.extend(req, 8)
        out[name], _ = stage.forward_packed(cache, [Piece(req, prefix_len, 8)], x, None)
        cache.release(req)
        cache.check_no_leaks()
    assert not torch.allclose(out["hit"], out["cold"])  # the chunk read the 24 written slots and the state
    torch.testing.assert_close(out["hit"], out["hit again"])  # the same prefix written again: the same result
    req = Request(1)
    assert cache.admit(req) and not write_prefix(cache, req, 10_000, None)  # beyond the KV pool: nothing more taken
    assert req.kv_len == 0 and cache.outstanding()["kv"] == 0
    cache.release(req)
    cache.check_no_leaks()

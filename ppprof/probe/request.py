"""One probe request's set-up in a stage's cache, as a server's prefill would find it: admitted, its prefix already
cached (written, not computed), and slots for the chunk. Used by the probe loop, the packed forwards and by
scripts/benchmarks/forward.py."""

from __future__ import annotations

import torch

from ppprof.distributed.agree import RunError
from ppprof.mem import Request, StageCache
from ppprof.mem.cache import describe_leaks
from ppprof.probe.synth import ProbeRequest


def set_up_request(cache: StageCache, req: Request, pr: ProbeRequest, gen: torch.Generator | None) -> None:
    """Admit `req` (request entry, Mamba slot), give it `pr.prefix_len` cached tokens and slots for `pr.chunk_size`
    more. The prefix is not computed: random K/V (from `gen`) go into its KV slots and a random state into its Mamba
    slot. With no prefix the Mamba state stays as admission left it, as a fresh request's does. Raises RunError when
    the cache cannot hold the request; the caller releases `req` either way."""
    if not cache.admit(req):
        # Called with no other request live, so whatever is held (beyond the slots parked in an open Mamba group
        # window) has leaked.
        held = cache.outstanding()
        if cache.mamba_alloc is not None:
            held["mamba"] -= cache.mamba_alloc.group_remaining()
        leaks = describe_leaks({pool: n for pool, n in held.items() if n}, sep="; ")
        raise RunError(
            f"request {pr.rid} cannot be admitted although no request is live: "
            + (leaks or "the request or Mamba pool has no slot")
        )
    fill_request(cache, req, pr, gen)


def fill_request(cache: StageCache, req: Request, pr: ProbeRequest, gen: torch.Generator | None) -> None:
    """Give the admitted `req` its `pr.prefix_len` cached tokens (random K/V and Mamba state from `gen`, written, not
    computed) and KV slots for `pr.chunk_size` more; RunError when the KV cache cannot hold them."""
    if not write_prefix(cache, req, pr.prefix_len, gen):
        raise RunError(f"KV cache too small for the prefix of request {pr.rid} ({pr.prefix_len} tokens)")
    if cache.extend(req, pr.chunk_size) is None:
        raise RunError(f"KV cache too small for request {pr.rid} ({pr.prefix_len} + {pr.chunk_size} tokens)")


def write_prefix(cache: StageCache, req: Request, prefix_len: int, gen: torch.Generator | None) -> bool:
    """A cached prefix of `prefix_len` tokens for the admitted `req`, as a server finds it: KV slots in its table with
    K/V written (random, from `gen`: the values do not change what a forward costs) and, where the stage has Mamba
    layers, a state in its Mamba slot; its chunks then attend over those slots. Used by the probes and by a replayed
    trace's cache hits (ppprof.bench.serving). False (nothing more taken) when the KV cache is short; 0: nothing
    written, the Mamba state as admission left it, as a fresh request's is."""
    if not prefix_len:
        return True
    slots = cache.extend(req, prefix_len)
    if slots is None:
        return False
    if cache.kv_pool is not None:
        cache.kv_pool.fill_random(slots, gen)
    if cache.mamba_pool is not None:
        cache.mamba_pool.fill_random(cache.mamba_slot(req), gen)
    return True

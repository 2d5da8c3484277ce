"""Packed forwards: the design stays within the probes' prefixes and chunk sizes and the pools, and the runner (on a
one-rank gloo group, in process) times every pack and leaves every pool full, a failed forward included."""

import math

import pytest

from ppprof.chunks import align_up
from ppprof.distributed.agree import RunError
from ppprof.probe.packed import MAX_PIECES, MIN_PIECES, PackedRunner, PackLimits, pack_design, packed_frame
from ppprof.probe.synth import Probe, ProbeRequest

from .test_loop import make_runner

PROBES = [
    Probe(0, "sweep", tuple(ProbeRequest(i, 0, x) for i, x in enumerate((40, 32, 16, 8)))),
    Probe(1, "prefix", tuple(ProbeRequest(4 + i, 64, x) for i, x in enumerate((32, 8, 128)))),
    Probe(2, "prefix", tuple(ProbeRequest(7 + i, 256, x) for i, x in enumerate((16, 40)))),
]
CELLS = {(r.prefix_len, r.chunk_size) for p in PROBES for r in p.requests}


def kv_slots(pack, page):
    return sum(align_up(r.prefix_len + r.chunk_size, page) for r in pack.requests)


def test_packs_cycle_2_to_8_pieces_of_the_probes_cells_within_every_limit():
    limits = PackLimits(tokens=128, kv_slots=512, page_size=4, context_len=512, max_pieces=128)
    packs = pack_design(PROBES, limits, 21, seed=3)
    assert [len(p.requests) for p in packs] == [2, 3, 4, 5, 6, 7, 8] * 3
    assert [p.index for p in packs] == list(range(21))
    rids = [r.rid for p in packs for r in p.requests]
    assert min(rids) == 9 and len(set(rids)) == len(rids)  # after the probes', each once
    for p in packs:
        assert {(r.prefix_len, r.chunk_size) for r in p.requests} <= CELLS, f"{p=}"
        assert p.tokens <= 128 and kv_slots(p, 4) <= 512, f"{p=}"
    assert {r.prefix_len for p in packs for r in p.requests} == {0, 64, 256}  # prefixes mixed: every one drawn
    assert sum(len({r.prefix_len for r in p.requests}) > 1 for p in packs) >= 15, f"{packs=}"
    assert pack_design(PROBES, limits, 21, seed=3) == packs and pack_design(PROBES, limits, 21, seed=4) != packs


def test_packs_hold_no_more_pieces_than_the_mamba_slots_the_kv_slots_or_the_tokens_allow():
    tight = PackLimits(tokens=128, kv_slots=512, page_size=4, context_len=512, max_pieces=3)
    assert max(len(p.requests) for p in pack_design(PROBES, tight, 14, seed=0)) == 3
    small_kv = PackLimits(tokens=128, kv_slots=40, page_size=8, context_len=512, max_pieces=8)
    packs = pack_design(PROBES, small_kv, 14, seed=0)
    assert max(len(p.requests) for p in packs) == 5  # five pages of 8 slots
    assert all(kv_slots(p, 8) <= 40 and {r.prefix_len for r in p.requests} == {0} for p in packs), f"{packs=}"
    few_tokens = PackLimits(tokens=16, kv_slots=512, page_size=1, context_len=512, max_pieces=8)
    assert {len(p.requests) for p in pack_design(PROBES, few_tokens, 7, seed=0)} == {2}  # two of the smallest, 8
    none = PackLimits(tokens=15, kv_slots=512, page_size=1, context_len=512, max_pieces=8)
    assert pack_design(PROBES, none, 7, seed=0) == []
    short_context = PackLimits(tokens=128, kv_slots=512, page_size=1, context_len=100, max_pieces=8)
    assert all(
        r.prefix_len + r.chunk_size <= 100 for p in pack_design(PROBES, short_context, 14, seed=0) for r in p.requests
    )
    assert (MIN_PIECES, MAX_PIECES) == (2, 8)


def test_every_pack_is_timed_and_every_pool_is_full_after(one_rank_group):
    runner = make_runner(max_mamba_cache_size=4)
    limits = PackLimits(tokens=128, kv_slots=runner.cache.kv_alloc.size, page_size=4, context_len=512, max_pieces=4)
    packs = pack_design(PROBES, limits, 6, seed=0)
    assert [len(p.requests) for p in packs] == [2, 3, 4, 4, 4, 4]  # the request entries (4) bound them
    seen = []
    orig = runner.cache.release
    runner.cache.release = lambda req: (seen.append(req.rid), orig(req))[1]
    stage_ms = PackedRunner(runner).run(packs)
    assert len(stage_ms) == len(packs) and all(ms > 0 for ms in stage_ms), f"{stage_ms=}"
    first = [r.rid for r in packs[0].requests]
    assert seen == first + [r.rid for p in packs for r in p.requests]  # the untimed first pack, then each
    assert runner.cache.outstanding() == {"request": 0, "kv": 0, "mamba": 0}
    frame = packed_frame(packs, [stage_ms])
    assert list(frame.columns) == ["forward", "pieces", "tokens", "prefix_lens", "chunk_sizes", "stage0_latency_ms"]
    assert frame["prefix_lens"][0] == " ".join(str(r.prefix_len) for r in packs[0].requests)


def test_a_packed_forward_that_raises_releases_every_piece_and_stops_the_run(one_rank_group):
    runner = make_runner(max_mamba_cache_size=4)
    limits = PackLimits(tokens=128, kv_slots=runner.cache.kv_alloc.size, page_size=4, context_len=512, max_pieces=4)
    packs = pack_design(PROBES, limits, 3, seed=0)
    packed = PackedRunner(runner)
    calls = []

    def broken(cache, pieces, x, residual):
        calls.append(len(pieces))
        raise RuntimeError("injected")

    packed.stage.forward_packed = broken
    with pytest.raises(RunError, match=r"packed forward 0 \(2 pieces\) raised RuntimeError: injected"):
        packed.run(packs)
    assert calls == [2]  # the primer raised
    assert runner.cache.outstanding() == {"request": 0, "kv": 0, "mamba": 0}
    ms, error = PackedRunner(make_runner(max_mamba_cache_size=4)).run_pack(packs[1], timed=False)
    assert math.isnan(ms) and error is None

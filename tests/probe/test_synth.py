"""Probe synthesis: the prefix grid, the probes (deterministic from the seed), the warm-up requests."""

from ppprof.config import ProfileConfig
from ppprof.probe.synth import PREFIX, SWEEP, ProbeRequest, grid_chunk_sizes, make_probes, warmup_requests


def test_grid_chunks_are_distinct_aligned_and_span_b_over_8_to_1_25b():
    grid = grid_chunk_sizes(512, 16)
    assert grid[0] == 640 and grid[-1] == 64
    assert len(grid) == len(set(grid)) == 8
    assert all(g % 16 == 0 for g in grid)


def test_probes_are_deterministic_from_the_seed_and_ids_unique():
    cfg = ProfileConfig(requests_per_probe=16, base_chunk_size=128)
    a, b = make_probes(cfg), make_probes(cfg)
    assert a == b
    c = make_probes(ProfileConfig(requests_per_probe=16, base_chunk_size=128, seed=1))
    assert [r.chunk_size for r in c[1].requests] != [r.chunk_size for r in a[1].requests]
    assert [p.kind for p in a] == [SWEEP] + [PREFIX] * 6
    # Six prefix lengths log-spaced from B to the context length (32768) less the largest probe chunk (160).
    assert [p.requests[0].prefix_len for p in a] == [0, 128, 388, 1174, 3555, 10767, 32608]
    rids = [r.rid for p in a for r in p.requests]
    assert len(rids) == len(set(rids)) == 16 * 7
    assert all(len(p.requests) == 16 for p in a)


def test_warmup_covers_the_sweep_and_every_prefix():
    probes = make_probes(ProfileConfig(requests_per_probe=8, base_chunk_size=64, prefix_lens=(64, 128)))
    w = warmup_requests(probes, 2)
    assert w == [ProbeRequest(-1, 0, 80), ProbeRequest(-2, 0, 68), ProbeRequest(-3, 64, 80), ProbeRequest(-4, 128, 80)]
    assert warmup_requests(probes, 0) == []


def test_the_adaptive_design_starts_with_one_probe_of_its_initial_design():
    from ppprof.fit.design import INITIAL_REQUESTS
    from ppprof.probe.synth import DESIGN, candidate_grid, design_probe

    cfg = ProfileConfig(design="adaptive", base_chunk_size=128)
    (probe,) = make_probes(cfg)
    assert probe.kind == DESIGN and probe.design_step == 0 and len(probe.requests) == INITIAL_REQUESTS
    assert [r.rid for r in probe.requests] == list(range(INITIAL_REQUESTS))
    grid = set(zip(*candidate_grid(cfg)))
    assert {(r.prefix_len, r.chunk_size) for r in probe.requests} <= grid
    assert len({r.prefix_len for r in probe.requests}) >= 3
    # prefix 0 and 12 prefix lengths log-spaced to the context, times 12 chunk sizes from 1.25 B to B / 8
    assert len(grid) == 13 * 12 and max(p for p, _ in grid) == 32608
    nxt = design_probe(1, 1, [(0, 64), (128, 64)], 12, cfg.seed)
    assert nxt.design_step == 1 and sorted(r.rid for r in nxt.requests) == [12, 13]
    w = warmup_requests([probe], 2)
    largest = max(r.chunk_size for r in probe.requests)
    deep = sorted({r.prefix_len for r in probe.requests} - {0})
    assert [(r.prefix_len, r.chunk_size) for r in w[:2]] == [(0, largest)] * 2
    assert [r.prefix_len for r in w[2:]] == deep and all(r.rid < 0 for r in w)


def test_empty_prefix_lens_profile_the_sweep_only_as_sglang_does():
    from ppprof.run.settings import resolve_config

    cfg = resolve_config(None, {"prefix_lens": ""})
    assert cfg.prefix_lens == () and cfg.resolved_prefix_lens() == ()
    assert [p.kind for p in make_probes(cfg)] == [SWEEP] and len(make_probes(cfg)[0].requests) == 128

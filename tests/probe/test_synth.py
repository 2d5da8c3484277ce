"""Probe synthesis: the prefix grid, the probes (deterministic from the seed), the warm-up requests."""

from ppprof.config import ProfileConfig
from ppprof.probe.synth import (
    PREFIX,
    SWEEP,
    WIDE,
    WIDE_SHARE,
    ProbeRequest,
    grid_chunk_sizes,
    make_probes,
    warmup_requests,
    wide_chunk_sizes,
)


def test_grid_chunks_are_distinct_aligned_and_span_b_over_8_to_1_25b():
    grid = grid_chunk_sizes(512, 16)
    assert grid[0] == 640 and grid[-1] == 64
    assert len(grid) == len(set(grid)) == 8
    assert all(g % 16 == 0 for g in grid)


def test_wide_chunks_are_log_spaced_above_1_25b_up_to_the_largest_probe_chunk():
    assert wide_chunk_sizes(512, 2048, 16) == [2048, 1376, 928]  # 640 x 3.2^(k/3), aligned down
    assert wide_chunk_sizes(64, 256, 1) == [256, 174, 118]
    assert wide_chunk_sizes(512, 640, 16) == []  # the largest probe chunk is 1.25 B: SGLang's range only
    assert wide_chunk_sizes(8, 12, 1) == [12, 11]  # too few sizes between 10 and 12 for three


def test_probes_are_deterministic_from_the_seed_and_ids_unique():
    cfg = ProfileConfig(requests_per_probe=16, base_chunk_size=128)
    a, b = make_probes(cfg), make_probes(cfg)
    assert a == b
    c = make_probes(ProfileConfig(requests_per_probe=16, base_chunk_size=128, seed=1))
    assert [r.chunk_size for r in c[2].requests] != [r.chunk_size for r in a[2].requests]
    assert [p.kind for p in a] == [SWEEP, WIDE] + [PREFIX] * 6
    # Six prefix lengths log-spaced from B to the context length (32768) less the largest probe chunk (4 B = 512).
    assert [p.requests[0].prefix_len for p in a] == [0, 0, 128, 387, 1169, 3532, 10674, 32256]
    rids = [r.rid for p in a for r in p.requests]
    assert len(rids) == len(set(rids)) == 16 * 7 + 3
    assert [len(p.requests) for p in a] == [16, 3] + [16] * 6


def test_the_wide_sizes_take_one_request_in_eight_of_each_prefix_probe_and_a_prefix_free_probe():
    cfg = ProfileConfig(requests_per_probe=128, base_chunk_size=512, prefix_lens=(512, 4096))
    sweep, wide, *prefixed = make_probes(cfg)
    assert [r.chunk_size for r in sweep.requests] == [640 - 5 * i for i in range(128)]  # SGLang's, unchanged
    assert wide.kind == WIDE and {r.prefix_len for r in wide.requests} == {0}
    assert sorted(r.chunk_size for r in wide.requests) == sorted([2048] * 6 + [1390] * 5 + [943] * 5)  # page 1
    grid = grid_chunk_sizes(512, 1)
    for probe in prefixed:
        sizes = [r.chunk_size for r in probe.requests]
        assert len(sizes) == 128 and sum(s > 640 for s in sizes) == 128 // WIDE_SHARE
        assert {s: sizes.count(s) for s in grid} == {s: 14 for s in grid}
        assert max(sizes) == cfg.max_probe_chunk_size == 2048
    assert cfg.needed_total_tokens() == 4096 + 2048


def test_a_largest_probe_chunk_of_1_25b_gives_the_probes_of_sglangs_range_alone():
    old = make_probes(ProfileConfig(requests_per_probe=16, base_chunk_size=128, max_probe_chunk_multiple=1.25))
    assert [p.kind for p in old] == [SWEEP] + [PREFIX] * 6
    assert [p.requests[0].prefix_len for p in old] == [0, 128, 388, 1174, 3555, 10767, 32608]
    assert [r.rid for r in old[1].requests] == list(range(16, 32))
    assert {r.chunk_size for p in old[1:] for r in p.requests} == set(grid_chunk_sizes(128, 1))


def test_warmup_covers_the_sweep_and_every_prefix():
    probes = make_probes(ProfileConfig(requests_per_probe=8, base_chunk_size=64, prefix_lens=(64, 128)))
    w = warmup_requests(probes, 2)
    # two like the sweep's first, then each other probe's largest chunk at its prefix (the wide probe's at 0)
    assert w == [
        ProbeRequest(-1, 0, 80),
        ProbeRequest(-2, 0, 68),
        ProbeRequest(-3, 0, 256),
        ProbeRequest(-4, 64, 256),
        ProbeRequest(-5, 128, 256),
    ]
    assert warmup_requests(probes, 0) == []


def test_empty_prefix_lens_profile_the_sweep_only_as_sglang_does():
    from ppprof.run.resolve import resolve_config

    cfg = resolve_config(None, {"prefix_lens": "", "max_probe_chunk_multiple": 1.25, "design": "grid"})
    assert cfg.probes.prefix_lens == () and cfg.resolved_prefix_lens() == ()
    assert [p.kind for p in make_probes(cfg)] == [SWEEP] and len(make_probes(cfg)[0].requests) == 128
    wider = make_probes(
        resolve_config(None, {"prefix_lens": "", "design": "grid"})
    )  # the default multiple: wide sizes too
    assert [p.kind for p in wider] == [SWEEP, WIDE] and wider[0] == make_probes(cfg)[0]


def test_on_a_gpu_the_warmup_meets_every_timed_chunk_size_once_more():
    probes = make_probes(ProfileConfig(requests_per_probe=8, base_chunk_size=64, prefix_lens=(64, 128)))
    plain, every = warmup_requests(probes, 2), warmup_requests(probes, 2, every_size=True)
    assert every[: len(plain)] == plain  # the same first requests, then each size not met yet, without a prefix
    sizes = {r.chunk_size for p in probes for r in p.requests}
    extra = every[len(plain) :]
    assert sorted(r.chunk_size for r in extra) == sorted(sizes - {r.chunk_size for r in plain})
    assert all(r.prefix_len == 0 for r in extra) and {r.chunk_size for r in every} == sizes
    assert [r.rid for r in every] == list(range(-1, -len(every) - 1, -1))
    assert warmup_requests(probes, 0, every_size=True) == []

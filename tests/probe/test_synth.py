import pytest

from ppprof.config import ProfileConfig
from ppprof.probe.synth import (PREFIX, SWEEP, ProbeRequest, align_down, grid_chunk_sizes, make_probes,
                                sweep_chunk_sizes, warmup_requests)


def test_sweep_matches_the_linear_fall_of_sglang():
    # size_i = int(1.25 B - i * (1.25 B // 128)) for B = 8192: 10240, 10160, ..., 80
    sizes = sweep_chunk_sizes(8192, 128, 1)
    assert sizes[:3] == [10240, 10160, 10080]
    assert sizes[-1] == 10240 - 127 * 80
    assert all(a > b for a, b in zip(sizes, sizes[1:]))


def test_sweep_is_aligned_and_never_below_one_unit():
    sizes = sweep_chunk_sizes(512, 128, 64)
    assert all(s % 64 == 0 and s >= 64 for s in sizes), f"{sizes=}"
    assert sizes[0] == 640
    assert align_down(5, 64) == 64


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
    assert [r.chunk_len for r in c[1].requests] != [r.chunk_len for r in a[1].requests]
    assert [p.kind for p in a] == [SWEEP, PREFIX, PREFIX, PREFIX]
    assert [p.requests[0].prefix_len for p in a] == [0, 128, 256, 512]
    rids = [r.rid for p in a for r in p.requests]
    assert len(rids) == len(set(rids)) == 64
    assert all(len(p.requests) == 16 for p in a)


@pytest.mark.parametrize("field,value,match", [
    ("requests_per_probe", 129, "--requests-per-probe 129 is out of range: use 8..128"),
    ("requests_per_probe", 7, "--requests-per-probe 7 is out of range"),
    ("max_total_tokens", 100, "--base-chunk-size 512 does not fit the KV cache: the longest probe request needs 2688"),
    ("device", "tpu", "--device 'tpu' is not supported"),
    ("page_size", 0, "--page-size 0 must be an integer >= 1"),
    ("context_len", 600, "exceeds --context-len 600"),
])
def test_bad_settings_name_the_field_and_value(field, value, match):
    with pytest.raises(ValueError, match=match):
        ProfileConfig(**{field: value})


def test_sweep_reaches_about_b_over_128_whatever_the_number_of_requests():
    for n in (8, 16, 128):
        sizes = sweep_chunk_sizes(8192, n, 1)
        assert sizes[0] == 10240 and sizes[-1] == 80, f"{n=} {sizes[-3:]=}"
        assert len(sizes) == n


def test_warmup_covers_the_sweep_and_every_prefix():
    probes = make_probes(ProfileConfig(requests_per_probe=8, base_chunk_size=64, prefix_lens=(64, 128)))
    w = warmup_requests(probes, 2)
    assert w == [ProbeRequest(-1, 0, 80), ProbeRequest(-2, 0, 68), ProbeRequest(-3, 64, 80), ProbeRequest(-4, 128, 80)]
    assert warmup_requests(probes, 0) == []

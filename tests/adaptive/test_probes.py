"""The adaptive design's probes: the initial one, the candidate grid, the batches' probes, and the check before
launch."""

import pytest

from ppprof.adaptive import check, initial_probes
from ppprof.adaptive.design import INITIAL_REQUESTS
from ppprof.adaptive.probes import candidate_grid, design_probe, resumed_latencies, resumed_probes
from ppprof.config import ProfileConfig
from ppprof.probe.output import SamplesLog, samples_frame, write_samples
from ppprof.probe.synth import DESIGN, make_probes, warmup_requests


def test_the_adaptive_design_starts_with_one_probe_of_its_initial_design():
    cfg = ProfileConfig(design="adaptive", base_chunk_size=128)
    (probe,) = initial_probes(cfg)
    assert probe.kind == DESIGN and probe.design_step == 0 and len(probe.requests) == INITIAL_REQUESTS
    assert [r.rid for r in probe.requests] == list(range(INITIAL_REQUESTS))
    grid = set(zip(*candidate_grid(cfg)))
    assert {(r.prefix_len, r.chunk_size) for r in probe.requests} <= grid
    assert len({r.prefix_len for r in probe.requests}) >= 3
    # prefix 0 and 12 prefix lengths log-spaced to the context less 4 B, times 12 chunk sizes from 1.25 B to B / 8
    # and the 3 wide sizes up to 4 B
    assert len(grid) == 13 * 15 and max(p for p, _ in grid) == 32768 - 512
    assert sorted({c for _, c in grid})[-4:] == [160, 236, 347, 512]
    old = ProfileConfig(design="adaptive", base_chunk_size=128, max_probe_chunk_multiple=1.25)
    assert len(set(zip(*candidate_grid(old)))) == 13 * 12 and max(candidate_grid(old)[1]) == 160
    nxt = design_probe(1, 1, [(0, 64), (128, 64)], 12, cfg.probes.seed)
    assert nxt.design_step == 1 and sorted(r.rid for r in nxt.requests) == [12, 13]
    w = warmup_requests([probe], 2)
    largest = max(r.chunk_size for r in probe.requests)
    deep = sorted({r.prefix_len for r in probe.requests} - {0})
    assert [(r.prefix_len, r.chunk_size) for r in w[:2]] == [(0, largest)] * 2
    assert [r.prefix_len for r in w[2:]] == deep and all(r.rid < 0 for r in w)


def test_a_grid_profile_starts_with_every_grid_probe():
    cfg = ProfileConfig(requests_per_probe=16, base_chunk_size=128, design="grid")
    assert initial_probes(cfg) == make_probes(cfg)
    check(cfg)  # nothing to check for the grid design


@pytest.mark.parametrize(
    "settings,match",
    [
        (
            dict(prefix_lens=(512,)),
            r"the adaptive design \(the default\) with --prefix-lens 512: the candidate grid has 2 prefix lengths",
        ),
        (dict(max_requests=5), r"--max-requests 5 is below the 12 requests of the adaptive design's initial design"),
    ],
)
def test_the_check_before_launch_names_the_flag_and_the_fix(settings, match):
    with pytest.raises(ValueError, match=match):
        check(ProfileConfig(design="adaptive", **settings))


def test_a_resumed_adaptive_run_takes_back_the_probes_its_design_ran(tmp_path):
    cfg = ProfileConfig(design="adaptive", base_chunk_size=128)
    cand = list(zip(*candidate_grid(cfg)))
    probes = initial_probes(cfg)
    probes += [design_probe(1, 1, cand[:5], 100, 0), design_probe(2, 2, cand[5:12], 200, 0)]
    path = tmp_path / "samples.csv"
    latencies = [[float(10 * p.index + k) for k in range(len(p.requests))] for p in probes]
    stage_ms = [[lat, lat] for lat in latencies]
    write_samples(path, samples_frame(probes, stage_ms, latencies))
    assert resumed_probes(cfg, path) == probes  # indices, steps, requests in the order they ran
    assert resumed_latencies(SamplesLog.resumed(path).frame(), probes[:2]) == latencies[:2]
    # a probe missing from the middle ends what can be resumed
    write_samples(path, samples_frame([probes[0], probes[2]], [stage_ms[0], stage_ms[2]], [latencies[0], latencies[2]]))
    assert resumed_probes(cfg, path) == probes[:1]
    # a grid run resumes its synthesized probes; an empty samples.csv, the initial design
    grid = ProfileConfig(base_chunk_size=128, design="grid")
    assert resumed_probes(grid, path) == make_probes(grid)
    path.write_text("")
    assert resumed_probes(cfg, path) == probes[:1]

"""The probe loop on a one-rank gloo group, in process: grouped Mamba window, release on failure, leak check."""

import pytest
import torch

from ppprof.config import ProfileConfig
from ppprof.distributed.agree import RunError
from ppprof.distributed.pipe import Pipe
from ppprof.model.stage import Stage, build_stage_cache
from ppprof.probe import loop
from ppprof.probe.loop import SKIP_MAMBA_RELEASE, ProbeRunner
from ppprof.probe.synth import Probe, ProbeRequest, make_probes
from ppprof.probe.timer import Timer
from ppprof.specs import load_spec
from ppprof.specs.memory import CacheSizes


def make_runner(max_mamba_cache_size=8, fault=None):
    spec = load_spec("tiny-hybrid")
    layers = range(spec.num_layers)
    stage = Stage(spec, layers, seed=0)
    cache = build_stage_cache(
        spec,
        layers,
        CacheSizes(
            max_total_tokens=512,
            page_size=4,
            max_mamba_cache_size=max_mamba_cache_size,
            max_running_requests=4,
            context_len=512,
        ),
    )
    pipe = Pipe(rank=0, pp_size=1, device=torch.device("cpu"), hidden_size=spec.hidden_size, dtype=torch.float32)
    return ProbeRunner(stage=stage, cache=cache, pipe=pipe, seed=0, fault=fault)


def test_probe_times_every_request_and_leaves_pools_full(one_rank_group):
    runner = make_runner()
    probes = make_probes(
        ProfileConfig(
            base_chunk_size=32, requests_per_probe=8, page_size=4, prefix_lens=(64,), fit=False, design="grid"
        )
    )
    assert [len(p.requests) for p in probes] == [8, 3, 8]  # the sweep, the wide probe, the prefix probe
    for probe in probes:
        t = runner.run_probe(probe)
        assert len(t.stage_ms) == len(t.e2e_ms) == len(probe.requests)
        assert all(0 < s <= e for s, e in zip(t.stage_ms, t.e2e_ms)), f"{t=}"
    assert runner.cache.outstanding() == {"request": 0, "kv": 0, "mamba": 0}
    assert runner.forward_tokens == sum(p.forward_tokens for p in probes)


def test_the_timer_starts_right_after_a_primer_of_the_same_request_and_brackets_only_its_forward(
    one_rank_group, monkeypatch
):
    # In lockstep a rank waits through the other stages' forwards, and a forward after such a wait runs colder (and
    # slower by about a millisecond on CPU) than a running prompt's next chunk; so each timed forward follows an
    # untimed one-token forward of the same request at the chunk's position, with nothing in between.
    runner = make_runner()
    events = []
    forward = runner.stage

    def recorded_stage(cache, req, x, residual, prefix_len):
        events.append(("forward", req.rid, x.shape[0], prefix_len))
        return forward(cache, req, x, residual, prefix_len)

    class RecordedTimer(Timer):
        def __enter__(self):
            events.append(("timer start",))
            return super().__enter__()

        def __exit__(self, *exc):
            super().__exit__(*exc)
            events.append(("timer stop",))

    runner.stage = recorded_stage
    monkeypatch.setattr(loop, "Timer", RecordedTimer)
    t = runner.run_probe(Probe(1, "prefix", (ProbeRequest(5, 64, 8), ProbeRequest(6, 0, 16))))
    assert events == [
        ("forward", 5, 1, 64),
        ("timer start",),
        ("forward", 5, 8, 64),
        ("timer stop",),
        ("forward", 6, 1, 0),
        ("timer start",),
        ("forward", 6, 16, 0),
        ("timer stop",),
    ], f"{events=}"
    assert len(t.stage_ms) == 2 and all(ms > 0 for ms in t.stage_ms), f"{t=}"
    assert runner.forward_tokens == 8 + 16  # the probes' tokens; the primers are not counted


def test_grouped_window_serves_the_probe_and_is_closed_after(one_rank_group):
    runner = make_runner(max_mamba_cache_size=16)
    mamba = runner.cache.mamba_alloc
    seen = []
    orig = mamba.alloc

    def spy(n=1):
        seen.append((mamba.group_open, mamba.group_remaining()))
        return orig(n)

    mamba.alloc = spy
    runner.run_probe(Probe(0, "sweep", tuple(ProbeRequest(i, 0, 8) for i in range(8))))
    assert [open_ for open_, _ in seen] == [True] * 8
    assert [left for _, left in seen] == [8, 7, 6, 5, 4, 3, 2, 1]
    assert not mamba.group_open and mamba.available_size() == 16


def test_small_mamba_cache_falls_back_to_per_call_slots(one_rank_group):
    runner = make_runner(max_mamba_cache_size=2)
    t = runner.run_probe(Probe(0, "sweep", tuple(ProbeRequest(i, 0, 8) for i in range(12))))
    assert len(t.stage_ms) == 12


def test_a_failing_forward_releases_the_request_and_stops(one_rank_group, monkeypatch):
    runner = make_runner()

    def boom(*args, **kwargs):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(runner, "stage", boom)
    with pytest.raises(
        RunError,
        match=r"rank 0: forward of request 3 \(prefix 0, chunk 8\) raised RuntimeError: "
        "kaboom",
    ):
        runner.run_probe(Probe(0, "sweep", (ProbeRequest(3, 0, 8),)))
    assert runner.cache.outstanding() == {"request": 0, "kv": 0, "mamba": 0}
    assert not runner.cache.mamba_alloc.group_open


def test_skipped_mamba_release_is_reported_by_pool_and_count(one_rank_group):
    runner = make_runner(fault=SKIP_MAMBA_RELEASE)
    with pytest.raises(RunError, match="leak check failed after probe 0: rank 0: mamba pool leaked 3 slots"):
        runner.run_probe(Probe(0, "sweep", tuple(ProbeRequest(i, 0, 8) for i in range(3))))


def test_kv_shortage_is_a_clear_failure_not_a_hang(one_rank_group):
    runner = make_runner()
    with pytest.raises(RunError, match="KV cache too small for request 0"):
        runner.run_probe(Probe(0, "sweep", (ProbeRequest(0, 0, 4096),)))
    assert runner.cache.outstanding() == {"request": 0, "kv": 0, "mamba": 0}

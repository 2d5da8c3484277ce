"""The adaptive design's probes: its candidate grid, the probe of a batch of its points, the probes a run starts with
(the grid design's, or the adaptive design's initial one), and the check of a profile's settings before launch."""

from __future__ import annotations

import random
from pathlib import Path

import pandas as pd

from ppprof.adaptive.design import INITIAL_REQUESTS, initial_design
from ppprof.config import ProfileConfig
from ppprof.probe.output import whole_rows
from ppprof.probe.synth import DESIGN, Probe, ProbeRequest, grid_chunk_sizes, make_probes, wide_chunk_sizes

NUM_CANDIDATE_CHUNKS = 12
NUM_CANDIDATE_PREFIXES = 12
"""The adaptive design's candidate grid: prefix 0 and 12 prefix lengths log-spaced from B to the context (or
--prefix-lens where given), times 12 chunk sizes from 1.25 B down to B / 8 and the grid design's wide sizes above
1.25 B up to the largest probe chunk (3, log-spaced; none with --max-probe-chunk-multiple 1.25)."""


def candidate_grid(cfg: ProfileConfig) -> tuple[list[int], list[int]]:
    """(prefix_len, chunk_size) of every candidate of the adaptive design, as two lists."""
    prefixes = (0,) + (
        cfg.resolved_prefix_lens()
        if cfg.probes.prefix_lens is not None
        else cfg.resolved_prefix_lens(NUM_CANDIDATE_PREFIXES)
    )
    chunks = wide_chunk_sizes(cfg.probes.base_chunk_size, cfg.max_probe_chunk_size, cfg.chunk_unit) + grid_chunk_sizes(
        cfg.probes.base_chunk_size, cfg.chunk_unit, NUM_CANDIDATE_CHUNKS
    )
    pairs = [(p, c) for p in sorted(set(prefixes)) for c in chunks]
    return [p for p, _ in pairs], [c for _, c in pairs]


def design_probe(index: int, step: int, points: list[tuple[int, int]], first_rid: int, seed: int) -> Probe:
    """A probe of the adaptive design: `points` (prefix_len, chunk_size) in a seeded random order, so that repeats
    of a point are not run back to back."""
    order = list(points)
    random.Random(seed * 7919 + index).shuffle(order)
    return Probe(index, DESIGN, tuple(ProbeRequest(first_rid + i, p, c) for i, (p, c) in enumerate(order)), step)


def initial_probes(cfg: ProfileConfig) -> list[Probe]:
    """The probes known before any is timed: the grid design's, all of them (ppprof.probe.synth.make_probes); the
    adaptive design's, the one probe of its initial design (the next ones are chosen as the run goes)."""
    if cfg.probes.design != "adaptive":
        return make_probes(cfg)
    L, x = candidate_grid(cfg)
    return [design_probe(0, 0, initial_design(L, x, cfg.probes.base_chunk_size), 0, cfg.probes.seed)]


def resumed_probes(cfg: ProfileConfig, samples_path: Path) -> list[Probe]:
    """The probes of an interrupted run to resume. Grid: all of them (initial_probes). Adaptive: its initial design
    (the same again from the seed), then each probe the design chose, as samples.csv holds it (its whole rows, in the
    order they ran): the probes it chose are the ones it ran. complete_probes then keeps those samples.csv holds
    whole."""
    probes = initial_probes(cfg)
    if cfg.probes.design != "adaptive" or not samples_path.is_file() or samples_path.stat().st_size == 0:
        return probes
    frame, _ = whole_rows(samples_path)
    for index, rows in frame[frame["probe"] >= len(probes)].groupby("probe", sort=True):
        if index != len(probes):  # the probes run in order, each whole: a gap ends what can be resumed
            break
        requests = tuple(ProbeRequest(int(r.request), int(r.prefix_len), int(r.chunk_size)) for r in rows.itertuples())
        probes.append(Probe(int(index), DESIGN, requests, int(rows["design_step"].iloc[0])))
    return probes


def resumed_latencies(frame: pd.DataFrame, probes: list[Probe]) -> list[list[float]]:
    """The end-to-end latencies (latency_ms) of the whole probes samples.csv holds (`frame`, its rows as the resumed
    run read them once), a list a probe: what the adaptive design costs its next batch from (the probes it ran before
    the interruption included)."""
    if not probes:
        return []
    return [frame.loc[frame["probe"] == p.index, "latency_ms"].astype(float).tolist() for p in probes]


def check(cfg: ProfileConfig) -> None:
    """Before launch: the adaptive design's initial design exists on the candidate grid and fits in --max-requests
    (ValueError naming the flag and the fix); nothing to check for the grid design."""
    if cfg.probes.design != "adaptive":
        return
    try:
        initial_probes(cfg)
    except ValueError as e:
        raise ValueError(
            f"the adaptive design (the default) with --prefix-lens {','.join(map(str, cfg.resolved_prefix_lens()))}: "
            f"{e}; give at least two prefix lengths, or leave --prefix-lens out for the default ones, or probe "
            "these with --design grid"
        ) from None
    if cfg.probes.max_requests is not None and cfg.probes.max_requests < INITIAL_REQUESTS:
        raise ValueError(
            f"--max-requests {cfg.probes.max_requests} is below the {INITIAL_REQUESTS} requests of the "
            f"adaptive design's initial design: use at least {INITIAL_REQUESTS}"
        )

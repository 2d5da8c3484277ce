"""Synthetic samples from known coefficients, laid out as `ppprof profile` writes them (tests, demos, benchmarks)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ppprof.config import sweep_chunk_sizes
from ppprof.io import atomic_write_text
from ppprof.policy.rule import LatencyModel
from ppprof.runfiles import RunFolder, stage_column, write_run_json


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticProbes:
    """The probes make_samples lays out and the noise it draws them with."""

    base_chunk_size: int
    prefixes: Sequence[int] = ()
    chunk_sizes: Sequence[int] = ()
    repeats: int = 4
    """B (the sweep's sizes), the prefix probes' prefix lengths, their chunk sizes, requests of each chunk size."""
    noise: float = 0.02
    num_outliers: int = 0
    seed: int = 0
    """The relative noise of a row, the rows made 3 x slower, the seed of both."""
    pp_size: int = 2
    bottleneck_stage: int = 0
    """The stages, and the one that carries the latency (the others 60% of it)."""


def make_samples(model: LatencyModel, probes: SyntheticProbes) -> pd.DataFrame:
    """One sweep probe (prefix 0, SGLang's sizes) and, for each prefix, `repeats` requests of each chunk size.

    Latency = model.chunk_latency_ms(prefix_len, chunk_size) x (1 + noise N(0,1)) (for the quadratic, a prefixed row
    costs c + f(L + x) - f(L), a prefix-free one f(x)); `num_outliers` rows are multiplied by 3. The bottleneck
    stage carries that latency, the other stages 60% of it.
    """
    noise, num_outliers, pp_size, bottleneck_stage = (
        probes.noise,
        probes.num_outliers,
        probes.pp_size,
        probes.bottleneck_stage,
    )
    rng = np.random.default_rng(probes.seed)
    rows = [(0, "sweep", i, 0, x) for i, x in enumerate(sweep_chunk_sizes(probes.base_chunk_size))]
    for probe, prefix in enumerate(probes.prefixes, start=1):
        request = 0
        for x in probes.chunk_sizes:
            for _ in range(probes.repeats):
                rows.append((probe, "prefix", request, prefix, x))
                request += 1
    frame = pd.DataFrame(rows, columns=["probe", "kind", "request", "prefix_len", "chunk_size"])
    latency = model.chunk_latency_ms(frame.prefix_len, frame.chunk_size) * (1 + noise * rng.standard_normal(len(frame)))
    if num_outliers:
        hit = rng.choice(np.arange(1, len(frame)), size=num_outliers, replace=False)
        latency[hit] *= 3.0
    for stage in range(pp_size):
        frame[stage_column(stage)] = latency * (1.0 if stage == bottleneck_stage else 0.6)
    frame["latency_ms"] = latency * (1.0 + 0.6 * (pp_size - 1))
    frame["slowest_stage"] = bottleneck_stage
    return frame


@dataclass(frozen=True, slots=True, kw_only=True)
class SyntheticRun:
    """The run.json write_run_dir writes beside the samples: the settings of the run that took them."""

    base_chunk_size: int
    page_size: int = 64
    context_len: int = 131072
    """B, the KV page, the served context."""
    num_layers: int = 4
    pp_size: int = 2
    """The model's layers and the pipeline stages they were split over (one rank a stage: world_size = pp_size)."""
    min_gain: float | None = None
    pipeline_overhead: dict | None = None
    """--min-gain and the pipelined runs' pipeline_overhead, where given."""


def write_run_dir(run_dir: str | Path, frame: pd.DataFrame, run: SyntheticRun) -> Path:
    """Write samples.csv and a run.json like `ppprof profile` does (`run`); return the samples path."""
    num_layers, pp_size, min_gain = run.num_layers, run.pp_size, run.min_gain
    folder = RunFolder(run_dir)
    samples = atomic_write_text(folder.samples, frame.to_csv(index=False))
    write_run_json(
        folder.run_json,
        config={
            "model": "synthetic",
            "base_chunk_size": run.base_chunk_size,
            "page_size": run.page_size,
            "context_len": run.context_len,
            "requests_per_probe": 128,
            "num_layers": num_layers,
            "seed": 0,
        }
        | ({} if min_gain is None else {"min_gain": min_gain}),
        hardware={"device": "cpu", "device_name": "synthetic"},
        torch_version="synthetic",
        dist_backend="gloo",
        world_size=pp_size,  # the ranks: one a stage (tp_size 1)
        pp_size=pp_size,
        tp_size=1,
        layer_partition=[num_layers // pp_size] * pp_size,
        git_revision=None,
        profile_wall_s=0.0,
        forward_tokens=int(frame.prefix_len.sum() + frame.chunk_size.sum()),
        **({} if run.pipeline_overhead is None else {"pipeline_overhead": run.pipeline_overhead}),
    )
    return samples

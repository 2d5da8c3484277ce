"""What the profile job's phases hand on (ppprof.run.profile_job), typed: one rank's ProfileState."""

from __future__ import annotations

from dataclasses import dataclass, field

from ppprof.adaptive.step import DesignState
from ppprof.fit.packed import PackedRows
from ppprof.probe.loop import ProbeRunner
from ppprof.probe.output import SamplesLog
from ppprof.probe.synth import Probe, ProbeRequest
from ppprof.runfiles import RunRecord


@dataclass(slots=True)
class ProfileState:
    """What the profile job's phases hand on, in the order they fill it (rank 0 only: record, probes_done)."""

    resume: bool = False
    """--resume: finish the interrupted run in cfg.job.out."""
    overwrite: bool = False
    """--overwrite: cfg.job.out may hold files."""
    probes: list[Probe] = field(default_factory=list)
    """Every probe of the run, in order; the adaptive design appends each one it chooses."""
    first_probe: int = 0
    """The first probe not yet complete: where a resumed run starts (0 otherwise)."""
    record: RunRecord | None = None
    """Rank 0: run.json, written with status running before the first probe."""
    probes_done: int = 0
    """Rank 0: probes whose rows samples.csv holds (named when the run is interrupted)."""
    samples_log: SamplesLog | None = None
    """Rank 0: samples.csv, appended probe by probe, and its rows held in memory for the design and the fit."""
    runner: ProbeRunner | None = None
    """This rank's probe loop, built at the warm-up."""
    warmup: list[ProbeRequest] = field(default_factory=list)
    """The untimed requests run before the first probe."""
    t_probes: float = 0.0
    """time.perf_counter() when the warm-up began: the probing time counts from there."""
    attention_kernel: str | None = None
    """The attention kernel the stages ran (the first stage with attention), for run.json."""
    probe_wall_s: float = 0.0
    """Warm-up, probes and the adaptive design's choices, in seconds."""
    forward_tokens: list[int] = field(default_factory=list)
    """Per stage: tokens run forward, warm-up included."""
    peak_memory: list[int | None] = field(default_factory=list)
    """Per stage: peak device memory in bytes (None where the device does not tell)."""
    design: DesignState = field(default_factory=DesignState)
    """The probe design's stopping reason, last uncertainty and history."""
    packed: PackedRows | None = None
    """Rank 0: the packed forwards' rows, as packed.csv holds them (None: none timed)."""
    packed_wall_s: float = 0.0
    """The packed forwards, the untimed first included, in seconds (0: none timed)."""
    overhead: dict | None = None
    """Rank 0: run.json's pipeline_overhead (None: not measured, overhead_repeats 0)."""
    overhead_wall_s: float = 0.0
    """The pipeline overhead's prompts, warm-up included, in seconds."""
    tp_ranks: dict = field(default_factory=dict)
    """Under TP, run.json's per-TP-rank figures (per stage, per TP rank)."""

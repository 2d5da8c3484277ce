"""The settings of what a policy carries beyond the rule's knobs (PolicyOptions): the workload its history-only table
and its status are chosen on, the gain a dynamic policy needs, the per-chunk overhead where it is given, the pipeline
depth it plans for and whether its plans may leave the profiled domain. `ppprof profile` records the first two;
`ppprof fit` takes them all, its options winning."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ppprof.bounds import MAX_ASYNC_DEPTH, MAX_STAGES
from ppprof.checks import is_number, require_bool, require_int, short
from ppprof.config.workload import Workload

DEFAULT_MIN_GAIN = 0.02
"""A policy is dynamic when its prompt-aware rule's predicted gain over the best fixed chunk on the workload is at
least this (--min-gain)."""
MAX_OVERHEAD_MS = 1e6


@dataclass(kw_only=True, slots=True)
class PolicyOptions:
    """What `ppprof fit` (and a profile's own fit) chooses the policy's rules with."""

    workload: Workload | None = None
    """The prompt lengths and weights the rules and the status are chosen on (--prompt-lens, parsed once:
    ppprof.config.workload); default (None): lengths log-spaced from B over the profiled domain, equal weights."""
    min_gain: float = DEFAULT_MIN_GAIN
    """The least predicted gain (a fraction) of the prompt-aware rule over the best fixed chunk for a dynamic policy."""
    overhead_ms: float | None = None
    """The per-chunk pipeline overhead in ms; default: the profile's measured one (run.json), else 0."""
    pp_size: int | None = None
    """The pipeline stages the rules are chosen for; default: the profile's."""
    extrapolate: bool = False
    """Let the rules use chunks and prompts beyond the profiled domain (up to 4 B and the context length)."""
    async_depth: int = 0
    """Micro-batch slots the server keeps in flight beyond the stages (SGLang's pp_async_batch_depth, 0 by
    default), which the under-load rule is chosen at (--async-depth)."""
    load_rule: bool = True
    """Choose the under-load rule (`load`) by simulating the serving scheduler; False (--no-load-rule): the policy
    carries only the idle rules, the same chunks at every load, and the fit skips the simulation (seconds)."""

    def __post_init__(self) -> None:
        if self.workload is not None and not isinstance(self.workload, Workload):
            raise ValueError(f"workload {short(self.workload)} is not a parsed workload: parse --prompt-lens first")
        g = self.min_gain
        if not is_number(g) or not 0.0 <= g < 1.0:
            raise ValueError(f"--min-gain {short(g)} is out of range: use a fraction in [0, 1), e.g. 0.02")
        self.min_gain = float(g)
        o = self.overhead_ms
        if o is not None and (not is_number(o) or not math.isfinite(o) or not 0.0 <= o <= MAX_OVERHEAD_MS):
            raise ValueError(f"--overhead-ms {short(o)} is out of range: use ms a chunk in 0..{MAX_OVERHEAD_MS:g}")
        if o is not None:
            self.overhead_ms = float(o)
        if self.pp_size is not None:
            require_int("--pp", self.pp_size, 1, MAX_STAGES)
        require_bool("--extrapolate", self.extrapolate)
        require_bool("--load-rule", self.load_rule)
        require_int("--async-depth", self.async_depth, 0, MAX_ASYNC_DEPTH)

    def to_dict(self) -> dict:
        return asdict(self)

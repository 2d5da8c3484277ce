"""The settings of what a policy carries beyond the rule's knobs (PolicyOptions): the workload its history-only table
and its status are chosen on, the gain a dynamic policy needs, the per-chunk overhead where it is given, the pipeline
depth it plans for and whether its plans may leave the profiled domain. `ppprof profile` records the first two;
`ppprof fit` takes them all, its options winning."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from ppprof.bounds import MAX_STAGES
from ppprof.checks import is_number, require_bool, require_int, short

DEFAULT_MIN_GAIN = 0.02
"""A policy is dynamic when its prompt-aware rule's predicted gain over the best fixed chunk on the workload is at
least this (--min-gain)."""
MAX_OVERHEAD_MS = 1e6


@dataclass(kw_only=True, slots=True)
class PolicyOptions:
    """What `ppprof fit` (and a profile's own fit) chooses the policy's rules with."""

    prompt_lens: str | None = None
    """The workload: prompt lengths (tune's SPEC: a list such as 8192:3,32768:1, or a file); default: lengths
    log-spaced from B over the profiled domain, equal weights."""
    min_gain: float = DEFAULT_MIN_GAIN
    """The least predicted gain (a fraction) of the prompt-aware rule over the best fixed chunk for a dynamic policy."""
    overhead_ms: float | None = None
    """The per-chunk pipeline overhead in ms; default: the profile's measured one (run.json), else 0."""
    num_stages: int | None = None
    """The pipeline stages the rules are chosen for; default: the profile's."""
    extrapolate: bool = False
    """Let the rules use chunks and prompts beyond the profiled domain (up to 4 B and the context length)."""

    def __post_init__(self) -> None:
        if self.prompt_lens is not None and (not isinstance(self.prompt_lens, str) or not self.prompt_lens.strip()):
            raise ValueError(
                f"--prompt-lens {short(self.prompt_lens)} is invalid: give lengths like 8192,32768 or a file of them"
            )
        g = self.min_gain
        if not is_number(g) or not 0.0 <= g < 1.0:
            raise ValueError(f"--min-gain {short(g)} is out of range: use a fraction in [0, 1), e.g. 0.02")
        self.min_gain = float(g)
        o = self.overhead_ms
        if o is not None and (not is_number(o) or not math.isfinite(o) or not 0.0 <= o <= MAX_OVERHEAD_MS):
            raise ValueError(f"--overhead-ms {short(o)} is out of range: use ms a chunk in 0..{MAX_OVERHEAD_MS:g}")
        if o is not None:
            self.overhead_ms = float(o)
        if self.num_stages is not None:
            require_int("--pp", self.num_stages, 1, MAX_STAGES)
        require_bool("--extrapolate", self.extrapolate)

    def to_dict(self) -> dict:
        return asdict(self)

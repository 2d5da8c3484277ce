"""Settings of one `ppprof bench` run: the profile's settings it runs under and what it runs on them."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from ppprof.bounds import MAX_STAGES
from ppprof.checks import is_int, require_int, require_str
from ppprof.config.profile_config import ProfileConfig

DEFAULT_STRATEGIES = ("fixed", "fixed-best", "sglang", "greedy", "policy", "policy-history", "optimal")
"""What `ppprof bench` runs without --strategies. fixed: B; fixed-best: the best measured of B/4, B/2, B, 2B; sglang:
SGLang's rule with the policy's flags on SGLang's boot fit of the same samples (ppprof.servers, as `ppprof tune` scores
it); greedy: SGLang's rule on the policy's fitted model; policy: the policy's prompt-aware rule;
policy-history: its history-only table; optimal: the DP plan."""
BENCH_STRATEGIES = DEFAULT_STRATEGIES + ("policy-load",)
"""What `ppprof bench --strategies` takes: the default ones and policy-load, the policy's rules asked with the load
the bench runs at (none: one prompt at a time), through the same call a server makes under load
(Policy.plan_at_load). Its chunks are `policy`'s, so it runs only when asked for: a check that a server feeding the
load-aware call an idle scheduler's load gets the idle plan, timed."""
MAX_REPEATS = 1000
"""The most prompts a bench runs per (prompt length, strategy)."""


@dataclass(kw_only=True, slots=True)
class BenchConfig:
    """Settings of one `ppprof bench` run: the profile's settings (from the policy's run.json, flags win) and what to
    run on them."""

    policy: str
    """The policy file; its run folder (run.json, samples.csv) gives the model, split and device."""
    profile: ProfileConfig
    """The profile's settings the bench runs under (model, layers, partition, device, dtype, pools, kernels)."""
    prompt_lens: tuple[int, ...]
    """Prompt lengths in tokens."""
    strategies: tuple[str, ...] = DEFAULT_STRATEGIES
    repeats: int = 5
    """Prompts per (prompt length, strategy), interleaved: A B C A B C ..."""
    pp_size: int | None = None
    """Pipeline stages (--pp-size); None: the profile's, resolved at construction. More stages than ranks: each rank
    runs several stages one after the other and only the replay composes the pipeline (the model is repeated so every
    stage holds a profiled stage's layers)."""
    out: str | None = None
    """Run folder; default results/<time>-bench-<model>."""
    profiled_stages: int = 1
    """How many stages the profile had (from run.json's layer_partition)."""
    plans: dict | None = None
    """Extra chunk plans to run beside the strategies, {"<prompt_len>": {name: [chunk sizes]}} (`--plans`, e.g. the
    plans of `ppprof tune --json`); each runs as the arm plan-<name>."""

    forward_trace: str | None = None
    """Where every rank's forwards go as one forward trace (docs/forwards.md); None: none."""

    def __post_init__(self) -> None:
        if self.forward_trace is not None:
            require_str("--forward-trace", self.forward_trace, "a file path for the forward trace")
        if not self.prompt_lens:
            raise ValueError("--prompt-len is required: give at least one prompt length, e.g. --prompt-len 8192")
        for n in self.prompt_lens:
            require_int("--prompt-len", n, 1)
            if n > self.profile.probes.context_len:
                raise ValueError(
                    f"--prompt-len {n} exceeds the context length {self.profile.probes.context_len} of the "
                    "profile: use a shorter prompt or profile with a larger --context-len"
                )
        unknown = [s for s in self.strategies if s not in BENCH_STRATEGIES]
        if unknown or not self.strategies:
            raise ValueError(
                f"--strategies {','.join(self.strategies)!r} is invalid: use a comma-separated subset "
                f"of {','.join(BENCH_STRATEGIES)}"
            )
        require_int("--repeats", self.repeats, 1, MAX_REPEATS)
        require_int("profiled_stages", self.profiled_stages, 1)
        if self.plans is not None:
            check_plans(self.plans, self.prompt_lens)
        if self.out is not None:
            require_str("--out", self.out, "a folder path")
        if self.pp_size is None:
            self.pp_size = self.profiled_stages
        require_int("--pp", self.pp_size, 1, MAX_STAGES)
        if self.pp_size % self.profiled_stages:
            raise ValueError(
                f"--pp {self.pp_size} is not a multiple of the profile's {self.profiled_stages} stages: "
                f"use a multiple, e.g. {2 * self.profiled_stages}"
            )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["pp"] = d.pop("pp_size")  # bench.json's name of the field
        d["profile"] = self.profile.to_dict()
        d["prompt_lens"], d["strategies"] = list(self.prompt_lens), list(self.strategies)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> BenchConfig:
        d, profile = dict(d), dict(d["profile"])
        d["pp_size"] = d.pop("pp", None)
        for key in ("prefix_lens", "layer_partition"):
            profile[key] = None if profile.get(key) is None else tuple(profile[key])
        d["profile"] = ProfileConfig(**profile)
        d["prompt_lens"], d["strategies"] = tuple(d["prompt_lens"]), tuple(d["strategies"])
        return cls(**d)


def check_plans(plans, prompt_lens) -> None:
    """ValueError (one line) unless `plans` is {"<prompt_len>": {name: [chunk sizes summing to prompt_len]}} with a
    plan for every prompt length."""
    if not isinstance(plans, dict) or not plans:
        raise ValueError(
            '--plans must hold {"<prompt_len>": {name: [chunk sizes]}}: give the JSON of `ppprof tune '
            "--json` or such an object"
        )
    for n in prompt_lens:
        if str(n) not in plans:
            raise ValueError(
                f"--plans has no plan for --prompt-len {n}: it has {', '.join(plans)}; tune or give that length"
            )
    for key, named in plans.items():
        if not isinstance(named, dict) or not named:
            raise ValueError(f"--plans[{key!r}] must be an object of named chunk lists")
        for name, chunks in named.items():
            if not isinstance(name, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_-]{0,31}", name):
                raise ValueError(f"--plans[{key!r}] name {name!r} is invalid: use lower-case letters, digits, - or _")
            if not isinstance(chunks, list) or not chunks or not all(is_int(c) and c >= 1 for c in chunks):
                raise ValueError(f"--plans[{key!r}][{name!r}] must be a non-empty list of positive integers")
            if str(sum(chunks)) != key:
                raise ValueError(
                    f"--plans[{key!r}][{name!r}] chunks sum to {sum(chunks)}, not the prompt length {key}: fix the plan"
                )

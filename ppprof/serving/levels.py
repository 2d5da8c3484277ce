"""A serving bench's load levels, simulated (`ppprof serve-bench --simulate`): the levels read from their flags and
checked in one line, and every arm served at every level on the policy's planning model, each batch priced as one
packed forward (with the policy's cost of each piece beyond the first, where its packed forwards needed one). Pure:
no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ppprof.bounds import MAX_ASYNC_DEPTH, MAX_STAGES
from ppprof.checks import require_int
from ppprof.config.workload import Workload
from ppprof.policy.runtime import Policy
from ppprof.serving.arms import SERVING_ARMS, packed_stage_ms, sizer
from ppprof.serving.scheduler import Capacity
from ppprof.serving.simulate import Arrivals, LoadLevel, prompts_of, serve

MAX_CONCURRENCY = 4096
MAX_RATE = 1e6
MAX_NUM_PROMPTS = 100_000
DEFAULT_REQUEST_ENTRIES = 128
"""Requests the simulated pools hold at once (SGLang's --max-running-requests of a prefill server, and a profile's
default): KV slots for that many of the longest prompt."""


def parse_levels(concurrency: str | None, rate: str | None) -> list[LoadLevel]:
    """--concurrency 1,2,4 or --request-rate 0.5,2 (exactly one of them) as load levels; ValueError (one line)."""
    if (concurrency is None) == (rate is None):
        raise ValueError("give --concurrency LIST or --request-rate LIST (one of them), e.g. --concurrency 1,2,4")
    flag, text = ("--concurrency", concurrency) if concurrency is not None else ("--request-rate", rate)
    items = [s.strip() for s in text.split(",")]
    if not items or not all(items):
        raise ValueError(f"{flag} {text!r} has an empty item: give comma-separated values, e.g. 1,2,4")
    levels = []
    for item in items:
        if concurrency is not None:
            if not item.isdigit() or not 1 <= int(item) <= MAX_CONCURRENCY:
                raise ValueError(f"{flag} value {item!r} must be a whole number of requests in 1..{MAX_CONCURRENCY}")
            levels.append(LoadLevel(concurrency=int(item)))
        else:
            try:
                value = float(item)
            except ValueError:
                raise ValueError(f"{flag} value {item!r} is not a number: give requests a second, e.g. 2.5") from None
            if not math.isfinite(value) or not 0 < value <= MAX_RATE:
                raise ValueError(f"{flag} value {item} must be a positive number of requests a second, at most 1e6")
            levels.append(LoadLevel(rate=value))
    return levels


def parse_arms(text: str | None) -> tuple[str, ...]:
    """--strategies: a comma-separated subset of SERVING_ARMS (default: all)."""
    if text is None:
        return SERVING_ARMS
    arms = tuple(s.strip() for s in text.split(",") if s.strip())
    unknown = [a for a in arms if a not in SERVING_ARMS]
    if not arms or unknown:
        raise ValueError(f"--strategies {text!r} is invalid: use a comma-separated subset of {','.join(SERVING_ARMS)}")
    return arms


@dataclass(frozen=True, slots=True)
class ServingPlan:
    """What a simulated serving bench runs: the levels, the arms, the prompts of a level, the layout."""

    levels: tuple[LoadLevel, ...]
    arms: tuple[str, ...]
    workload: Workload
    num_prompts: int
    pp_size: int
    async_depth: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        require_int("--num-prompts", self.num_prompts, 1, MAX_NUM_PROMPTS)
        require_int("--pp-size", self.pp_size, 1, MAX_STAGES)
        require_int("--async-depth", self.async_depth, 0, MAX_ASYNC_DEPTH)
        require_int("--seed", self.seed, 0, 2**32 - 1)


def simulate_levels(policy: Policy, plan: ServingPlan) -> dict:
    """serving.json's body: for each level and arm, the served summary (throughput, TTFT mean and quantiles, the
    stages' idle fraction, chunks per request, requests per batch). Every level serves the same prompts."""
    if policy.planning_model is None:
        raise ValueError(
            f"the policy has no latency model ({policy.status}: {policy.reason}): the simulation prices batches "
            "with it; profile again"
        )
    prompts = prompts_of(plan.workload.prompt_lens, plan.workload.weights, plan.num_prompts, plan.seed)
    stage_ms = packed_stage_ms(policy.planning_model, plan.pp_size, policy.extra_piece_ms)
    out = {}
    for level in plan.levels:
        entries = level.concurrency or DEFAULT_REQUEST_ENTRIES
        capacity = max(prompts) * entries
        out[level.name] = {
            arm: serve(
                plan.pp_size,
                sizer(policy, arm),
                stage_ms,
                Capacity(capacity, entries),
                Arrivals(prompts, level, plan.seed),
                plan.async_depth,
            ).summary()
            for arm in plan.arms
        }
    return {
        "mode": "simulated",
        "pp_size": plan.pp_size,
        "async_depth": plan.async_depth,
        "num_prompts": plan.num_prompts,
        "seed": plan.seed,
        "workload": plan.workload.to_dict(),
        "prompt_lens": prompts,
        "levels": out,
    }

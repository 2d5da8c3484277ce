"""The chunk plans a bench runs: for each prompt length, one per strategy (fixed sizes around B, SGLang's rule on a
quadratic fit of the profile's samples, the policy's greedy rule, the DP-optimal plan), each with the TTFT the policy
predicts. Pure: no torch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ppprof.chunks import align_down, walk
from ppprof.fit.build import fit_samples
from ppprof.fit.samples import read_run, read_samples
from ppprof.policy.planners import fixed_chunks, optimal_chunks, predicted
from ppprof.config import ChunkSettings
from ppprof.policy.rule import LatencyModel, next_chunk_size
from ppprof.policy.schema import Policy



@dataclass(frozen=True, slots=True)
class Arm:
    """One chunk plan the bench runs: `name` is a strategy, or fixed-<size> for each size of the fixed sweep."""

    name: str
    prompt_len: int
    chunk_sizes: tuple[int, ...]
    predicted_ttft_ms: float
    predicted_ms: tuple[float, ...]


def fixed_sizes(base_chunk_size: int, alignment: int, sweep: bool) -> list[int]:
    """B alone, or with `sweep` the distinct aligned sizes B/4, B/2, B, 2B."""
    if not sweep:
        return [base_chunk_size]
    return sorted({align_down(base_chunk_size * k // 4, alignment) for k in (1, 2, 4, 8)})


def rule_chunks(model: LatencyModel, settings: ChunkSettings, target_ms: float, prompt_len: int) -> list[int]:
    """The chunks the equal-latency rule gives with this model (the last chunk takes the rest)."""
    return walk(lambda done: next_chunk_size(model, settings, target_ms, done), prompt_len)


def sglang_model(policy: Policy, samples_path: Path) -> tuple[LatencyModel, float] | None:
    """SGLang's model of the same samples: the prefix-free quadratic and its target, or None where SGLang would turn
    dynamic chunking off (no fit, or a <= 0)."""
    samples = read_samples(samples_path)
    fitted = fit_samples(samples, read_run(samples_path), policy.settings, "quadratic")
    if fitted["latency_model"] is None or fitted["target_latency_ms"] is None:
        return None
    model = LatencyModel.from_dict(fitted["latency_model"])
    return (model, fitted["target_latency_ms"]) if model.a > 0 else None


def arms(policy: Policy, samples_path: Path | None, prompt_lens, strategies, num_stages: int,
         extra: dict | None = None) -> list[Arm]:
    """Every plan to run: for each prompt length, each requested strategy (fixed-best as its fixed sweep), and the
    `extra` plans ({"<prompt_len>": {name: chunks}}, `--plans`) as plan-<name>."""
    settings, model = policy.settings, policy.model
    sglang = sglang_model(policy, samples_path) if "sglang" in strategies and samples_path else None
    out = []
    for prompt_len in prompt_lens:
        plans: dict[str, list[int]] = {}
        for size in fixed_sizes(settings.base_chunk_size, settings.alignment, "fixed-best" in strategies):
            plans[f"fixed-{size}"] = fixed_chunks(size, prompt_len)
        if "fixed" in strategies:
            plans[f"fixed-{settings.base_chunk_size}"] = fixed_chunks(settings.base_chunk_size, prompt_len)
        if "sglang" in strategies:
            plans["sglang"] = (rule_chunks(sglang[0], settings, sglang[1], prompt_len) if sglang
                               else fixed_chunks(settings.base_chunk_size, prompt_len))
        if "greedy" in strategies:
            plans["greedy"] = policy.plan(prompt_len)
        for name, chunks in ((extra or {}).get(str(prompt_len)) or {}).items():
            plans[f"plan-{name}"] = list(chunks)
        if "optimal" in strategies:
            # The DP may use chunks as large as any other plan here (2 B with the fixed sweep), and starts from all
            # of them: it is the bound no plan of the bench beats, by the policy's model.
            seeds = [c for name, c in plans.items()] or [fixed_chunks(settings.base_chunk_size, prompt_len)]
            largest = max([settings.base_chunk_size, settings.max_chunk_size] + [max(c) for c in seeds])
            plans["optimal"], _ = optimal_chunks(model, prompt_len, num_stages, settings.alignment, largest, seeds)
        for name, chunks in plans.items():
            plan = predicted(model, name, chunks, num_stages)
            out.append(Arm(name, prompt_len, tuple(plan.chunk_sizes), plan.ttft_ms, tuple(plan.latencies_ms)))
    return out

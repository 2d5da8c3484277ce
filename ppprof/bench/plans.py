"""The chunk plans a bench runs: for each prompt length, one per strategy (fixed sizes around B, a server's rule on
that server's boot fit of the profile's samples, SGLang's rule on the policy's model, the policy's prompt-aware rule and
history-only table, the DP-optimal plan), each with the TTFT the policy predicts on its planning model (the fitted
latency plus the per-chunk overhead). Pure: no torch."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ppprof.chunks import align_down
from ppprof.fit.samples import read_samples
from ppprof.policy.planners import fixed_chunks, optimal_chunks, predicted
from ppprof.policy.runtime import Policy
from ppprof.servers import REGISTRY, Server


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


def server_plan(server: Server, policy: Policy, samples_path: Path | None) -> Callable[[int], list[int]]:
    """The chunks `server` prefills a prompt in with the policy's flags (what `ppprof export` writes) and dynamic
    chunking on, with the model it would have: its boot fit of the profile's samples where given (else derived from
    the policy's model), as `ppprof tune` scores it. Without a model it would use, its fixed chunks."""
    forwards = read_samples(samples_path) if samples_path is not None and server.fits_at_boot else None
    model = server.model_for(policy, forwards)
    setting = replace(server.setting_of(policy), dynamic=model is not None)
    context_len = policy.settings.context_len
    return lambda prompt_len: server.chunks(setting, model, context_len, prompt_len)


def arms(
    policy: Policy, samples_path: Path | None, prompt_lens, strategies, pp_size: int, extra: dict | None = None
) -> list[Arm]:
    """Every plan to run: for each prompt length, each requested strategy (fixed-best as its fixed sweep), and the
    `extra` plans ({"<prompt_len>": {name: chunks}}, `--plans`) as plan-<name>."""
    settings, model = policy.settings, policy.planning_model
    servers = {
        name: server_plan(server, policy, samples_path) for name, server in REGISTRY.items() if name in strategies
    }
    out = []
    for prompt_len in prompt_lens:
        plans: dict[str, list[int]] = {}
        sweep = fixed_sizes(settings.base_chunk_size, settings.alignment, "fixed-best" in strategies)
        best = policy.fixed_best_chunk
        if "fixed-best" in strategies and best:  # the policy's own best fixed chunk on its workload
            sweep = sorted(set(sweep) | {best})
        for size in sweep:
            plans[f"fixed-{size}"] = fixed_chunks(size, prompt_len)
        if "fixed" in strategies:
            plans[f"fixed-{settings.base_chunk_size}"] = fixed_chunks(settings.base_chunk_size, prompt_len)
        for name, chunks_of in servers.items():
            plans[name] = chunks_of(prompt_len)
        if "greedy" in strategies:
            plans["greedy"] = policy.sglang_plan(prompt_len)
        if "policy" in strategies:
            plans["policy"] = policy.plan(prompt_len)
        if "policy-history" in strategies:
            plans["policy-history"] = policy.plan_history(prompt_len)
        if "policy-load" in strategies:  # a bench runs one prompt at a time: no other request has prefill work
            plans["policy-load"] = policy.plan_at_load(prompt_len, pending_requests=0, pending_tokens=0)
        for name, chunks in ((extra or {}).get(str(prompt_len)) or {}).items():
            plans[f"plan-{name}"] = list(chunks)
        if "optimal" in strategies:
            # The DP may use chunks as large as any other plan here (2 B with the fixed sweep), and starts from all
            # of them: it is the bound no plan of the bench beats, by the policy's model.
            seeds = [c for name, c in plans.items()] or [fixed_chunks(settings.base_chunk_size, prompt_len)]
            largest = max([settings.base_chunk_size, settings.max_chunk_size] + [max(c) for c in seeds])
            plans["optimal"], _ = optimal_chunks(model, prompt_len, pp_size, settings.alignment, largest, seeds)
        for name, chunks in plans.items():
            plan = predicted(model, name, chunks, pp_size)
            out.append(Arm(name, prompt_len, tuple(plan.chunk_sizes), plan.ttft_ms, tuple(plan.latencies_ms)))
    return out

"""`ppprof tune --concurrency`: a server setting scored under load as well as alone. The server's chunks of the longest
prompt become a sizer (the chunk after a prefix is the rule's chunk from there, as the server sizes its chunked
request), and the serving simulation (ppprof.serving.simulate) serves the workload's prompts at each closed-loop
concurrency with it, each batch priced as one packed forward on the policy's planning model. Pure: no torch."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from ppprof.config.workload import Workload
from ppprof.policy.runtime import Policy
from ppprof.policy.tables import table_chunk_size
from ppprof.serving.arms import packed_stage_ms, sizer
from ppprof.serving.scheduler import Capacity
from ppprof.serving.simulate import Arrivals, LoadLevel, prompts_of, serve
from ppprof.serving.underload import LOAD_PROMPTS, LOAD_SEED

LoadScore = Callable[[np.ndarray], dict]
"""The server's chunks of the longest prompt -> {"concurrency-L": {"throughput_tokens_per_s", "ttft_mean_ms",
"ttft_p90_ms"}} at each level."""


def load_prompts(workload: Workload, concurrency: Sequence[int]) -> list[int]:
    """The prompts every level serves, as the fit's under-load choice draws them: LOAD_PROMPTS, or twice the highest
    concurrency where that is more, seed LOAD_SEED."""
    return prompts_of(workload.prompt_lens, workload.weights, max(LOAD_PROMPTS, 2 * max(concurrency)), LOAD_SEED)


def policy_load_figures(policy: Policy, workload: Workload, pp_size: int, concurrency: Sequence[int]) -> dict:
    """What ppprof's own sizer gives at each level on the same prompts (the `policy-load` arm: the policy's idle rules
    and its under-load rule, fed the scheduler's load), beside the server settings `tune --concurrency` scores."""
    if policy.planning_model is None:
        raise ValueError(f"--concurrency needs a latency model; the policy has none ({policy.reason}): refit it")
    prompts = load_prompts(workload, concurrency)
    stage_ms = packed_stage_ms(policy.planning_model, pp_size, policy.extra_piece_ms)
    out = {}
    for level in concurrency:
        capacity = Capacity(max(prompts) * level, level)
        summary = serve(
            pp_size, sizer(policy, "policy-load"), stage_ms, capacity, Arrivals(prompts, LoadLevel(concurrency=level))
        ).summary()
        out[f"concurrency-{level}"] = {
            "throughput_tokens_per_s": summary["throughput_tokens_per_s"],
            "ttft_mean_ms": summary["ttft_ms"]["mean"],
            "ttft_p90_ms": summary["ttft_ms"]["p90"],
        }
    return out


def load_scorer(policy: Policy, workload: Workload, pp_size: int, concurrency: Sequence[int]) -> LoadScore:
    """Scores a chunk list at each closed-loop `concurrency`: the prompts of load_prompts (drawn from `workload` as
    the fit draws them for the under-load rule), `pp_size` stages, the policy's planning model."""
    if policy.planning_model is None:
        raise ValueError(f"--concurrency needs a latency model; the policy has none ({policy.reason}): refit it")
    prompts = load_prompts(workload, concurrency)
    stage_ms = packed_stage_ms(policy.planning_model, pp_size, policy.extra_piece_ms)

    memo: dict[tuple[int, ...], dict] = {}  # settings of one server often chunk alike

    def score(chunks: np.ndarray) -> dict:
        key = tuple(int(c) for c in chunks)
        if key not in memo:
            memo[key] = served(list(key))
        return memo[key]

    def served(sizes: list[int]) -> dict:
        starts = [0, *np.cumsum(sizes[:-1]).tolist()]
        if len(sizes) > 1:  # the last is the longest prompt's rest, not the rule's chunk: the one before stands for it
            sizes[-1] = max(sizes[-1], sizes[-2])

        def sizer(prefix_len: int, prompt_len: int, load) -> int:
            return table_chunk_size(starts, sizes, prefix_len)

        out = {}
        for level in concurrency:
            capacity = Capacity(max(prompts) * level, level)
            summary = serve(
                pp_size, sizer, stage_ms, capacity, Arrivals(prompts, LoadLevel(concurrency=level))
            ).summary()
            out[f"concurrency-{level}"] = {
                "throughput_tokens_per_s": summary["throughput_tokens_per_s"],
                "ttft_mean_ms": summary["ttft_ms"]["mean"],
                "ttft_p90_ms": summary["ttft_ms"]["p90"],
            }
        return out

    return score

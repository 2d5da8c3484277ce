"""What the policy carries, chosen on its planning model (the fitted chunk latency plus the per-chunk pipeline
overhead): the prompt-aware rule, the history-only table for a workload, the best fixed chunk, and the status that
follows from the gain over it. Pure numpy; no torch."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ppprof.config import ChunkSettings
from ppprof.config.policy import DEFAULT_MIN_GAIN
from ppprof.config.workload import Workload
from ppprof.policy.bounded import rule_table
from ppprof.policy.builders import build_history_rule, build_prompt_rule
from ppprof.policy.optimum import EXTRAPOLATED_CHUNKS, Domain, make_domain
from ppprof.policy.planners import chunk_latencies_ms, fixed_chunks, ttft_ms
from ppprof.policy.rule import LatencyModel
from ppprof.policy.tables import PromptRule

DEFAULT_WORKLOAD_LENGTHS = 16
"""Prompt lengths of the default workload: log-spaced from B to the longest prompt of the domain, equal weights."""


def rule_domain(settings: ChunkSettings, measured: dict | None, extrapolate: bool) -> Domain:
    """Where the policy's rules and the DP plan: chunks up to the largest profiled chunk and prompts whose prefixes
    stay within the largest profiled prefix (the prompt one token past it at most), within the context; with
    `extrapolate`, chunks up to EXTRAPOLATED_CHUNKS x B and prompts up to the context length."""
    context = settings.context_len
    B, align = settings.base_chunk_size, settings.alignment
    if measured and measured.get("chunk_size") and measured.get("prefix_len"):
        largest, deepest = int(measured["chunk_size"][1]), int(measured["prefix_len"][1])
    else:
        largest, deepest = B, context
    if extrapolate:
        largest, deepest = max(largest, EXTRAPOLATED_CHUNKS * B), context
    largest = min(max(largest, align), context)
    return make_domain(align, largest, max(1, min(context, deepest + 1)))


def default_workload(settings: ChunkSettings, dom: Domain) -> tuple[list[int], list[float]]:
    """DEFAULT_WORKLOAD_LENGTHS prompt lengths log-spaced from B to the domain's longest prompt, equal weights."""
    lo = min(settings.base_chunk_size, dom.max_prompt_len)
    lengths = sorted({int(round(v)) for v in np.geomspace(lo, dom.max_prompt_len, DEFAULT_WORKLOAD_LENGTHS)})
    return lengths, [1.0 / len(lengths)] * len(lengths)


@dataclass(slots=True)
class Choice:
    """The policy's rules and what they are predicted to give on the workload (weighted mean TTFT, ms)."""

    prompt_rule: PromptRule
    history_table: dict
    history_bound_ms: float
    history_chunk_cap: int
    fixed_chunk: int
    predicted: dict
    status: str
    reason: str


def mean_ttft(model: LatencyModel, plans: list[list[int]], weights, pp_size: int) -> float:
    """The weighted mean predicted TTFT of the plans."""
    return sum(w * ttft_ms(chunk_latencies_ms(model, chunks), pp_size) for chunks, w in zip(plans, weights))


def choose(
    model: LatencyModel,
    settings: ChunkSettings,
    dom: Domain,
    pp_size: int,
    workload: Workload,
    min_gain: float = DEFAULT_MIN_GAIN,
    confidence: Callable[[PromptRule], dict] | None = None,
) -> Choice:
    """Build the prompt-aware rule and the history-only table on the planning `model`, score them and the fixed
    chunks on the `workload` (its prompt lengths and weights), and set the status: dynamic when the prompt-aware rule's gain over the best fixed chunk
    is at least `min_gain` and so is its lower bound (`confidence(rule)`: the gain's interval over resampled fits,
    ppprof.fit.confidence; none: the gain itself), else static at the best fixed chunk."""
    lengths, weights = list(workload.prompt_lens), list(workload.weights)
    prompt_rule, quality = build_prompt_rule(model, dom, pp_size)
    history = build_history_rule(model, dom, pp_size, lengths, weights)
    starts, sizes = rule_table(model, history.bound_ms, history.chunk_cap, dom.unit, dom.max_prompt_len)
    table = {"prefix_len": starts, "chunk_size": sizes}
    prompt_mean = mean_ttft(model, [prompt_rule.plan(int(n)) for n in lengths], weights, pp_size)
    base = fixed_mean(model, settings.base_chunk_size, lengths, weights, pp_size)
    gain = 1.0 - prompt_mean / history.fixed_mean_ttft_ms
    predicted = {
        "num_stages": pp_size,
        "max_ratio_to_optimum": quality["max_ratio"],
        "bands": quality["bands"],
        "mean_ttft_ms": {
            "policy": prompt_mean,
            "policy-history": history.mean_ttft_ms,
            "fixed-best": history.fixed_mean_ttft_ms,
            "fixed": base,
        },
        "fixed_best_chunk": history.fixed_chunk,
        "gain_vs_fixed_best": gain,
        "history_gap_to_policy": history.mean_ttft_ms / prompt_mean - 1.0,
    }
    numbers = (
        f"predicted mean TTFT on the workload: prompt-aware rule {prompt_mean:.1f} ms, history-only "
        f"{history.mean_ttft_ms:.1f} ms, best fixed chunk ({history.fixed_chunk}) "
        f"{history.fixed_mean_ttft_ms:.1f} ms, fixed B ({settings.base_chunk_size}) {base:.1f} ms"
    )
    if (interval := confidence(prompt_rule) if confidence else None) is not None:
        predicted["gain_interval"] = interval
    verdict = gain_verdict(gain, interval, min_gain)
    if gain >= min_gain and (interval is None or interval["lower"] >= min_gain):
        status, reason = "dynamic", f"{verdict}; {numbers}"
        return Choice(
            prompt_rule, table, history.bound_ms, history.chunk_cap, history.fixed_chunk, predicted, status, reason
        )
    reason = f"{verdict}: fixed chunks of {history.fixed_chunk}; {numbers}"
    fixed = history.fixed_chunk
    return Choice(
        PromptRule.fixed(fixed),
        {"prefix_len": [0], "chunk_size": [fixed]},
        math.inf,
        fixed,
        fixed,
        predicted,
        "static",
        reason,
    )


def fixed_mean(model: LatencyModel, size: int, lengths, weights, pp_size: int) -> float:
    """The weighted mean predicted TTFT of fixed chunks of `size`."""
    return mean_ttft(model, [fixed_chunks(size, int(n)) for n in lengths], weights, pp_size)


def gain_verdict(gain: float, interval: dict | None, min_gain: float) -> str:
    """The status's reason in one clause: the gain over the best fixed chunk and, where resampled, its lower bound,
    against `min_gain`: no gain (the gain below it), a gain the samples cannot tell from none (its lower bound below
    it), or a gain they can."""
    if gain < min_gain:
        return f"no gain: {gain:.1%} over the best fixed chunk is below {min_gain:.1%}"
    if interval is None:
        return f"gain {gain:.1%} over the best fixed chunk >= {min_gain:.1%}"
    bound = (
        f"its lower bound {interval['lower']:.1%} (the {interval['quantile']:.0%} quantile of "
        f"{interval['resamples']} resampled fits; 80% interval {interval['lower']:.1%} to {interval['upper']:.1%})"
    )
    if interval["lower"] < min_gain:
        return (
            f"gain {gain:.1%} over the best fixed chunk, but {bound} is below {min_gain:.1%}: the samples cannot "
            "tell it from no gain"
        )
    return f"gain {gain:.1%} over the best fixed chunk, {bound} >= {min_gain:.1%}"

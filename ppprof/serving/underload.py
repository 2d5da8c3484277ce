"""The under-load rule a policy carries (policy.json's `load`), chosen at fit time on the policy's own planning model:
the serving simulation (ppprof.serving.simulate) of closed-loop levels, each batch priced as one packed forward, the
policy's idle rules while the chunked request is alone and each candidate bounded rule once others wait, scored on
input throughput and mean TTFT against the best candidate at each level. Pure: no torch."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from ppprof.policy.bounded import rule_table
from ppprof.policy.runtime import Policy
from ppprof.policy.tables import LoadRule
from ppprof.serving.arms import packed_stage_ms, sizer
from ppprof.serving.scheduler import Capacity
from ppprof.serving.simulate import LoadLevel, prompts_of, serve

LOAD_LEVELS = (2, 4, 8)
"""The closed-loop concurrencies the rule is chosen at (at 1 no other request waits: the idle rules answer)."""
LOAD_PROMPTS = 24
"""Prompts a level serves, drawn from the policy's workload: enough for the closed loop to settle, few enough that
the choice costs well under a second on a profile's model."""
LOAD_SEED = 0
NUM_CANDIDATES = 8
"""First chunks tried: log-spaced multiples of the rules' unit from the smaller of B and the best fixed chunk up to
the largest chunk the prompt-aware rule gives (the profiled domain's), with B and the best fixed chunk."""
BOUND_FACTORS = (1.0, 1.5, 2.0)
"""Each first chunk x gives fixed chunks of x and the bounded rules whose bound is t(0, x) times each factor: the
first chunk x, or larger, then chunks of equal predicted latency (so that the stages' batches stay even)."""


def candidates(policy: Policy) -> list[int]:
    """The under-load chunks tried (NUM_CANDIDATES, B and the best fixed chunk), ascending."""
    unit, top = int(policy.data["prompt_table"]["unit"]), policy.prompt_rule.largest_chunk
    B, best = policy.base_chunk_size, policy.fixed_best_chunk or policy.base_chunk_size
    low = max(unit, min(B, best, top))
    spaced = {max(unit, int(round(x / unit)) * unit) for x in np.geomspace(low, top, NUM_CANDIDATES)}
    return sorted(x for x in spaced | {B, best} if unit <= x <= top)


def level_rules(policy: Policy) -> list[tuple[float, int, list[int], list[int]]]:
    """The candidate rules of one level, (bound_ms, chunk_cap, prefix_len starts, chunk sizes), distinct tables:
    fixed chunks of each candidate (no bound) and the bounded rules of BOUND_FACTORS up to the largest chunk."""
    model, unit = policy.planning_model, int(policy.data["prompt_table"]["unit"])
    top, end = policy.prompt_rule.largest_chunk, int(policy.data["prompt_table"]["max_prompt_len"])
    out, seen = [], set()
    for x in candidates(policy):
        first = float(model.chunk_latency_ms(0, x)) * (1.0 + 1e-12)
        for bound, cap in [(math.inf, x), *((first * f, top) for f in BOUND_FACTORS)]:
            starts, sizes = rule_table(model, bound, cap, unit, end)
            if (tuple(starts), tuple(sizes)) not in seen:
                seen.add((tuple(starts), tuple(sizes)))
                out.append((bound, cap, starts, sizes))
    return out


def level_figures(
    policy: Policy, rule: LoadRule | None, prompts: list[int], concurrency: int, async_depth: int = 0
) -> tuple[float, float]:
    """(input throughput in tokens/s, mean TTFT in ms) of `prompts` served at `concurrency` by the policy with the
    under-load rule `rule` (None: its idle rules at every load), `async_depth` slots beyond the stages."""
    arm = replace(policy, load_rule=rule)
    stage_ms = packed_stage_ms(policy.planning_model, policy.pp_size, policy.extra_piece_ms)
    capacity = Capacity(max(prompts) * concurrency, concurrency)
    level = LoadLevel(concurrency=concurrency)
    summary = serve(
        policy.pp_size, sizer(arm, "policy-load"), stage_ms, capacity, prompts, level, async_depth=async_depth
    ).summary()
    return summary["throughput_tokens_per_s"], summary["ttft_ms"]["mean"]


def loss(figures: tuple[float, float], best: tuple[float, float]) -> float:
    """How far a candidate is from the best at a level: the larger of its throughput shortfall and its mean TTFT
    excess, relative (0: the best on both)."""
    return max(best[0] / figures[0] - 1.0, figures[1] / best[1] - 1.0)


Scored = list[tuple[LoadRule | None, list[tuple[float, float]]]]
"""Candidate rules (None: the idle rules at every load) with their figures at each of LOAD_LEVELS."""


def bests(scored: Scored) -> list[tuple[float, float]]:
    """The best throughput and the best mean TTFT at each level over the candidates."""
    return [(max(f[i][0] for _, f in scored), min(f[i][1] for _, f in scored)) for i in range(len(LOAD_LEVELS))]


def worst_losses(scored: Scored) -> list[float]:
    """Each candidate's largest loss over the levels."""
    best = bests(scored)
    return [max(loss(f, b) for f, b in zip(figures, best)) for _, figures in scored]


def composed(scored: Scored) -> LoadRule | None:
    """Each level's own best candidate (the idle rules too: None) from the pending requests that level's concurrency
    can show and the level below it cannot (LOAD_LEVELS 2, 4, 8: from 1, 2 and 4 pending); the idle rules below the
    first level whose best is a rule (the handover), a level whose best is the idle rules past it keeping the rule
    below, equal neighbours merged. None where the idle rules are best at every level."""
    best, parts = bests(scored), []
    for i in range(len(LOAD_LEVELS)):
        rule = min(scored, key=lambda s: loss(s[1][i], best[i]))[0]
        if rule is not None and (not parts or parts[-1][1] != rule):
            parts.append((1 if i == 0 else LOAD_LEVELS[i - 1], rule))
    if not parts:
        return None
    columns = [[getattr(r, k)[0] for _, r in parts] for k in ("bound_ms", "chunk_cap", "prefix_len", "chunk_size")]
    return LoadRule([k for k, _ in parts], *columns)


def scored_rules(policy: Policy, prompts: list[int], async_depth: int = 0) -> Scored:
    """The candidates, scored: the idle rules, each candidate rule of one level (level_rules) from one pending
    request on, the rule of each level's own best (composed), and the best of these handed over only once the
    pending requests hold B tokens, or the largest chunk's (handover_tokens)."""

    def scored(rule: LoadRule | None):
        return rule, [level_figures(policy, rule, prompts, c, async_depth) for c in LOAD_LEVELS]

    singles = [LoadRule([1], [b], [cap], [starts], [sizes]) for b, cap, starts, sizes in level_rules(policy)]
    out = [scored(None), *(scored(rule) for rule in singles)]
    rule = composed(out)
    out = out if rule is None or rule in singles else [*out, scored(rule)]
    best = out[int(np.argmin(worst_losses(out)))][0]
    if best is None:
        return out
    tokens = sorted({policy.base_chunk_size, policy.prompt_rule.largest_chunk})
    return out + [scored(replace(best, handover_tokens=t)) for t in tokens]


def choose_load(policy: Policy, async_depth: int = 0) -> tuple[dict | None, dict]:
    """(policy.json's `load`, what it was chosen on) for `policy`: the scored candidate (scored_rules) whose worst
    loss over LOAD_LEVELS is least, served with `async_depth` slots beyond the stages (the server's
    pp_async_batch_depth); no `load` where that is the idle rules. Both None without a planning model."""
    if policy.planning_model is None:
        return None, {}
    workload = policy.data["workload"]
    prompts = prompts_of(workload["prompt_lens"], workload["weights"], LOAD_PROMPTS, LOAD_SEED)
    scored = scored_rules(policy, prompts, async_depth)
    worst = worst_losses(scored)
    chosen = int(np.argmin(worst))
    rule, figures = scored[chosen]
    best, idle = bests(scored), scored[0][1]
    levels = [
        {
            "concurrency": c,
            "throughput_tokens_per_s": {"policy-load": figures[i][0], "policy": idle[i][0], "best": best[i][0]},
            "ttft_mean_ms": {"policy-load": figures[i][1], "policy": idle[i][1], "best": best[i][1]},
        }
        for i, c in enumerate(LOAD_LEVELS)
    ]
    chosen_on = {"num_prompts": LOAD_PROMPTS, "seed": LOAD_SEED, "async_depth": async_depth, "levels": levels}
    evidence = chosen_on | {"candidates": len(scored), "worst_loss": worst[chosen], "idle_worst_loss": worst[0]}
    return (None if rule is None else rule.to_dict() | chosen_on), evidence

"""The under-load rule a policy carries (policy.json's `load`, ppprof.policy.tables.LoadRule), chosen at fit time for
robustness: each candidate (a full pipeline's chunk table and how many times over the work must fill the slots) is
served by the serving simulation (ppprof.serving.simulate) of the policy's planning model over a family of workloads
(the policy's own, single lengths across its prompts, a long-tailed mix) at closed-loop levels up to 2 x the slots
and at Poisson loads, each batch priced as one packed forward; the rule kept is the one whose worst loss against the
best candidate of each cell is least, and never worse than the idle rules by more than NOISE in any cell, or none
(the idle rules) where no candidate beats them. Pure: no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ppprof.policy.runtime import Policy
from ppprof.policy.tables import LoadRule
from ppprof.serving.arms import packed_stage_ms, sizer
from ppprof.serving.scheduler import Capacity
from ppprof.serving.simulate import Arrivals, LoadLevel, prompts_of, serve

LOAD_PROMPTS = 24
"""The fewest prompts a level serves (twice the concurrency where that is more): enough for the closed loop to
settle, few enough that the choice costs seconds on a profile's model."""
LOAD_SEED = 0
NUM_CANDIDATES = 8
"""First chunks tried: log-spaced multiples of the rules' unit from the smaller of B and the best fixed chunk up to
the largest chunk the prompt-aware rule gives (the profiled domain's), with B and the best fixed chunk."""
BOUND_FACTORS = (1.0, 1.5, 2.0)
"""Each first chunk x gives fixed chunks of x and the bounded rules whose bound is t(0, x) times each factor: the
first chunk x, or larger, then chunks of equal predicted latency (so that the stages' batches stay even)."""
FILLS = (1.0, 2.0, 3.0, 4.0, 6.0)
"""How many times over the work must fill the slots (LoadRule.fill)."""
FLOOR_FRACTIONS = (None, 0.25, 0.5, 1.0)
"""The least chunk of a candidate (LoadRule.floor), fractions of B: None, the idle rules' chunk (chunks only grow
under load); a fraction, a floor under which a share below the idle chunk may cut the work (a deep pipeline with few
short prompts waiting holds more batches so)."""
SCREEN_FILL = 3.0
BOUNDS_KEPT = 2
"""Full-pipeline bounds kept from the first screen (every bound at SCREEN_FILL with no floor)."""
FINALISTS = 6
"""Candidates kept from the second screen (the kept bounds with every fill and floor) for the whole family."""
SINGLE_FRACTIONS = (1 / 16, 1 / 4, 1 / 2, 1.0)
"""Single-length workloads, fractions of the longest prompt the rules plan for."""
TAIL_LENGTHS = 8
"""The long-tailed mix: lengths log-spaced from 1/64 of the longest prompt to it, weights falling as 1/length."""
RATE_FRACTIONS = (0.5, 0.9)
"""Poisson loads: these fractions of the idle rules' throughput at the highest closed-loop level, in requests a
second of the workload's mean prompt."""
NOISE = 0.01
"""A candidate worse than the idle rules by more than this (throughput or mean TTFT, relative) in any cell is not
kept: the under-load rule is never worse than the policy's idle rules beyond the noise of a measurement."""
POISSON_ENTRIES = 128
"""Requests the pools hold under Poisson arrivals (serve-bench's default)."""


@dataclass(frozen=True, slots=True)
class Cell:
    """One workload served at one load level."""

    workload: str
    prompts: tuple[int, ...]
    level: LoadLevel

    @property
    def name(self) -> str:
        return f"{self.workload} at {self.level.name}"


def candidates(policy: Policy) -> list[int]:
    """The first chunks tried (NUM_CANDIDATES, B and the best fixed chunk), ascending."""
    unit, top = int(policy.data["prompt_table"]["unit"]), policy.prompt_rule.largest_chunk
    B, best = policy.base_chunk_size, policy.fixed_best_chunk or policy.base_chunk_size
    low = max(unit, min(B, best, top))
    spaced = {max(unit, int(round(x / unit)) * unit) for x in np.geomspace(low, top, NUM_CANDIDATES)}
    return sorted(x for x in spaced | {B, best} if unit <= x <= top)


def full_bounds(policy: Policy) -> list[tuple[float, int]]:
    """The full pipeline's candidate (bound_ms, chunk_cap), distinct: fixed chunks of each first chunk x (no bound, cap
    x) and the bounded rules whose bound is t(0, x) times each of BOUND_FACTORS, up to the largest chunk."""
    model, top = policy.planning_model, policy.prompt_rule.largest_chunk
    out = []
    for x in candidates(policy):
        first = float(model.chunk_latency_ms(0, x)) * (1.0 + 1e-12)
        out += [(math.inf, x), *((first * f, top) for f in BOUND_FACTORS)]
    return list(dict.fromkeys(out))


def slots_of(policy: Policy, async_depth: int) -> int:
    return policy.pp_size + async_depth


def closed_levels(slots: int) -> list[int]:
    """The closed-loop concurrencies scored: 2, 3 and the slots' half, whole, one and a half and double, up to
    2 x slots (at 1 nothing else waits and every candidate runs the idle rules)."""
    return sorted({2, 3, *(max(2, round(slots * f)) for f in (0.5, 1.0, 1.5, 2.0))})


def workloads(policy: Policy, num_prompts: int) -> list[tuple[str, list[int]]]:
    """The family a rule is chosen on, (name, prompt lengths in arrival order): the policy's own workload, single
    lengths across its prompts (SINGLE_FRACTIONS of the longest), a long-tailed mix (TAIL_LENGTHS)."""
    own = policy.report.workload
    unit, longest = int(policy.data["prompt_table"]["unit"]), int(policy.data["prompt_table"]["max_prompt_len"])
    out = [("policy's workload", prompts_of(own["prompt_lens"], own["weights"], num_prompts, LOAD_SEED))]
    for n in dict.fromkeys(max(unit, int(longest * f) // unit * unit) for f in SINGLE_FRACTIONS):
        out.append((f"{n}-token prompts", [n] * num_prompts))
    tail = sorted({max(unit, int(n) // unit * unit) for n in np.geomspace(longest / 64, longest, TAIL_LENGTHS)})
    weights = [1.0 / n for n in tail]
    out.append(("long-tailed mix", prompts_of(tail, weights, num_prompts, LOAD_SEED)))
    return out


def served(
    policy: Policy, rule: LoadRule | None, cell: Cell, async_depth: int, memo: Memo | None = None
) -> tuple[float, float]:
    """(input throughput in tokens/s, mean TTFT in ms) of `cell` served by the policy with the under-load rule `rule`
    (None: its idle rules at every load), `async_depth` slots beyond the stages. With a memo, its sizer and the
    batches' prices are kept there for the next cell."""
    memo = {} if memo is None else memo
    arm = memo.get(("sizer", rule))
    if arm is None:
        arm = memo[("sizer", rule)] = sizer(replace(policy, load_rule=rule), "policy-load")
    stage_ms = memo.get("prices")
    if stage_ms is None:
        stage_ms = memo["prices"] = packed_stage_ms(policy.planning_model, policy.pp_size, policy.extra_piece_ms)
    entries = cell.level.concurrency or POISSON_ENTRIES
    capacity = Capacity(max(cell.prompts) * entries, entries)
    summary = serve(
        policy.pp_size, arm, stage_ms, capacity, Arrivals(list(cell.prompts), cell.level, LOAD_SEED), async_depth
    ).summary()
    return summary["throughput_tokens_per_s"], summary["ttft_ms"]["mean"]


Memo = dict
"""Figures already served, by (rule, cell): the simulation is deterministic, and the screens and the final scoring
ask for the same (rule, cell) again (the idle rules in every round, the first screen's candidates in the second).
Beside them, each rule's sizer (("sizer", rule)) and the batches' prices ("prices"), whose answers repeat across
cells."""


def served_once(policy: Policy, rule: LoadRule | None, cell: Cell, async_depth: int, memo: Memo) -> tuple[float, float]:
    """served(), each (rule, cell) once per memo."""
    key = (rule, cell)
    if key not in memo:
        memo[key] = served(policy, rule, cell, async_depth, memo)
    return memo[key]


def cells(policy: Policy, async_depth: int, memo: Memo | None = None) -> list[Cell]:
    """Every workload of the family at every closed-loop level and at the Poisson loads (RATE_FRACTIONS of the idle
    rules' throughput at the highest closed-loop level)."""
    levels = closed_levels(slots_of(policy, async_depth))
    num_prompts = max(LOAD_PROMPTS, 2 * levels[-1])
    out = []
    for name, prompts in workloads(policy, num_prompts):
        out += [Cell(name, tuple(prompts), LoadLevel(concurrency=c)) for c in levels]
        top = served_once(policy, None, out[-1], async_depth, {} if memo is None else memo)[0]
        rate = top / float(np.mean(prompts))
        out += [Cell(name, tuple(prompts), LoadLevel(rate=f * rate)) for f in RATE_FRACTIONS]
    return out


def loss(figures: tuple[float, float], best: tuple[float, float]) -> float:
    """How far a candidate is from the best at a cell: the larger of its throughput shortfall and its mean TTFT
    excess, relative (0: the best on both)."""
    return max(best[0] / figures[0] - 1.0, figures[1] / best[1] - 1.0)


Scored = list[tuple[LoadRule | None, list[tuple[float, float]]]]
"""Candidate rules (None: the idle rules at every load) with their figures in each cell."""


def bests(scored: Scored) -> list[tuple[float, float]]:
    """The best throughput and the best mean TTFT in each cell over the candidates."""
    num_cells = len(scored[0][1])
    return [(max(f[i][0] for _, f in scored), min(f[i][1] for _, f in scored)) for i in range(num_cells)]


def worst_losses(scored: Scored) -> list[float]:
    """Each candidate's largest loss over the cells."""
    best = bests(scored)
    return [max(loss(f, b) for f, b in zip(figures, best)) for _, figures in scored]


def within_noise(figures: list[tuple[float, float]], idle: list[tuple[float, float]]) -> bool:
    """Never worse than the idle rules by more than NOISE, in throughput or mean TTFT, in any cell."""
    return all(f[0] >= (1.0 - NOISE) * i[0] and f[1] <= (1.0 + NOISE) * i[1] for f, i in zip(figures, idle))


def rules_of(policy: Policy, bounds, fills, floors, async_depth: int) -> list[LoadRule]:
    """Every candidate of `bounds` x `fills` x `floors` (fractions of B, None: the idle chunk), distinct."""
    unit, slots, B = int(policy.data["prompt_table"]["unit"]), slots_of(policy, async_depth), policy.base_chunk_size
    out = []
    for bound, cap in bounds:
        for floor in floors:
            least = None if floor is None else min(cap, max(unit, int(B * floor) // unit * unit))
            out += [LoadRule(slots, fill, unit, bound, cap, least) for fill in fills]
    return list(dict.fromkeys(out))


def robust_choice(scored: Scored) -> int:
    """The index of the candidate kept: of those never worse than the idle rules (scored[0]) beyond NOISE in any
    cell, the one whose worst loss is least (the first of equals), where that is below the idle rules' own; 0 (the
    idle rules) otherwise."""
    worst, idle = worst_losses(scored), scored[0][1]
    kept = [k for k in range(1, len(scored)) if within_noise(scored[k][1], idle)]
    chosen = min(kept, key=lambda k: worst[k], default=0)
    return chosen if worst[chosen] < worst[0] else 0


def screen_cells(family: list[Cell]) -> list[Cell]:
    """The policy's workload, the shortest and a middle single length (fewer where the family has fewer), each at
    the smallest, a middle and the largest closed-loop level: where the candidates differ most, for the screens."""
    closed = sorted({c.level.concurrency for c in family if c.level.concurrency})
    picks = {closed[0], closed[len(closed) // 2], closed[-1]}
    names = list(dict.fromkeys(c.workload for c in family))
    names = {names[min(k, len(names) - 1)] for k in (0, 1, 1 + len(SINGLE_FRACTIONS) // 2)}
    return [c for c in family if c.workload in names and c.level.concurrency in picks]


def scored_rules(policy: Policy, family: list[Cell], async_depth: int = 0, memo: Memo | None = None) -> Scored:
    """The idle rules and the finalists, scored in every cell of `family`. Two screens on a few cells
    (screen_cells): every full-pipeline bound at SCREEN_FILL with no floor, the BOUNDS_KEPT of least worst loss
    kept; those with every fill of FILLS and floor of FLOOR_FRACTIONS, the FINALISTS of least worst loss among those
    within NOISE of the idle rules there (the others after them) kept."""
    screen, memo = screen_cells(family), {} if memo is None else memo

    def scored(rules: list[LoadRule | None], where: list[Cell]) -> Scored:
        return [(r, [served_once(policy, r, c, async_depth, memo) for c in where]) for r in rules]

    bounds = full_bounds(policy)
    first = scored([None, *rules_of(policy, bounds, [SCREEN_FILL], [None], async_depth)], screen)
    order = np.argsort(worst_losses(first)[1:], kind="stable")[:BOUNDS_KEPT]
    kept = [bounds[int(k)] for k in order]
    second = scored([None, *rules_of(policy, kept, FILLS, FLOOR_FRACTIONS, async_depth)], screen)
    worst, idle = worst_losses(second), second[0][1]
    rank = sorted(range(1, len(second)), key=lambda k: (not within_noise(second[k][1], idle), worst[k]))
    return scored([None, *(second[k][0] for k in rank[:FINALISTS])], family)


def choose_load(policy: Policy, async_depth: int = 0) -> tuple[dict | None, dict]:
    """(policy.json's `load`, what it was chosen on) for `policy`: of the scored candidates (scored_rules) never
    worse than the idle rules beyond NOISE, the one whose worst loss over the cells is least, where that is below
    the idle rules' own; no `load` (the idle rules at every load) otherwise. Both None without a planning model."""
    if policy.planning_model is None:
        return None, {}
    idle_policy, memo = replace(policy, load_rule=None), {}
    family = cells(idle_policy, async_depth, memo)
    scored = scored_rules(idle_policy, family, async_depth, memo)
    worst, idle = worst_losses(scored), scored[0][1]
    chosen = robust_choice(scored)
    rule, figures = scored[chosen]
    best = bests(scored)
    losses = [loss(f, b) for f, b in zip(figures, best)]
    at = int(np.argmax(losses))
    evidence = {
        "num_prompts": len(family[0].prompts),
        "seed": LOAD_SEED,
        "async_depth": async_depth,
        "slots": slots_of(policy, async_depth),
        "candidates": len(scored),
        "worst_loss": worst[chosen],
        "worst_at": family[at].name,
        "idle_worst_loss": worst[0],
        "idle_worst_at": family[int(np.argmax([loss(f, b) for f, b in zip(idle, best)]))].name,
        "cells": [
            {
                "workload": c.workload,
                "level": c.level.name,
                "throughput_tokens_per_s": {"policy-load": figures[i][0], "policy": idle[i][0], "best": best[i][0]},
                "ttft_mean_ms": {"policy-load": figures[i][1], "policy": idle[i][1], "best": best[i][1]},
            }
            for i, c in enumerate(family)
        ],
    }
    if rule is None:
        return None, evidence
    keys = ("num_prompts", "seed", "async_depth", "worst_loss", "worst_at", "idle_worst_loss")
    return rule.to_dict() | {k: evidence[k] for k in keys}, evidence

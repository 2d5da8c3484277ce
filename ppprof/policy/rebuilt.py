"""The checks across the contract's parts: the model predicts a positive latency, a static policy's tables are one
fixed chunk, a parity policy's are SGLang's rule, a dynamic one's are the bounded rules their bounds give on the
planning model, and the under-load rule reads the rules' unit within their domain. Pure Python, as a server runs
them at load (ppprof.policy.contract.bounded_chunk, the sizer's own arithmetic); `policy` is a
ppprof.policy.runtime.Policy, which imports this module when it reads one."""

from __future__ import annotations

import math

from ppprof.policy.contract import LatencyModel, bounded_chunk


def check_positive(policy) -> None:
    """The fitted and the calibrated model predict a positive latency for the smallest chunk."""
    smallest = policy.settings.alignment
    t = float(policy.latency_model.one_chunk_ms(0, smallest))
    if not t > 0:
        raise ValueError(
            f"$.latency_model: predicts {t:.4g} ms for a {smallest}-token chunk: a latency must be "
            "positive; refit the samples"
        )
    t = float(policy.planning_model.one_chunk_ms(0, smallest))
    if not t > 0:
        raise ValueError(
            f"$.calibration: the calibrated model predicts {t:.4g} ms for a {smallest}-token chunk: "
            "a latency must be positive; refit the samples"
        )


def check_rules(policy) -> None:
    """What `ppprof validate` checks beyond the parts, ValueError (one line) on the first problem: the model
    predicts a positive latency for the smallest chunk; a static policy's tables are one fixed chunk; a dynamic one's
    tables are the bounded rules their bounds give on the planning model (checked at every breakpoint, both sides)."""
    if policy.latency_model is not None:
        check_positive(policy)
    check_load_tables(policy)
    history, prompt_rule = policy.history_table, policy.prompt_rule
    if policy.status == "static":
        if (
            len(history.chunk_size) != 1
            or prompt_rule.prompt_len != [1]
            or prompt_rule.chunk_size != [history.chunk_size]
        ):
            raise ValueError("$.table: a static policy's table and prompt_table must be the one fixed chunk: refit")
        return
    if policy.report.parity is not None:  # SGLang's own rule on SGLang's fit
        from ppprof.policy.rule import build_table  # only a parity policy's check reads SGLang's rule

        starts, sizes = build_table(policy.latency_model, policy.settings, policy.target_ms)
        if (
            (starts, sizes) != (history.prefix_len, history.chunk_size)
            or prompt_rule.chunk_size != [sizes]
            or prompt_rule.prefix_len != [starts]
        ):
            raise ValueError("$.table: a parity policy's tables must be SGLang's rule from its coefficients: refit")
        return
    table, unit = policy.data["table"], policy.data["prompt_table"]["unit"]
    model = policy.planning_model
    check_bounded("$.table", model, table["bound_ms"], table["chunk_cap"], unit, history.prefix_len, history.chunk_size)
    for i, bound in enumerate(prompt_rule.bound_ms):
        starts, sizes = prompt_rule.prefix_len[i], prompt_rule.chunk_size[i]
        check_bounded(f"$.prompt_table.band[{i}]", model, bound, prompt_rule.largest_chunk, unit, starts, sizes)


def check_load_tables(policy) -> None:
    """The under-load rule's cap within the rules' unit and the largest chunk the prompt-aware rule gives (the domain
    the model was profiled on), its unit the prompt-aware rule's, and the planning model it reads there."""
    rule, top = policy.load_rule, policy.prompt_rule.largest_chunk
    if rule is None:
        return
    if policy.planning_model is None:
        raise ValueError("$.load: an under-load rule needs the latency model it was chosen on: refit")
    unit = policy.data["prompt_table"]["unit"]
    if rule.unit != unit:
        raise ValueError(f"$.load.unit: {rule.unit} is not prompt_table.unit {unit}: refit")
    if rule.floor is not None and not unit <= rule.floor <= rule.chunk_cap:
        raise ValueError(f"$.load.floor: {rule.floor} is outside {unit}..{rule.chunk_cap}, the unit to the rule's cap")
    if not unit <= rule.chunk_cap <= top:
        raise ValueError(
            f"$.load.full.chunk_cap: {rule.chunk_cap} is outside {unit}..{top}, the rules' unit to largest chunk"
        )


def check_bounded(
    where: str, model: LatencyModel, bound: float | None, cap: int, unit: int, starts: list[int], sizes: list[int]
) -> None:
    """The table is the bounded rule (bound, cap) on the model: its size at each breakpoint, then just before each
    next one. ValueError naming the first entry that differs."""
    bound = math.inf if bound is None else float(bound)
    at = starts + [s - 1 for s in starts[1:]]
    for L, want in zip(at, sizes + sizes[:-1]):
        got = bounded_chunk(model, bound, cap, L, unit)
        if got != want:
            raise ValueError(
                f"{where}: chunk {want} at prefix_len {L} is not the rule's {got} "
                "from the coefficients, overhead and bound: refit"
            )

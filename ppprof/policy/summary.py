"""A policy in words: the one-line summary `ppprof validate` prints, the calibration, and the note where a
prompt's plan leaves what the profile measured."""

from __future__ import annotations

import math

from ppprof.policy.rule import LatencyModel
from ppprof.policy.runtime import Policy


def calibration_text(calibration) -> str:
    """The calibration onto the pipelined runs (a Calibration, or the file's dict) in words ("" where none)."""
    if calibration.get("source") != "measured":
        return ""
    return f", calibration {LatencyModel.calibration_words(calibration)}"


def summary_line(policy: Policy) -> str:
    """One line: status, model, the rules' sizes and the profiled domain."""
    history = policy.history_table.chunk_size
    if policy.status == "static":
        return (
            f"static (chunk {history[0]}): {policy.reason}{load_text(policy)}{domain_text(policy)}{packed_text(policy)}"
        )
    prompt_rule = policy.prompt_rule
    sizes = [x for band in prompt_rule.chunk_size for x in band]
    return (
        f"dynamic ({policy.latency_model.name}, overhead {policy.overhead_ms:.3g} ms a chunk"
        f"{calibration_text(policy.calibration)}, {policy.pp_size} "
        f"stages): prompt-aware rule of {len(prompt_rule.prompt_len)} bands, chunks {min(sizes)}-{max(sizes)}; "
        f"history-only table of {len(history)} entries{gain_text(policy)}{load_text(policy)}{domain_text(policy)}"
        f"{packed_text(policy)}"
    )


def gain_text(policy: Policy) -> str:
    """The predicted gain over the best fixed chunk and, where the fit resampled it, its interval ("" without)."""
    predicted = policy.report.predicted or {}
    gain, interval = predicted.get("gain_vs_fixed_best"), predicted.get("gain_interval")
    if gain is None:
        return ""
    if not isinstance(interval, dict):
        return f"; gain {gain:.1%} over the best fixed chunk"
    share = 1.0 - 2.0 * interval["quantile"]
    return (
        f"; gain {gain:.1%} over the best fixed chunk ({share:.0%} interval {interval['lower']:.1%} to "
        f"{interval['upper']:.1%} over {interval['resamples']} resampled fits)"
    )


def verbose_lines(policy: Policy) -> list[str]:
    """What `ppprof validate --verbose` adds: the model's checks (which decide), the per-row gates (diagnostics) and
    the gain's interval."""
    diag = policy.report.diagnostics or {}
    lines = []
    for title, key in (("check (decides)", "gates"), ("per-row gate (diagnostic)", "row_gates")):
        for g in diag.get(key) or ():
            verdict = "passed" if g.get("passed") else "failed"
            lines.append(f"  {title} {g['name']} = {g['value']:.4g} {g['op']} {g['limit']:g}: {verdict}")
    interval = (policy.report.predicted or {}).get("gain_interval")
    if isinstance(interval, dict):
        lines.append(
            f"  gain over the best fixed chunk: lower bound {interval['lower']:.2%} (quantile {interval['quantile']:g}), "
            f"median {interval['median']:.2%}, upper {interval['upper']:.2%}; {interval['share_above_threshold']:.0%} "
            f"of the replicates at the threshold or above; {interval['method']}"
        )
    return lines or ["  no checks recorded (a parity policy, or one written by older code)"]


def load_text(policy: Policy) -> str:
    """The under-load rule in words: when it hands over, its chunks and the evidence it was chosen on (its worst
    loss against the best candidate, and where), or that the policy has none (a schema 4 rule named as not read)."""
    rule, load = policy.load_rule, policy.data.get("load")
    if rule is None and load is not None:
        return (
            f"; its schema {policy.data['schema_version']} under-load rule (a count of pending requests) is not read, "
            "the same chunks at every load: refit with `ppprof fit` for the full-pipeline rule"
        )
    if rule is None:
        evidence = (policy.report.diagnostics or {}).get("under_load") or {}
        if "skipped" in evidence:
            return f"; no under-load rule ({evidence['skipped']}: the same chunks at every load)"
        if "idle_worst_loss" in evidence:
            return (
                f"; no under-load rule: no candidate beat the idle rules robustly (their worst loss "
                f"{evidence['idle_worst_loss']:.1%}, at {evidence['idle_worst_at']})"
            )
        return "; no under-load rule (the same chunks at every load)"
    bound = f"{rule.bound_ms:.0f} ms" if math.isfinite(rule.bound_ms) else "no bound"
    text = (
        f"; under load, once the work fills {rule.fill:g} x {rule.slots} slots, chunks of one latency up to {bound} "
        f"and {rule.chunk_cap} tokens"
    )
    if "worst_loss" in load:
        text += (
            f" (chosen for its worst loss {load['worst_loss']:.1%}, at {load['worst_at']}; the idle rules' "
            f"{load['idle_worst_loss']:.1%})"
        )
    return text


def packed_text(policy: Policy) -> str:
    """How the model priced the profile's packed forwards, in words ("" where the policy scored none): the additive
    form's median and worst error (on the model, and on the probes' own latencies), and the cost of each extra piece
    where the price takes one."""
    packed = policy.report.packed_forwards
    if not isinstance(packed, dict):
        return ""
    add, probes = packed["additive"], packed.get("additive_on_probes")
    text = (
        f"; {packed['forwards']} packed forwards held out: additive form median error {add['median_ape']:.1%}, "
        f"worst {add['worst_ape']:.1%}"
    )
    if isinstance(probes, dict):
        text += f" (on the probes' latencies {probes['median_ape']:.1%}, worst {probes['worst_ape']:.1%})"
    extra = packed.get("extra_piece")
    if not packed["extra_piece_ms"] or not isinstance(extra, dict):
        return text + ", no term added"
    return text + (
        f"; with {packed['extra_piece_ms']:.3g} ms a piece beyond the first {extra['median_ape']:.1%}, "
        f"worst {extra['worst_ape']:.1%}"
    )


def domain_text(policy: Policy) -> str:
    dom = policy.report.domain
    if not isinstance(dom, dict):
        return ""
    (p0, p1), (c0, c1) = dom["prefix_len"], dom["chunk_size"]
    return f"; profiled prefixes {p0}-{p1}, chunks {c0}-{c1}"


def extrapolation(policy: Policy, prompt_len: int, chunk_sizes: list[int] | None = None) -> str | None:
    """A one-line note when a prompt's chunks lie outside what the profile measured (policy["domain"]): how far past
    the largest profiled prefix (or chunk) the latency model is asked; None inside the domain or without one."""
    dom = policy.report.domain
    if not isinstance(dom, dict) or not dom.get("prefix_len") or not dom.get("chunk_size"):
        return None
    chunks = chunk_sizes or policy.plan(prompt_len)
    deepest, largest = prompt_len - chunks[-1], max(chunks)
    (_, max_prefix), (_, max_chunk) = dom["prefix_len"], dom["chunk_size"]
    notes = []
    if deepest > max_prefix:
        notes.append(
            f"prefixes up to {deepest}, {deepest / max(max_prefix, 1):.2f}x the largest profiled prefix ({max_prefix})"
        )
    if largest > max_chunk:
        notes.append(f"chunks up to {largest}, {largest / max_chunk:.2f}x the largest profiled chunk ({max_chunk})")
    if not notes:
        return None
    return (
        f"prompt {prompt_len} reaches " + " and ".join(notes) + ": the latency model is extrapolated there; "
        "profile with --prefix-lens (or --context-len) covering it"
    )


def typical_prompt_len(policy: Policy) -> int | None:
    """The workload's weighted median prompt length (the policy's `workload`), None where it records none."""
    workload = policy.report.workload
    if not isinstance(workload, dict) or not workload.get("prompt_lens"):
        return None
    lens, weights = workload["prompt_lens"], workload.get("weights") or [1.0] * len(workload["prompt_lens"])
    pairs = sorted(zip(lens, weights))
    total, seen = sum(w for _, w in pairs), 0.0
    for length, weight in pairs:
        seen += weight
        if seen >= total / 2:
            return int(length)
    return int(pairs[-1][0])


def decision_words(policy: Policy) -> str:
    """The decision in words: dynamic or static, the gain over the best fixed chunk and its interval."""
    predicted = policy.report.predicted or {}
    gain, interval, best = (predicted.get(k) for k in ("gain_vs_fixed_best", "gain_interval", "fixed_best_chunk"))
    if gain is None:
        return f"{policy.status}: {policy.reason}"
    spread, sure = "", "at or above the threshold"
    if isinstance(interval, dict):
        sure = "surely above the threshold"
        spread = (
            f" ({1.0 - 2.0 * interval['quantile']:.0%} interval {interval['lower']:.1%} to {interval['upper']:.1%})"
        )
    best_text = f" ({best} tokens)" if best else ""
    if policy.status == "dynamic":
        return (
            f"dynamic: the policy's chunks cut the workload's predicted mean TTFT by {gain:.1%}{spread} against the "
            f"best fixed chunk{best_text}, {sure}"
        )
    return (
        f"static: keep fixed chunks of {policy.history_table.chunk_size[0]} tokens; dynamic chunks would cut the "
        f"predicted mean TTFT by {gain:.1%}{spread}, not surely above the threshold"
    )


def summary_block(policy: Policy, policy_path: str) -> list[str]:
    """What a user reads first of a policy, in a few lines: the decision, what it means for a typical prompt of the
    workload (predicted TTFT under the policy against fixed B), the model and its domain, the rule under load."""
    from ppprof.policy.planners import plan_prompt

    lines = [f"ok {policy_path}", f"  decision: {decision_words(policy)}"]
    prompt_len = typical_prompt_len(policy)
    if prompt_len is not None and policy.latency_model is not None:
        try:
            plans = {p.strategy: p for p in plan_prompt(policy, prompt_len, policy.pp_size, ("policy", "fixed"))}
        except ValueError:
            plans = {}
        if plans:
            mine, fixed = plans["policy"], plans["fixed"]
            lines.append(
                f"  a typical prompt ({prompt_len} tokens, the workload's median): predicted TTFT "
                f"{mine.ttft_ms:.1f} ms under the policy ({len(mine.chunk_sizes)} chunk{'s' * (len(mine.chunk_sizes) != 1)}) against {fixed.ttft_ms:.1f} "
                f"ms with fixed {policy.base_chunk_size}-token chunks ({fixed.ttft_ms / mine.ttft_ms - 1:+.1%} with fixed)"
            )
    model = policy.latency_model.name if policy.latency_model is not None else "none"
    lines.append(f"  model: {model}, {policy.pp_size} stages{domain_text(policy)}")
    under_load = load_text(policy).removeprefix("; ")
    if under_load.startswith("under load"):
        under_load = under_load.removeprefix("under load").lstrip(", ")
    lines.append(f"  under load: {under_load}")
    return lines


def next_commands(policy_path: str, prompt_len: int | None) -> list[str]:
    """The commands to run next on a policy, with its real path."""
    n = prompt_len or 8192
    return [
        f"ppprof plan {policy_path} --prompt-len {n}",
        f"ppprof bench {policy_path} --prompt-len {n}",
        f"ppprof serve-bench {policy_path} --concurrency 1,2,4",
        f"ppprof export {policy_path} --server sglang",
    ]

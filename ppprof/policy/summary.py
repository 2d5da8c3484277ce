"""A policy in words: the one-line summary `ppprof validate` prints, the pipelined level, and the note where a
prompt's plan leaves what the profile measured."""

from __future__ import annotations

import math

from ppprof.policy.rule import LatencyModel
from ppprof.policy.runtime import Policy


def calibration_text(calibration: dict) -> str:
    """The calibration onto the pipelined level in words ("" where none)."""
    if calibration.get("source") != "measured":
        return ""
    return f", pipelined level {LatencyModel.calibration_words(calibration)}"


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
    predicted = policy.data.get("predicted") or {}
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
    diag = policy.data.get("diagnostics") or {}
    lines = []
    for title, key in (("check (decides)", "gates"), ("per-row gate (diagnostic)", "row_gates")):
        for g in diag.get(key) or ():
            verdict = "passed" if g.get("passed") else "failed"
            lines.append(f"  {title} {g['name']} = {g['value']:.4g} {g['op']} {g['limit']:g}: {verdict}")
    interval = (policy.data.get("predicted") or {}).get("gain_interval")
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
        evidence = (policy.data.get("diagnostics") or {}).get("under_load") or {}
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
    packed = policy.data.get("packed_forwards")
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
    dom = policy.data.get("domain")
    if not isinstance(dom, dict):
        return ""
    (p0, p1), (c0, c1) = dom["prefix_len"], dom["chunk_size"]
    return f"; profiled prefixes {p0}-{p1}, chunks {c0}-{c1}"


def extrapolation(policy: Policy, prompt_len: int, chunk_sizes: list[int] | None = None) -> str | None:
    """A one-line note when a prompt's chunks lie outside what the profile measured (policy["domain"]): how far past
    the largest profiled prefix (or chunk) the latency model is asked; None inside the domain or without one."""
    dom = policy.data.get("domain")
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

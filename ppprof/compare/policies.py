"""Two policies side by side (`ppprof compare`), measured: coefficients, target, the history-only table at every
prefix length, predicted TTFT of each planner; judged by ppprof.compare.verdict, put in words by
ppprof.compare.render.

The samples' drift is computed in ppprof.compare.cells (ppprof.compare.runs reads samples.csv) and judged with the
rest.
Pure Python and numpy; no torch, pandas or matplotlib.
"""

from __future__ import annotations

import math

from ppprof.compare.verdict import checks, pace_of
from ppprof.io import finite
from ppprof.policy.planners import STRATEGIES, chunk_latencies_ms, default_pp_size, plan_prompt, ttft_ms
from ppprof.policy.rule import COEF_UNITS, MODEL_COEFS, NO_CALIBRATION
from ppprof.policy.runtime import Policy

REGRET_STRATEGIES = ("policy", "policy-history")
"""The strategies whose tables the candidate carries: their plans are also costed on the baseline's model."""
PROMPT_LEN_MULTIPLES = (4, 16, 64)  # default prompt lengths: these multiples of the baseline's B, within the context


def relative(base: float | None, cand: float | None) -> float | None:
    """cand / base - 1; 0 when both are 0, inf when only the baseline is 0, None when either is missing."""
    if base is None or cand is None:
        return None
    if base == 0:
        return 0.0 if cand == 0 else math.inf
    return cand / base - 1.0


def target_change(base: float | None, cand: float | None, factor: float) -> dict:
    """The targets T and their change (at the candidate's pace: over `factor`); no change where either is missing or
    not positive (a static policy whose model does not grow with the chunk: a ratio of such targets means nothing)."""
    judged = base is not None and cand is not None and base > 0 and cand > 0
    return {
        "baseline": base,
        "candidate": cand,
        "change": relative(base, cand) if judged else None,
        "change_at_pace": relative(base, cand / factor) if judged else None,
    }


def side(policy: Policy, label: str) -> dict:
    s = policy.settings
    return {
        "label": label,
        "status": policy.status,
        "reason": policy.reason,
        "latency_model": policy.latency_model.name if policy.latency_model else None,
        "base_chunk_size": s.base_chunk_size,
        "alignment": s.alignment,
        "context_len": s.context_len,
        "num_table_entries": len(policy.history_table.chunk_size),
        "num_bands": len(policy.prompt_rule.prompt_len),
        "gain_vs_fixed_best": (policy.report.predicted or {}).get("gain_vs_fixed_best"),
        "gain_interval": (policy.report.predicted or {}).get("gain_interval"),
        "gates_passed": gates_passed(policy),
        "overhead": policy.data["overhead"],
        "calibration": policy.data.get("calibration") or NO_CALIBRATION,  # as written, its why too
    }


def gates_passed(policy: Policy) -> bool | None:
    """Whether the policy's model passed every quality gate; None where it was not gated (SGLang parity, no model)."""
    gated = (policy.report.diagnostics or {}).get("gates")
    if not isinstance(gated, list) or not gated:
        return None
    return all(isinstance(g, dict) and g.get("passed") is True for g in gated)


def compare_coefficients(base: Policy, cand: Policy) -> list[dict]:
    """Each coefficient either model has (MODEL_COEFS order), with both values and the relative change."""
    names = [
        k for k in COEF_UNITS if any(m and k in MODEL_COEFS[m.name] for m in (base.latency_model, cand.latency_model))
    ]
    rows = []
    for k in names:
        b = getattr(base.latency_model, k) if base.latency_model else None
        c = getattr(cand.latency_model, k) if cand.latency_model else None
        rows.append({"name": k, "unit": COEF_UNITS[k], "baseline": b, "candidate": c, "change": relative(b, c)})
    return rows


def table_end(base: Policy, cand: Policy) -> int:
    """The last prefix length compared: the largest profiled prefix of either policy (their domains), else the
    smaller context less its margin."""
    ends = [p.report.domain["prefix_len"][1] for p in (base, cand) if isinstance(p.report.domain, dict)]
    if ends:
        return max(ends)
    return min(p.settings.context_len - p.settings.context_margin for p in (base, cand))


def compare_tables(base: Policy, cand: Policy, tol: dict[str, float]) -> dict:
    """Both policies' next_chunk_size on every integer prefix length 0..end, exactly: both are step functions, so
    they are constant between the union of their breakpoints. Counts the prefix lengths whose size changed and
    those beyond table_units alignment units (for the listing; the check is the regret, compare_ttft)."""
    end = table_end(base, cand)
    starts = base.history_table.prefix_len + cand.history_table.prefix_len
    points = sorted({0, *(p for p in starts if p <= end)})
    unit = base.settings.alignment
    rows, changed, beyond, worst = [], 0, 0, None
    for lo, nxt in zip(points, points[1:] + [end + 1]):
        b, c = base.next_chunk_size(lo), cand.next_chunk_size(lo)
        n = nxt - lo
        allowed = tol["table_units"] * unit
        if rows and rows[-1]["baseline"] == b and rows[-1]["candidate"] == c:
            rows[-1]["prefix_len"][1] = nxt - 1
        else:
            rows.append({"prefix_len": [lo, nxt - 1], "baseline": b, "candidate": c})
        if b != c:
            changed += n
        if abs(c - b) > allowed:
            beyond += n
        excess = abs(c - b) / allowed if allowed else (math.inf if c != b else 0.0)  # 1: at the allowance
        if b != c and (worst is None or excess > worst["excess"]):
            worst = {
                "prefix_len": lo,
                "baseline": b,
                "candidate": c,
                "change_tokens": c - b,
                "change_units": (c - b) / unit,
                "change": relative(b, c),
                "allowed_tokens": allowed,
                "excess": excess,
            }
    return {
        "prefix_len_range": [0, end],
        "num_prefix_lens": end + 1,
        "num_changed": changed,
        "num_beyond": beyond,
        "alignment": unit,
        "worst": worst,
        "rows": rows,
    }


def default_prompt_lens(base: Policy, cand: Policy) -> list[int]:
    """PROMPT_LEN_MULTIPLES x the baseline's B, each capped at the smaller context length."""
    cap = min(p.settings.context_len for p in (base, cand))
    return sorted({min(k * base.base_chunk_size, cap) for k in PROMPT_LEN_MULTIPLES})


def compare_ttft(base: Policy, cand: Policy, prompt_lens: list[int], pp_size: int, pace: float = 1.0) -> dict:
    """Predicted TTFT of each planner at each prompt length under each policy's own model, the change, and the change
    at the baseline's pace (the candidate's TTFT divided by `pace`)."""
    missing = [lab for lab, p in (("baseline", base), ("candidate", cand)) if p.latency_model is None]
    if missing:
        return {"num_stages": pp_size, "rows": [], "note": f"{' and '.join(missing)} has no latency model"}
    rows = []
    for n in prompt_lens:
        plans = {
            lab: {p.strategy: p for p in plan_prompt(pol, n, pp_size, STRATEGIES, extrapolate=True)}
            for lab, pol in (("baseline", base), ("candidate", cand))
        }
        for s in STRATEGIES:
            b, c = plans["baseline"][s], plans["candidate"][s]
            row = {
                "prompt_len": n,
                "strategy": s,
                "baseline_ms": b.ttft_ms,
                "candidate_ms": c.ttft_ms,
                "change": relative(b.ttft_ms, c.ttft_ms),
                "change_at_pace": relative(b.ttft_ms, c.ttft_ms / pace),
                "baseline_chunks": len(b.chunk_sizes),
                "candidate_chunks": len(c.chunk_sizes),
            }
            if s in REGRET_STRATEGIES:  # the candidate's plan on the baseline's model, against the baseline's own
                cost = ttft_ms(chunk_latencies_ms(base.planning_model, c.chunk_sizes), pp_size)
                row["regret"] = relative(b.ttft_ms, cost)
            rows.append(row)
    return {"num_stages": pp_size, "rows": rows, "note": None}


def compare_policies(
    base: Policy,
    cand: Policy,
    tol: dict[str, float],
    *,
    prompt_lens: list[int] | None = None,
    pp_size: int | None = None,
    samples: dict | None = None,
    labels: tuple[str, str] = ("baseline", "candidate"),
) -> dict:
    """The whole comparison as a JSON-ready dict; `drifted` is True when any check failed. `samples`: the
    the samples' drift (ppprof.compare.cells), judged with the rest."""
    pp_size = default_pp_size(base) if pp_size is None else pp_size
    prompt_lens = prompt_lens or default_prompt_lens(base, cand)
    pace = pace_of(samples)
    factor = pace["ratio"] or 1.0
    report = {
        "baseline": side(base, labels[0]),
        "candidate": side(cand, labels[1]),
        "tolerances": {k: (None if math.isinf(v) else v) for k, v in tol.items()},
        "coefficients": compare_coefficients(base, cand),
        "target_latency_ms": target_change(base.target_ms, cand.target_ms, factor),
        "table": compare_tables(base, cand, tol),
        "ttft": compare_ttft(base, cand, prompt_lens, pp_size, factor),
        "samples": samples,
        "pace": pace,
    }
    report["checks"] = checks(report, tol)
    report["drifted"] = not all(c["passed"] for c in report["checks"])
    return finite(report)

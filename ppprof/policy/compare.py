"""Two policies side by side (`ppprof compare`): coefficients, target, chunk-size table, predicted TTFT of each
planner, status; the tolerances that decide whether the candidate drifted from the baseline, and the text report.

Samples-level drift is computed in ppprof.fit.drift (it reads samples.csv) and judged here with the rest.
Pure Python and numpy; no torch, pandas or matplotlib.
"""

from __future__ import annotations

import math

from ppprof.io import finite
from ppprof.policy.planners import STRATEGIES, chunk_latencies_ms, default_num_stages, plan_prompt, ttft_ms
from ppprof.policy.rule import COEF_UNITS, MODEL_COEFS, LatencyModel
from ppprof.policy.schema import Policy

DEFAULT_TOLERANCES = {
    "ttft": 0.20,  # relative change of each predicted TTFT (every strategy at each prompt length)
    "table": 0.05,  # regret: how much slower the candidate's plans (policy, policy-history) are on the baseline's model
    "table_units": 1.0,  # the table's listing counts a size change beyond this many alignment units
    "gain": 0.02,  # a status change passes where both gains over the best fixed chunk are this close to each other
    "overhead": 0.5,  # relative change of the per-chunk overhead (or 3 standard errors, whichever allows more)
    "target": 0.25,  # relative change of the target latency T
    "samples": 0.20,  # |median of the cells' latency ratios / level - 1| at each prefix length (fit.drift)
    "level": 0.20,  # |level - 1|: the candidate's machine as a whole slower or faster than the baseline's
    "coef": math.inf,  # relative change of each coefficient: off, since b, c and g trade off between fits
}
"""Sized for a shared CPU, where a whole profile can run 10-15% slower than the last and a different seed moves b and
c by 20%: two profiles of the same config pass, a doubled quadratic coefficient a fails (on ttft). Where both sides
have samples, the latency figures (ttft, target, overhead, samples) are judged at the baseline's level, the
candidate's divided by the level (fit.drift), and the level on its own: a machine k times slower than the baseline's
fails on `level` alone, and a job on another kind of machine widens `level` and still judges the shape of the
latency curve at the defaults. On a dedicated GPU
runner, tighter limits suit (e.g. --tolerance ttft=0.1,samples=0.1). The rules' optimum is flat (many tables plan
within 1% of each other), so a table is judged by what it costs, not by its sizes."""
REGRET_STRATEGIES = ("policy", "policy-history")
"""The strategies whose tables the candidate carries: their plans are also costed on the baseline's model."""
PROMPT_LEN_MULTIPLES = (4, 16, 64)  # default prompt lengths: these multiples of the baseline's B, within the context


def parse_tolerances(specs) -> dict[str, float]:
    """DEFAULT_TOLERANCES updated by NAME=VALUE items ('ttft=0.05', 'table=15%', 'coef=none'; commas separate
    several); ValueError naming the item otherwise."""
    tol = dict(DEFAULT_TOLERANCES)
    for spec in specs or ():
        for item in filter(None, (s.strip() for s in str(spec).split(","))):
            name, sep, text = item.partition("=")
            name = name.strip()
            if not sep or name not in tol:
                raise ValueError(
                    f"--tolerance {item!r} is invalid: use NAME=VALUE with NAME one of "
                    f"{', '.join(tol)} (e.g. ttft=0.1 or ttft=10%)"
                )
            text = text.strip()
            try:
                value = (
                    math.inf
                    if text.lower() in ("none", "inf")
                    else (float(text[:-1]) / 100 if text.endswith("%") else float(text))
                )
            except ValueError:
                value = math.nan
            if not value >= 0:
                raise ValueError(
                    f"--tolerance {item!r} is invalid: the value must be a number >= 0, a percentage or none"
                )
            tol[name] = value
    return tol


def relative(base: float | None, cand: float | None) -> float | None:
    """cand / base - 1; 0 when both are 0, inf when only the baseline is 0, None when either is missing."""
    if base is None or cand is None:
        return None
    if base == 0:
        return 0.0 if cand == 0 else math.inf
    return cand / base - 1.0


def side(policy: Policy, label: str) -> dict:
    s = policy.settings
    return {
        "label": label,
        "status": policy.status,
        "reason": policy.reason,
        "latency_model": policy.model.name if policy.model else None,
        "base_chunk_size": s.base_chunk_size,
        "alignment": s.alignment,
        "context_len": s.context_len,
        "num_table_entries": len(policy.data["table"]["chunk_size"]),
        "num_bands": len(policy.data["prompt_table"]["prompt_len"]),
        "gain_vs_fixed_best": (policy.data.get("predicted") or {}).get("gain_vs_fixed_best"),
        "gates_passed": gates_passed(policy),
        "overhead": policy.data["overhead"],
        "calibration": policy.calibration,
    }


def gates_passed(policy: Policy) -> bool | None:
    """Whether the policy's model passed every quality gate; None where it was not gated (SGLang parity, no model)."""
    gated = (policy.data.get("diagnostics") or {}).get("gates")
    if not isinstance(gated, list) or not gated:
        return None
    return all(isinstance(g, dict) and g.get("passed") is True for g in gated)


def compare_coefficients(base: Policy, cand: Policy) -> list[dict]:
    """Each coefficient either model has (MODEL_COEFS order), with both values and the relative change."""
    names = [k for k in COEF_UNITS if any(m and k in MODEL_COEFS[m.name] for m in (base.model, cand.model))]
    rows = []
    for k in names:
        b = getattr(base.model, k) if base.model else None
        c = getattr(cand.model, k) if cand.model else None
        rows.append({"name": k, "unit": COEF_UNITS[k], "baseline": b, "candidate": c, "change": relative(b, c)})
    return rows


def table_end(base: Policy, cand: Policy) -> int:
    """The last prefix length compared: the largest profiled prefix of either policy (their domains), else the
    smaller context less its margin."""
    ends = [p.data["domain"]["prefix_len"][1] for p in (base, cand) if isinstance(p.data.get("domain"), dict)]
    if ends:
        return max(ends)
    return min(p.settings.context_len - p.settings.context_margin for p in (base, cand))


def compare_tables(base: Policy, cand: Policy, tol: dict[str, float]) -> dict:
    """Both policies' next_chunk_size on every integer prefix length 0..end, exactly: both are step functions, so
    they are constant between the union of their breakpoints. Counts the prefix lengths whose size changed and
    those beyond table_units alignment units (for the listing; the check is the regret, compare_ttft)."""
    end = table_end(base, cand)
    starts = base.data["table"]["prefix_len"] + cand.data["table"]["prefix_len"]
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


def compare_ttft(base: Policy, cand: Policy, prompt_lens: list[int], num_stages: int, level: float = 1.0) -> dict:
    """Predicted TTFT of each planner at each prompt length under each policy's own model, the change, and the change
    at the baseline's level (the candidate's TTFT divided by `level`)."""
    missing = [lab for lab, p in (("baseline", base), ("candidate", cand)) if p.model is None]
    if missing:
        return {"num_stages": num_stages, "rows": [], "note": f"{' and '.join(missing)} has no latency model"}
    rows = []
    for n in prompt_lens:
        plans = {
            lab: {p.strategy: p for p in plan_prompt(pol, n, num_stages, STRATEGIES, extrapolate=True)}
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
                "change_at_level": relative(b.ttft_ms, c.ttft_ms / level),
                "baseline_chunks": len(b.chunk_sizes),
                "candidate_chunks": len(c.chunk_sizes),
            }
            if s in REGRET_STRATEGIES:  # the candidate's plan on the baseline's model, against the baseline's own
                cost = ttft_ms(chunk_latencies_ms(base.planning_model, c.chunk_sizes), num_stages)
                row["regret"] = relative(b.ttft_ms, cost)
            rows.append(row)
    return {"num_stages": num_stages, "rows": rows, "note": None}


def check(figure: str, value: float | None, limit: float, detail: str) -> dict:
    return {
        "figure": figure,
        "value": value,
        "limit": limit,
        "passed": value is None or value <= limit,
        "detail": detail,
    }


def pct(value: float | None) -> str:
    if value is None:
        return "n/a"
    return "inf" if math.isinf(value) else f"{value:+.1%}"


def checks(report: dict, tol: dict[str, float]) -> list[dict]:
    """One check per figure the tolerances cover: status, target, table, ttft, samples, coef (largest deviation)."""
    b, c = report["baseline"], report["candidate"]
    out = [status_check(b, c, tol)]
    drift = report.get("samples")
    level = report["level"]["ratio"] or 1.0
    worst = (drift or {}).get("worst_prefix")  # the prefix length furthest from the level
    agree = worst is not None and abs(worst["median_ratio"] / level - 1.0) <= tol["samples"]
    if not out[0]["passed"] and agree:
        passed, why = noisy_status(report.get("baseline_refit"), tol)
        out[0].update(passed=passed, noisy=passed, detail=out[0]["detail"] + why)
    if report["level"]["ratio"] is not None:
        out.append(check("level", abs(level - 1.0), tol["level"], machine_level_words(report["level"])))
    tgt = report["target_latency_ms"]
    if tgt["change"] is not None:
        out.append(
            check(
                "target",
                abs(tgt["change_at_level"]),
                tol["target"],
                f"{tgt['baseline']:.4g} -> {tgt['candidate']:.4g} ms ({pct(tgt['change'])}"
                f"{at_level(tgt['change_at_level'], level)})",
            )
        )
    rows = report["ttft"]["rows"]
    regrets = [r for r in rows if r.get("regret") is not None]
    if regrets:
        r = max(regrets, key=lambda r: r["regret"])
        table = check(
            "table",
            max(0.0, r["regret"]),
            tol["table"],
            f"the candidate's {r['strategy']} plan of {r['prompt_len']} tokens costs {pct(r['regret'])} "
            f"against the baseline's own on the baseline's model ({report['table']['num_changed']} of "
            f"{report['table']['num_prefix_lens']} prefix lengths of the history-only table changed)",
        )
        if out[0].get("noisy") and not table["passed"]:
            # One side's tables are the fixed chunks a failed gate falls back to, not the rule: nothing to judge.
            table.update(
                passed=True,
                noisy=True,
                detail=table["detail"] + "; not judged: one side's tables are the "
                "fixed chunks of a profile too noisy to gate (noisy status)",
            )
        out.append(table)
    out.append(overhead_check(b["overhead"], c["overhead"], tol["overhead"], level))
    if rows:
        r = max(rows, key=lambda r: abs(r["change_at_level"]))
        out.append(
            check(
                "ttft",
                abs(r["change_at_level"]),
                tol["ttft"],
                f"{r['strategy']} at {r['prompt_len']} tokens: {r['baseline_ms']:.1f} -> "
                f"{r['candidate_ms']:.1f} ms ({pct(r['change'])}{at_level(r['change_at_level'], level)})",
            )
        )
    if worst is not None:
        ratio = worst["median_ratio"] / level
        out.append(
            check(
                "samples",
                abs(ratio - 1.0),
                tol["samples"],
                f"median latency ratio {worst['median_ratio']:.3f}"
                f"{f' ({ratio:.3f} at the level)' if level != 1.0 else ''} over the {worst['num_cells']} "
                f"common cells at prefix_len {worst['prefix_len']} (the prefix length furthest from "
                f"{'the level' if level != 1.0 else '1'}; {drift['median_ratio']:.3f} over all "
                f"{drift['num_cells']} cells)",
            )
        )
    coefs = [r for r in report["coefficients"] if r["change"] is not None]
    if coefs and report["baseline"]["latency_model"] == report["candidate"]["latency_model"]:
        r = max(coefs, key=lambda r: abs(r["change"]))
        out.append(
            check(
                "coef",
                abs(r["change"]),
                tol["coef"],
                f"{r['name']}: {r['baseline']:.4g} -> {r['candidate']:.4g} {r['unit']} ({pct(r['change'])})",
            )
        )
    return out


def level_of(drift: dict | None) -> dict:
    """The level the latency figures are judged at: fit.drift's, where both sides have samples at enough prefix
    lengths; else none (ratio None: every figure as measured)."""
    ratio = (drift or {}).get("level")
    return {
        "ratio": ratio,
        "num_prefix_lens": len((drift or {}).get("by_prefix") or ()),
        "source": "samples" if ratio is not None else "none",
    }


def machine_level_words(level: dict) -> str:
    """The measured level in words (not the policy's pipelined level, LatencyModel.level_words)."""
    ratio = level["ratio"]
    pace = f"{ratio:.3f} x the baseline's" if ratio >= 1 else f"{1 / ratio:.3f} x faster than the baseline's"
    return (
        f"the candidate's latencies ran {pace} (the median of {level['num_prefix_lens']} prefix lengths' median "
        f"latency ratios); ttft, target, overhead and samples are judged at the baseline's level"
    )


def at_level(change: float | None, level: float) -> str:
    return "" if level == 1.0 else f"; {pct(change)} at the level"


def status_check(b: dict, c: dict, tol: dict[str, float]) -> dict:
    """Same status; or both chose it on their predicted gain and the gains are within tol["gain"] of each other (the
    gain sits near the threshold, and noise moved it across)."""
    detail = f"{b['status']} -> {c['status']}"
    gb, gc = b["gain_vs_fixed_best"], c["gain_vs_fixed_best"]
    passed = b["status"] == c["status"]
    if not passed and gb is not None and gc is not None:
        passed = abs(gc - gb) <= tol["gain"]
        detail += (
            f" (gain over the best fixed chunk {gb:.1%} -> {gc:.1%}, within {tol['gain']:.0%}: near the threshold)"
            if passed
            else f" (gain {gb:.1%} -> {gc:.1%})"
        )
    return {"figure": "status", "value": None, "limit": None, "passed": passed, "detail": detail}


def noisy_status(refit: dict | None, tol: dict[str, float]) -> tuple[bool, str]:
    """(passed, why) of a status change where the samples agree and one of the two failed the quality gates: passed
    when this code's fit of the baseline's own samples (`refit`, from ppprof.fit.compare) judges them as the baseline
    says (the candidate was fitted by this code): then the gates split on the two profiles' samples, one too noisy to
    gate, and the code did not drift. Without that refit, or where it judges the baseline otherwise, a drift."""
    agree = f"; yet the samples agree (median latency ratios within {tol['samples']:.0%})"
    if refit is None:
        return False, (
            f"{agree}: a noisy profile may have failed the quality gates (see its reason); profile it "
            "again on a quiet machine"
        )
    noisy = "candidate" if refit["baseline_passed"] else "baseline"
    if refit["passed"] == refit["baseline_passed"]:
        return True, (
            f"{agree}, and this code's fit of the baseline's samples "
            f"{'passes every quality gate' if refit['passed'] else 'fails the gates as the baseline did'}: "
            f"the {noisy}'s samples were too noisy to gate (see its reason), not a drift; profile again on a "
            "quiet machine to compare the statuses"
        )
    judged = f"fails the quality gates ({refit['reason']})" if not refit["passed"] else "passes the gates it failed"
    return (
        False,
        f"{agree}, but this code's fit of the baseline's own samples {judged}: the fit changed, not the machine",
    )


def overhead_check(b: dict, c: dict, limit: float, level: float = 1.0) -> dict:
    """The per-chunk overhead, the candidate's at the baseline's level (divided by `level`): within limit x the
    baseline's, or 3 combined standard errors, whichever allows more; not judged unless both measured it."""
    if b["source"] != "measured" or c["source"] != "measured":
        return check(
            "overhead",
            None,
            limit,
            f"{b['ms_per_chunk']:.3g} ({b['source']}) -> {c['ms_per_chunk']:.3g} "
            f"({c['source']}) ms a chunk: not compared unless both measured it",
        )
    se = math.hypot(b["stderr_ms"] or 0.0, (c["stderr_ms"] or 0.0) / level)
    allowed = max(limit * b["ms_per_chunk"], 3.0 * se)
    change = abs(c["ms_per_chunk"] / level - b["ms_per_chunk"])
    leveled = "" if level == 1.0 else f" ({c['ms_per_chunk'] / level:.3g} at the level)"
    return {
        "figure": "overhead",
        "value": change,
        "limit": allowed,
        "passed": change <= allowed,
        "detail": f"{b['ms_per_chunk']:.3g} -> {c['ms_per_chunk']:.3g}{leveled} ms a chunk "
        f"(allowed +-{allowed:.3g} ms)",
    }


def compare_policies(
    base: Policy,
    cand: Policy,
    tol: dict[str, float],
    *,
    prompt_lens: list[int] | None = None,
    num_stages: int | None = None,
    samples: dict | None = None,
    baseline_refit: dict | None = None,
    labels: tuple[str, str] = ("baseline", "candidate"),
) -> dict:
    """The whole comparison as a JSON-ready dict; `drifted` is True when any check failed. `samples`: the
    samples-level drift (ppprof.fit.drift), judged with the rest; `baseline_refit`: {passed, reason, baseline_passed} of the quality
    gates on the baseline's samples fitted by this code (noisy_status), where they were refitted."""
    num_stages = default_num_stages(base) if num_stages is None else num_stages
    prompt_lens = prompt_lens or default_prompt_lens(base, cand)
    level = level_of(samples)
    factor = level["ratio"] or 1.0
    report = {
        "baseline": side(base, labels[0]),
        "candidate": side(cand, labels[1]),
        "tolerances": {k: (None if math.isinf(v) else v) for k, v in tol.items()},
        "coefficients": compare_coefficients(base, cand),
        "target_latency_ms": {
            "baseline": base.target_ms,
            "candidate": cand.target_ms,
            "change": relative(base.target_ms, cand.target_ms),
            "change_at_level": relative(base.target_ms, cand.target_ms / factor),
        },
        "table": compare_tables(base, cand, tol),
        "ttft": compare_ttft(base, cand, prompt_lens, num_stages, factor),
        "samples": samples,
        "level": level,
        "baseline_refit": baseline_refit,
    }
    report["checks"] = checks(report, tol)
    report["drifted"] = not all(c["passed"] for c in report["checks"])
    return finite(report)


def render(report: dict) -> str:
    """The report for people: what changed, then one line per check and the verdict."""
    b, c = report["baseline"], report["candidate"]
    lines = [
        f"baseline  {b['label']}: {b['status']} ({b['latency_model']}, B {b['base_chunk_size']}): {b['reason']}",
        f"candidate {c['label']}: {c['status']} ({c['latency_model']}, B {c['base_chunk_size']}): {c['reason']}",
    ]
    coefs = report["coefficients"]
    if coefs:
        lines.append(
            "coefficients: "
            + ", ".join(
                f"{r['name']} {fmt(r['baseline'])} -> {fmt(r['candidate'])} ({pct(r['change'])})" for r in coefs
            )
            + "  ["
            + ", ".join(f"{r['name']} {r['unit']}" for r in coefs)
            + "]"
        )
    t = report["target_latency_ms"]
    lines.append(
        f"target latency (SGLang's rule): {fmt(t['baseline'])} -> {fmt(t['candidate'])} ms ({pct(t['change'])})"
    )
    lines.append(
        f"overhead: {fmt(b['overhead']['ms_per_chunk'])} ({b['overhead']['source']}) -> "
        f"{fmt(c['overhead']['ms_per_chunk'])} ({c['overhead']['source']}) ms a chunk"
    )
    lines.append(
        f"pipelined level: {LatencyModel.level_words(b['calibration'])} ({b['calibration']['source']}) -> "
        f"{LatencyModel.level_words(c['calibration'])} ({c['calibration']['source']})"
    )
    table = report["table"]
    lo, hi = table["prefix_len_range"]
    lines.append(
        f"chunk-size table on prefix_len {lo}..{hi}: {table['num_changed']} of {table['num_prefix_lens']} "
        f"prefix lengths changed, {table['num_beyond']} beyond the allowance"
    )
    lines.append("  prefix_len         baseline  candidate")
    for r in table["rows"]:
        span = f"{r['prefix_len'][0]}-{r['prefix_len'][1]}"
        mark = "" if r["baseline"] == r["candidate"] else f"  ({r['candidate'] - r['baseline']:+d})"
        lines.append(f"  {span:<17} {r['baseline']:>9}  {r['candidate']:>9}{mark}")
    ttft = report["ttft"]
    if ttft["rows"]:
        leveled = report["level"]["ratio"] is not None
        lines.append(f"predicted TTFT, {ttft['num_stages']} stages (ms):")
        lines.append("  prompt_len  strategy         baseline  candidate  change" + ("  at level" if leveled else ""))
        for r in ttft["rows"]:
            lines.append(
                f"  {r['prompt_len']:>10}  {r['strategy']:<14} {r['baseline_ms']:>9.1f}  "
                f"{r['candidate_ms']:>9.1f}  {pct(r['change'])}"
                + (f"  {pct(r['change_at_level']):>8}" if leveled else "")
            )
    else:
        lines.append(f"predicted TTFT: not compared ({ttft['note']})")
    drift = report.get("samples")
    if drift:
        if drift.get("median_ratio") is None:
            lines.append(f"samples: {drift['note']}")
        else:
            w = drift["worst_cell"]
            lines.append(
                f"samples: {drift['num_cells']} common (prefix_len, chunk_size) cells, median latency ratio "
                f"{drift['median_ratio']:.3f} (candidate / baseline, bottleneck stages "
                f"{drift['bottleneck_stage'][0]} / {drift['bottleneck_stage'][1]}); largest at prefix_len "
                f"{w['prefix_len']} chunk_size {w['chunk_size']}: {w['ratio']:.3f}"
            )
            lines.append(
                "  median ratio by prefix_len: "
                + ", ".join(f"{r['prefix_len']}: {r['median_ratio']:.3f}" for r in drift["by_prefix"])
            )
    for ch in report["checks"]:
        limit = "" if ch["limit"] is None or ch["figure"] == "overhead" else f" (limit {ch['limit']:.0%})"
        lines.append(
            f"{('noisy' if ch.get('noisy') else 'ok   ') if ch['passed'] else 'DRIFT'} {ch['figure']}: {ch['detail']}{limit}"
        )
    failed = [ch["figure"] for ch in report["checks"] if not ch["passed"]]
    lines.append(f"drift beyond tolerance: {', '.join(failed)}" if failed else "within tolerance")
    return "\n".join(lines)


def fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"

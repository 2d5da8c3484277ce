"""The verdict of a comparison of two policies (`ppprof compare`): the tolerances, and one check per figure they
cover (status, pace, target, table, overhead, ttft, samples,
coef) on the measured report (ppprof.compare.policies). Pure Python; no numpy."""

from __future__ import annotations

import math

DEFAULT_TOLERANCES = {
    "ttft": 0.20,  # relative change of each predicted TTFT (every strategy at each prompt length)
    "table": 0.05,  # regret: how much slower the candidate's plans (policy, policy-history) are on the baseline's model
    "table_units": 1.0,  # the table's listing counts a size change beyond this many alignment units
    "gain": 0.02,  # a status change passes where both gains over the best fixed chunk are this close to each other
    "overhead": 0.5,  # relative change of the per-chunk overhead (or 3 standard errors, whichever allows more)
    "target": 0.25,  # relative change of the target latency T
    "samples": 0.20,  # |median of the cells' latency ratios / pace - 1| at each prefix length (compare.cells)
    "pace": 0.20,  # |pace - 1|: the candidate's machine as a whole slower or faster than the baseline's
    "coef": math.inf,  # relative change of each coefficient: off, since b, c and g trade off between fits
}
"""Sized for a shared CPU, where a whole profile can run 10-15% slower than the last and a different seed moves b and c
by 20%: two profiles of the same config pass, a doubled quadratic coefficient a fails (on ttft). Where both sides have
samples, the latency figures (ttft, target, overhead, samples) are judged at the baseline's pace, the candidate's
divided by the pace (ppprof.compare.cells), and the pace on its own: a machine k times slower than the baseline's fails
on `pace` alone, and a job on another kind of machine widens `pace` and still judges the shape of the latency curve at
the defaults. On a dedicated GPU runner, tighter limits suit (e.g. --tolerance ttft=0.1,samples=0.1). The rules' optimum
is flat (many tables plan within 1% of each other), so a table is judged by what it costs, not by its sizes."""


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
    """One check per figure the tolerances cover: status, pace, target, table, overhead, ttft, samples,
    coef (each at its largest deviation)."""
    pace = report["pace"]["ratio"] or 1.0
    status = judged_status(report, tol, pace)
    out = [status]
    if report["pace"]["ratio"] is not None:
        out.append(check("pace", abs(pace - 1.0), tol["pace"], pace_words(report["pace"])))
    out += target_check(report, tol, pace)
    out += table_check(report, tol, bool(status["passed"] and status.get("intervals")))
    out.append(overhead_check(report["baseline"]["overhead"], report["candidate"]["overhead"], tol["overhead"], pace))
    out += ttft_check(report, tol, pace)
    out += samples_check(report, tol, pace)
    out += coef_check(report, tol)
    return out


def judged_status(report: dict, tol: dict[str, float], pace: float) -> dict:
    """The status check (status_check); where it fails while the samples agree and a side has no gain interval, why:
    a policy of older code (refit both, so that their intervals judge them) or a model refused."""
    out = status_check(report["baseline"], report["candidate"], tol)
    worst = (report.get("samples") or {}).get("worst_prefix")  # the prefix length furthest from the pace
    agree = worst is not None and abs(worst["median_ratio"] / pace - 1.0) <= tol["samples"]
    if not out["passed"] and agree and not out["intervals"]:
        sides = (report["baseline"], report["candidate"])
        older = any(s["gain_vs_fixed_best"] is not None and s.get("gain_interval") is None for s in sides)
        out["detail"] += f"; yet the samples agree (median latency ratios within {tol['samples']:.0%})" + (
            ": refit both with this code (`ppprof fit`) so that their gains' intervals judge the statuses"
            if older
            else ": one side has no gain to judge (its model was refused: see its reason)"
        )
    return out


def target_check(report: dict, tol: dict[str, float], pace: float) -> list[dict]:
    """The target latency T at the baseline's pace; none where either side has none."""
    tgt = report["target_latency_ms"]
    if tgt["change"] is None:
        return []
    detail = (
        f"{tgt['baseline']:.4g} -> {tgt['candidate']:.4g} ms ({pct(tgt['change'])}"
        f"{at_pace(tgt['change_at_pace'], pace)})"
    )
    return [check("target", abs(tgt["change_at_pace"]), tol["target"], detail)]


def table_check(report: dict, tol: dict[str, float], status_split: bool) -> list[dict]:
    """The tables by their regret: the worst of the candidate's plans on the baseline's model against the
    baseline's own; not judged where the statuses differ within their gains' intervals (one side's tables are fixed
    chunks)."""
    regrets = [r for r in report["ttft"]["rows"] if r.get("regret") is not None]
    if not regrets:
        return []
    r = max(regrets, key=lambda r: r["regret"])
    table = check(
        "table",
        max(0.0, r["regret"]),
        tol["table"],
        f"the candidate's {r['strategy']} plan of {r['prompt_len']} tokens costs {pct(r['regret'])} "
        f"against the baseline's own on the baseline's model ({report['table']['num_changed']} of "
        f"{report['table']['num_prefix_lens']} prefix lengths of the history-only table changed)",
    )
    if status_split and not table["passed"] and table["value"] is not None:
        # One side's tables are the fixed chunks its status falls back to, not the rule: nothing to judge.
        table.update(
            passed=True,
            split=True,
            detail=table["detail"] + "; not judged: one side's tables are the fixed chunks of a status the "
            "samples cannot tell from the other (the gains' intervals overlap)",
        )
    return [table]


def ttft_check(report: dict, tol: dict[str, float], pace: float) -> list[dict]:
    """The predicted TTFT row furthest from the baseline's, at the baseline's pace."""
    rows = report["ttft"]["rows"]
    if not rows:
        return []
    r = max(rows, key=lambda r: abs(r["change_at_pace"]))
    detail = (
        f"{r['strategy']} at {r['prompt_len']} tokens: {r['baseline_ms']:.1f} -> "
        f"{r['candidate_ms']:.1f} ms ({pct(r['change'])}{at_pace(r['change_at_pace'], pace)})"
    )
    return [check("ttft", abs(r["change_at_pace"]), tol["ttft"], detail)]


def samples_check(report: dict, tol: dict[str, float], pace: float) -> list[dict]:
    """The samples' median latency ratio at the prefix length furthest from the pace; none without samples."""
    drift = report.get("samples")
    worst = (drift or {}).get("worst_prefix")
    if worst is None:
        return []
    ratio = worst["median_ratio"] / pace
    detail = (
        f"median latency ratio {worst['median_ratio']:.3f}"
        f"{f' ({ratio:.3f} at the pace)' if pace != 1.0 else ''} over the {worst['num_cells']} "
        f"common cells at prefix_len {worst['prefix_len']} (the prefix length furthest from "
        f"{'the pace' if pace != 1.0 else '1'}; {drift['median_ratio']:.3f} over all "
        f"{drift['num_cells']} cells)"
    )
    return [check("samples", abs(ratio - 1.0), tol["samples"], detail)]


def coef_check(report: dict, tol: dict[str, float]) -> list[dict]:
    """The coefficient that changed most, where both sides have the same latency model."""
    coefs = [r for r in report["coefficients"] if r["change"] is not None]
    if not coefs or report["baseline"]["latency_model"] != report["candidate"]["latency_model"]:
        return []
    r = max(coefs, key=lambda r: abs(r["change"]))
    detail = f"{r['name']}: {r['baseline']:.4g} -> {r['candidate']:.4g} {r['unit']} ({pct(r['change'])})"
    return [check("coef", abs(r["change"]), tol["coef"], detail)]


def pace_of(drift: dict | None) -> dict:
    """The pace the latency figures are judged at: ppprof.compare.cells', where both sides have samples at enough prefix
    lengths; else none (ratio None: every figure as measured)."""
    ratio = (drift or {}).get("pace")
    return {
        "ratio": ratio,
        "num_prefix_lens": len((drift or {}).get("by_prefix") or ()),
        "source": "samples" if ratio is not None else "none",
    }


def pace_words(pace: dict) -> str:
    """The measured pace in words (not the policy's calibration, LatencyModel.calibration_words)."""
    ratio = pace["ratio"]
    speed = f"{ratio:.3f} x the baseline's" if ratio >= 1 else f"{1 / ratio:.3f} x faster than the baseline's"
    return (
        f"the candidate's latencies ran {speed} (the median of {pace['num_prefix_lens']} prefix lengths' median "
        f"latency ratios); ttft, target, overhead and samples are judged at the baseline's pace"
    )


def at_pace(change: float | None, pace: float) -> str:
    return "" if pace == 1.0 else f"; {pct(change)} at the baseline's pace"


def status_check(b: dict, c: dict, tol: dict[str, float]) -> dict:
    """Same status; or, where both policies carry their gain's interval over resampled fits (predicted.gain_interval),
    the two intervals overlap: the samples cannot tell the two gains apart, and the statuses differ only by the side
    of the threshold a lower bound fell on. Without both intervals (older policies): both chose it on their gain and
    the gains are within tol["gain"] of each other."""
    detail = f"{b['status']} -> {c['status']}"
    gb, gc = b["gain_vs_fixed_best"], c["gain_vs_fixed_best"]
    ib, ic = b.get("gain_interval"), c.get("gain_interval")
    passed = b["status"] == c["status"]
    both = isinstance(ib, dict) and isinstance(ic, dict)
    if both:
        detail += f" (gain {interval_words(ib)} -> {interval_words(ic)}"
        if not passed:
            passed = ib["lower"] <= ic["upper"] and ic["lower"] <= ib["upper"]
            detail += (
                ": the intervals overlap, the samples cannot tell the gains apart"
                if passed
                else ": the intervals are apart, the decision changed"
            )
        detail += ")"
    elif not passed and gb is not None and gc is not None:
        passed = abs(gc - gb) <= tol["gain"]
        detail += (
            f" (gain over the best fixed chunk {gb:.1%} -> {gc:.1%}, within {tol['gain']:.0%}: near the threshold)"
            if passed
            else f" (gain {gb:.1%} -> {gc:.1%})"
        )
    return {"figure": "status", "value": None, "limit": None, "passed": passed, "detail": detail, "intervals": both}


def interval_words(interval: dict) -> str:
    """A gain's interval: "2.1% (80%: 1.8% to 2.4%)"."""
    share = 1.0 - 2.0 * interval["quantile"]
    return f"{interval['median']:.1%} ({share:.0%}: {interval['lower']:.1%} to {interval['upper']:.1%})"


def overhead_check(b: dict, c: dict, limit: float, pace: float = 1.0) -> dict:
    """The per-chunk overhead, the candidate's at the baseline's pace (divided by `pace`): within limit x the
    baseline's, or 3 combined standard errors, whichever allows more; not judged unless both measured it."""
    if b["source"] != "measured" or c["source"] != "measured":
        return check(
            "overhead",
            None,
            limit,
            f"{b['ms_per_chunk']:.3g} ({b['source']}) -> {c['ms_per_chunk']:.3g} "
            f"({c['source']}) ms a chunk: not compared unless both measured it",
        )
    se = math.hypot(b["stderr_ms"] or 0.0, (c["stderr_ms"] or 0.0) / pace)
    allowed = max(limit * b["ms_per_chunk"], 3.0 * se)
    change = abs(c["ms_per_chunk"] / pace - b["ms_per_chunk"])
    paced = "" if pace == 1.0 else f" ({c['ms_per_chunk'] / pace:.3g} at the baseline's pace)"
    return {
        "figure": "overhead",
        "value": change,
        "limit": allowed,
        "passed": change <= allowed,
        "detail": f"{b['ms_per_chunk']:.3g} -> {c['ms_per_chunk']:.3g}{paced} ms a chunk (allowed +-{allowed:.3g} ms)",
    }

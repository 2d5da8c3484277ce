"""`ppprof compare POLICY TRACE`: a server's own forwards (a forward trace) judged against a policy's predictions per
stage and prefix band (the rows of ppprof.fit.live_forwards), as compare judges samples: the pace, the median of
every forward's live / predicted, within the `pace` tolerance; each band's median ratio over the pace within the
`samples` tolerance (bands of MIN_FORWARDS or more); and, since a band holds a few live forwards of a busy server where
a profile's cell held the median of many probes, a figure drifts only where its NOISE_COVERAGE interval (a seeded
bootstrap of the median) lies wholly outside the tolerance: a band of 10 forwards whose times scatter by 30% moves its
median by 20% from one serve to the next. Pure numpy: no torch."""

from __future__ import annotations

import numpy as np

from ppprof.fit.live import check_match, read_policy
from ppprof.fit.live_forwards import LiveForwards, band_name, bands, drift_rows, live_forwards, predicted_ms
from ppprof.forwards import read_forwards

MIN_FORWARDS = 3
"""Forwards a band needs to be judged; fewer are reported, not judged."""
NOISE_COVERAGE = 0.8
"""The interval of a band's (and the pace's) median that must lie wholly outside the tolerance for a drift: the
10% and 90% quantiles of the median over NOISE_RESAMPLES resamples of the forwards."""
NOISE_RESAMPLES = 400


def median_interval(values: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """The NOISE_COVERAGE interval of the median of `values` over NOISE_RESAMPLES seeded bootstrap resamples."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(values), size=(NOISE_RESAMPLES, len(values)))
    medians = np.median(values[draws], axis=1)
    tail = (1.0 - NOISE_COVERAGE) / 2
    lo, hi = np.quantile(medians, [tail, 1.0 - tail])
    return float(lo), float(hi)


def outside(interval: tuple[float, float], tolerance: float) -> bool:
    """The interval of a ratio less 1 lies wholly outside [-tolerance, tolerance]."""
    lo, hi = interval
    return lo - 1.0 > tolerance or hi - 1.0 < -tolerance


def judge(policy: dict, live: LiveForwards, tolerances: dict) -> dict:
    """compare's verdict on live forwards: the pace and every judged band (module doc); `drifted` and `where`."""
    predicted = predicted_ms(policy, live)
    ratio = live.latency_ms / predicted
    pace = float(np.median(ratio))
    pace_interval = median_interval(ratio)
    base = int(policy["settings"]["base_chunk_size"])
    rows = drift_rows({"policy": predicted}, live, base)
    edges, of = bands(live, base)
    names = [band_name(edges, k) for k in range(len(edges))]
    moved = []
    for row in rows:
        m = (live.stage == row["stage"]) & (of == names.index(row["band"]))
        lo, hi = median_interval(ratio[m] / pace, seed=1 + len(moved) + row["stage"])
        row["vs_pace"] = row["policy_ratio"] / pace - 1.0
        row["vs_pace_interval"] = [lo - 1.0, hi - 1.0]
        row["judged"] = row["forwards"] >= MIN_FORWARDS
        row["drifted"] = row["judged"] and outside((lo, hi), tolerances["samples"])
        if row["drifted"]:
            moved.append(row)
    pace_drift = outside(pace_interval, tolerances["pace"])
    where = [f"stage {r['stage']} prefix {r['band']}: {r['vs_pace']:+.1%} against the pace" for r in moved]
    if pace_drift:
        where.insert(0, f"every stage: live forwards at {pace:.3f}x the policy's prediction")
    return {
        "pace": pace,
        "pace_interval": list(pace_interval),
        "noise_coverage": NOISE_COVERAGE,
        "tolerances": {"pace": tolerances["pace"], "samples": tolerances["samples"]},
        "bands": rows,
        "drifted": bool(pace_drift or moved),
        "where": where,
    }


def judge_text(report: dict) -> list[str]:
    """`ppprof compare POLICY TRACE` for people: the pace, the bands against it, the verdict naming where."""
    tol, cover = report["tolerances"], report["noise_coverage"]
    lo, hi = report["pace_interval"]
    lines = [
        f"policy {report['policy']} against forward trace {report['trace']}: {report['forwards']} live forwards",
        f"pace: live forwards at {report['pace']:.3f}x the policy's prediction ({cover:.0%} interval "
        f"{lo:.3f}-{hi:.3f}; tolerance {tol['pace']:.0%})",
        f"{'stage':>5} {'prefix band':>13} {'forwards':>8} {'live ms':>9} {'predicted ms':>12} {'vs pace':>9} "
        f"{f'{cover:.0%} interval':>17}",
    ]
    for r in report["bands"]:
        mark = "  DRIFT" if r["drifted"] else ("" if r["judged"] else "  (too few to judge)")
        a, b = r["vs_pace_interval"]
        lines.append(
            f"{r['stage']:>5} {r['band']:>13} {r['forwards']:>8} {r['live_ms']:>9.3f} {r['policy_ms']:>12.3f} "
            f"{r['vs_pace']:>+9.1%} {f'{a:+.1%} to {b:+.1%}':>17}{mark}"
        )
    if report["drifted"]:
        lines.append(
            "drift: " + "; ".join(report["where"]) + f" (tolerance {tol['samples']:.0%} a band, the whole "
            f"{cover:.0%} interval outside it)"
        )
    else:
        lines.append(f"within tolerance: no band's {cover:.0%} interval wholly beyond {tol['samples']:.0%} of the pace")
    return lines


def check_trace(policy_path, trace_path, tolerances: dict) -> dict:
    """`ppprof compare POLICY TRACE`: the trace's live forwards judged against the policy's predictions
    (judge), with the figures a report names. Bad input: one-line ValueError."""
    policy = read_policy(policy_path)
    if policy.get("latency_model") is None:
        raise ValueError(f"policy {policy_path} has no latency model ({policy.get('reason')}): nothing to judge")
    forwards = read_forwards([trace_path])
    check_match(policy, forwards, policy_path, trace_path)
    live = live_forwards(forwards, int(policy["settings"]["context_len"]))
    if not len(live):
        raise ValueError(f"forward trace {trace_path} leaves no forward to judge ({live.skipped}): serve more")
    return {
        "policy": str(policy_path),
        "trace": str(trace_path),
        "trace_sha256": forwards.files[0]["sha256"],
        "forwards": len(live),
        "skipped": live.skipped,
        **judge(policy, live, tolerances),
    }

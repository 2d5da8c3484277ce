"""The few lines `ppprof fit` prints about a policy it wrote, and the note on a run that did not complete."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ppprof.fit.samples import read_run
from ppprof.runfiles import COMPLETE


def num(value, spec: str) -> str:
    """`value` formatted with `spec`, or 'n/a' for None (a number the policy file could not hold)."""
    return "n/a" if value is None else format(value, spec)


def fit_summary(path: Path, policy: dict) -> str:
    """A few lines for people."""
    diag = policy["report"]["diagnostics"]
    s = policy["settings"]
    lines = [f"policy {path}: {policy['status']} ({policy['reason']})"]
    if diag.get("parity"):
        if policy["latency_model"]:
            coefs = policy["latency_model"]["coefficients"]
            lines.append("model quadratic: " + ", ".join(f"{k}={v['value']!r} {v['unit']}" for k, v in coefs.items()))
        lines.append(f"{diag['parity']} parity: {diag['parity_rule']}; {diag['fit_rows']} rows fitted")
        return "\n".join(lines)
    if policy["latency_model"]:
        coefs = policy["latency_model"]["coefficients"]
        terms = ", ".join(f"{k}={v['value']:.4g} {v['unit']}" for k, v in coefs.items())
        lines.append(f"model {policy['latency_model']['name']}: {terms}; target {policy['target_latency_ms']:.4g} ms")
        lines.append(
            f"scored on {diag['rows']}: R^2 {num(diag['r2'], '.4f')}, MAPE {num(diag['mape'], '.2%')}, "
            f"worst residual {num(diag['worst_residual']['residual_ms'], '.3g')} ms; CV MAPE "
            f"{num(diag['cv_mape'], '.2%')} (every row held out once)"
        )
        lines.append(
            f"fitted to {diag['fit']['rows']}: R^2 {num(diag['fit']['r2'], '.4f')}; condition "
            f"{num(diag['condition_number'], '.3g')}"
        )
        lines += checks_lines(diag)
    others = {
        k: v
        for k, v in diag["candidates"].items()
        if not policy["latency_model"] or k != policy["latency_model"]["name"]
    }
    for name, c in others.items():
        lines.append(
            f"{name} (not selected): "
            + (c["error"] if "error" in c else f"R^2 {num(c['r2'], '.4f')}, CV MAPE {num(c['cv_mape'], '.2%')}")
        )
    if diag.get("bottleneck_stage") is not None:
        lines.append(f"bottleneck stage {diag['bottleneck_stage']} (largest total latency)")
    shrink = diag.get("predicted_shrink")
    largest = min(s["base_chunk_size"], s["max_chunk_size"])
    deep = (
        ""
        if not shrink
        else (f", {largest * (1 - shrink['fraction']):.0f} at prefix_len {shrink['prefix_len']} if dynamic")
    )
    lines.append(
        f"chunks: base {s['base_chunk_size']}{deep}; alignment {s['alignment']}, smooth "
        f"{s['smooth_factor']:g}, floor {s['min_chunk_size']}, cap {s['max_chunk_size']}, "
        f"{len(policy['table']['chunk_size'])} table entries"
    )
    if policy.get("load"):
        lines.append(load_line(policy["load"]))
    return "\n".join(lines)


def checks_lines(diag: dict) -> list[str]:
    """The checks that decide (the form on the cells' medians, the condition number) and the per-row gates, which
    do not; none for a policy without them."""
    out = []
    for title, key in (("checks (decide)", "gates"), ("per-row gates (diagnostics)", "row_gates")):
        if diag.get(key):
            out.append(
                f"{title}: "
                + ", ".join(
                    f"{g['name']} {num(g['value'], '.3g')} {g['op']} {g['limit']:g}"
                    + ("" if g["passed"] else " FAILED")
                    for g in diag[key]
                )
            )
    return out


def load_line(load: dict) -> str:
    """The under-load rule, and its worst loss against the best candidate over the workloads and loads it was chosen
    on beside the idle rules'."""
    full = load["full"]
    bound = "no bound" if full["bound_ms"] is None else f"{full['bound_ms']:.0f} ms"
    floor = "" if load.get("floor") is None else f", at least a first chunk of {load['floor']} tokens"
    return (
        f"under load: once the work fills {load['fill']:g} x {load['slots']} slots, chunks of one latency up to {bound} "
        f"and {full['chunk_cap']} tokens{floor}; chosen for its worst loss {load['worst_loss']:.1%} against the best "
        f"candidate (at {load['worst_at']}), the idle rules' {load['idle_worst_loss']:.1%}"
    )


def incomplete_run_note(samples_path: str) -> str | None:
    """One line when the run that wrote SAMPLES did not complete (run.json's status): what the fit stands on."""
    run = read_run(samples_path)
    if run is None or run["status"] == COMPLETE:
        return None
    frame = pd.read_csv(samples_path)
    probes = frame["probe"].nunique() if "probe" in frame.columns else None
    total = run.get("num_probes")
    kept = (
        f"the {len(frame)} samples of {probes} of {total} probes" if probes and total else f"its {len(frame)} samples"
    )
    return (
        f"the run in {Path(samples_path).parent} is {run['status']} (run.json), not complete: fitted {kept}; "
        f"`ppprof profile --resume {Path(samples_path).parent}` finishes it"
    )

"""The checks a fitted model must pass before its policy's gain is judged, where timing noise averages out: its form
on the medians of the samples' cells (ppprof.fit.confidence.form_check: at most MAX_FORM_ERROR RMS off, noise
removed) and the condition number of the unit-column design of the fitted rows (<= 100). Either failing gives a
`static` policy with the reason. Whether an adequate model gives a dynamic policy is the policy's gain over the best
fixed chunk and that gain's lower bound over resampled fits (ppprof.policy.choice, ppprof.fit.confidence).

The per-row gates of ATOM's design (RMS residual <= 25% of the mean latency, k-fold CV MAPE <= 10%, over every
evaluation row with the planner's chunk latency) are kept as diagnostics (`row_gates`): a single row's error is the
model's plus the machine's noise, so on a noisy host they fail on noise; they no longer decide the status. How far
SGLang's rule would shrink its chunks is kept as a diagnostic too.
"""

from __future__ import annotations

from ppprof.config import ChunkSettings
from ppprof.policy.rule import LatencyModel, next_chunk_size

MAX_RMS_FRACTION = 0.25
MAX_CONDITION_NUMBER = 100.0
MAX_CV_MAPE = 0.10


def predicted_shrink(model: LatencyModel, settings: ChunkSettings, target_ms: float) -> tuple[float, int]:
    """1 - (policy chunk at the deepest prefix_len before the context cap) / (the largest later chunk the caps allow,
    min(B, max_chunk_size)), and that prefix_len. Measured against the cap, so that a max_chunk_size below B
    does not pass for a shrink the model predicts."""
    L = max(1, settings.context_len - settings.context_margin - settings.max_chunk_size)
    size = next_chunk_size(model, settings, target_ms, L)
    return 1.0 - size / min(settings.base_chunk_size, settings.max_chunk_size), L


def row_gates(diag: dict) -> list[dict]:
    """The per-row gates (diagnostics, not deciding): each one's name, value, operator, limit and whether it passed."""
    return [
        gate("rms_residual_fraction", diag["rms_residual_ms"] / diag["mean_latency_ms"], MAX_RMS_FRACTION),
        gate("cv_mape", diag["cv_mape"], MAX_CV_MAPE),
    ]


def adequacy(form: dict, diag: dict) -> list[dict]:
    """The checks that decide whether the model is adequate: its form on the cell medians (`form`,
    ppprof.fit.confidence.form_check) and the condition number."""
    return [form, gate("condition_number", diag["condition_number"], MAX_CONDITION_NUMBER)]


def gate(name: str, value: float, limit: float) -> dict:
    return {"name": name, "value": value, "op": "<=", "limit": limit, "passed": bool(value <= limit)}


def failure_reason(checks: list[dict]) -> str | None:
    """One clause per failed gate, or None when every gate passed."""
    failed = [g for g in checks if not g["passed"]]
    if not failed:
        return None
    return "; ".join(f"gate {g['name']} = {g['value']:.4g} fails {g['op']} {g['limit']:g}" for g in failed)

"""Quality gates a fitted model must pass for a dynamic policy (ATOM's, with CPU-timing slack on the CV bound); any
failure gives a `static` policy with the reason:
  RMS residual <= 25% of the mean latency and k-fold CV MAPE <= 10%, both over every evaluation row (prefix-free and
  prefixed) with the planner's chunk latency; condition number of the unit-column design of the fitted rows <= 100.
Whether a model that passes them gives a dynamic policy is the policy's own test (its predicted gain over the best
fixed chunk, ppprof.policy.choice); how far SGLang's rule would shrink its chunks is kept as a diagnostic.
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


def gates(diag: dict) -> list[dict]:
    """Each gate's name, value, operator, limit and whether it passed, from the model's diagnostics."""
    checks = [
        ("rms_residual_fraction", diag["rms_residual_ms"] / diag["mean_latency_ms"], "<=", MAX_RMS_FRACTION),
        ("condition_number", diag["condition_number"], "<=", MAX_CONDITION_NUMBER),
        ("cv_mape", diag["cv_mape"], "<=", MAX_CV_MAPE),
    ]
    return [
        {"name": n, "value": v, "op": op, "limit": lim, "passed": bool(v <= lim if op == "<=" else v >= lim)}
        for n, v, op, lim in checks
    ]


def failure_reason(checks: list[dict]) -> str | None:
    """One clause per failed gate, or None when every gate passed."""
    failed = [g for g in checks if not g["passed"]]
    if not failed:
        return None
    return "; ".join(f"gate {g['name']} = {g['value']:.4g} fails {g['op']} {g['limit']:g}" for g in failed)

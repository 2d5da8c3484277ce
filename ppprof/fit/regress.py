"""The regression of a run's samples: each requested latency model fitted with trimming (ppprof.fit.least_squares),
cross-validated on the same rows (ppprof.fit.crossval), and its diagnostics, which the quality gates read
(ppprof.fit.gates). The forms themselves are in ppprof.fit.forms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppprof.fit.crossval import CV_FOLDS, cross_validate, held_out_splits
from ppprof.fit.forms import ADMISSIBLE_ROWS, Unfittable, admissible, design
from ppprof.fit.least_squares import OUTLIER_RULE, fit_trimmed, outlier_mask
from ppprof.policy.rule import MODEL_NAMES, LatencyModel


def condition_number(name: str, prefix_len, chunk_size) -> float:
    """Condition number of the design (on the model's admissible rows) with every column scaled to unit length."""
    rows = admissible(name, prefix_len)
    X = design(name, np.asarray(prefix_len)[rows], np.asarray(chunk_size)[rows])
    norms = np.linalg.norm(X, axis=0)
    if len(X) == 0 or np.any(norms == 0):
        return float("inf")
    return float(np.linalg.cond(X / norms))


def fit_stats(model: LatencyModel, prefix_len, chunk_size, latency_ms) -> dict:
    """R^2, MAPE, RMS and the worst residual of chunk_latency_ms on the rows given."""
    from sklearn.metrics import r2_score

    pred = model.chunk_latency_ms(prefix_len, chunk_size)
    resid = latency_ms - pred
    worst = int(np.argmax(np.abs(resid)))
    return {
        "num_samples": int(len(latency_ms)),
        "r2": float(r2_score(latency_ms, pred)) if len(latency_ms) > 1 else float("nan"),
        "mape": float(np.mean(np.abs(resid) / latency_ms)),
        "rms_residual_ms": float(np.sqrt(np.mean(resid**2))),
        "mean_latency_ms": float(np.mean(latency_ms)),
        "worst_residual": {
            "residual_ms": float(resid[worst]),
            "relative": float(resid[worst] / latency_ms[worst]),
            "prefix_len": int(prefix_len[worst]),
            "chunk_size": int(chunk_size[worst]),
            "latency_ms": float(latency_ms[worst]),
        },
    }


def diagnostics(model: LatencyModel, fit_rows: np.ndarray, prefix_len, chunk_size, latency_ms, cv_mape: float) -> dict:
    """Diagnostics of `model` on the evaluation rows (all rows given), with the planner's chunk_latency_ms.

    Top level: every evaluation row, prefix-free and prefixed, less the outliers the outlier rule finds among them
    under this model (the gates read these). `fit`: the rows the model was fitted to. `cv_mape`: every row, held out.
    """
    L, x, y = prefix_len, chunk_size, latency_ms
    n, num_free = len(y), int((L == 0).sum())
    keep = outlier_mask(model, L, x, y)
    num_fit_candidates = int(admissible(model.name, L).sum())
    diag = {
        "rows": (
            f"all {n} evaluation rows ({num_free} prefix-free, {n - num_free} prefixed) less "
            f"{int((~keep).sum())} outliers; predicted with chunk_latency_ms(prefix_len, chunk_size) as the "
            f"planner does"
        ),
        "num_evaluation_rows": n,
        "num_outliers_dropped": int((~keep).sum()),
        "outlier_rule": OUTLIER_RULE,
        **fit_stats(model, L[keep], x[keep], y[keep]),
        "cv_folds": int(min(CV_FOLDS, n)),
        "cv_mape": cv_mape,
        "cv_rows": (
            f"all {n} evaluation rows, each held out once; each fold fits {model.name} on its "
            f"{ADMISSIBLE_ROWS[model.name]} among the training rows"
        ),
        "fit": {
            "rows": (
                f"{int(fit_rows.sum())} of the {num_fit_candidates} {ADMISSIBLE_ROWS[model.name]}, "
                f"{num_fit_candidates - int(fit_rows.sum())} outliers dropped"
            ),
            **fit_stats(model, L[fit_rows], x[fit_rows], y[fit_rows]),
        },
        "condition_number": condition_number(model.name, L[fit_rows], x[fit_rows]),
    }
    return diag


@dataclass(slots=True)
class Fit:
    """One model fitted with trimming: the model, the rows it was fitted to, and its cross-validated MAPE."""

    model: LatencyModel
    fit_rows: np.ndarray  # (n,) bool: admissible, not an outlier
    cv_mape: float
    held_out_mape: float = float("nan")
    """MAPE on prefix bands and chunk ranges held out (held_out_splits): what predicts work the fit never saw."""


def fit_candidates(prefix_len, chunk_size, latency_ms, requested: str) -> tuple[dict[str, Fit], dict[str, str]]:
    """Fit each requested model (both for 'auto') with trimming; cross-validate them on the same rows.

    Returns ({name: Fit} for the models that fitted, {name: reason} for those that did not).
    """
    names = MODEL_NAMES if requested == "auto" else (requested,)
    fitted, failed = {}, {}
    for name in names:
        try:
            fitted[name] = Fit(*fit_trimmed(name, prefix_len, chunk_size, latency_ms), float("nan"))
        except Unfittable as e:
            failed[name] = str(e)
    cv = cross_validate(tuple(fitted), prefix_len, chunk_size, latency_ms)
    splits = held_out_splits(prefix_len, chunk_size)
    held = cross_validate(tuple(fitted), prefix_len, chunk_size, latency_ms, splits=splits) if splits else {}
    for name, value in cv.items():
        fitted[name].cv_mape = value
        fitted[name].held_out_mape = held.get(name, float("nan"))
    return fitted, failed

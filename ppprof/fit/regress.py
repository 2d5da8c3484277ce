"""The regression of a run's samples: each requested latency model fitted with trimming (ppprof.fit.least_squares),
cross-validated on the same rows (ppprof.fit.crossval), and its diagnostics, which the quality gates read
(ppprof.fit.gates). The forms themselves are in ppprof.fit.forms.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppprof.fit.crossval import CV_FOLDS, cv_splits, fold_errors, held_out_splits
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

    The outer keys: every evaluation row, prefix-free and prefixed, less the outliers the outlier rule finds among them
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
    folds: np.ndarray | None = None
    """(folds,): each held-out fold's MAPE (the k folds' where a model has no held-out score), which the model
    choice compares first (ppprof.fit.crossval.choose_model); None where the model could not be fitted in some
    fold."""
    long_folds: np.ndarray | None = None
    """(k folds,): each k fold's MAPE on its rows at a long prefix (nan where it holds none), which the model choice
    compares next; None where the model could not be fitted in some fold."""


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
    names, n = tuple(fitted), len(latency_ms)
    # k folds (every row held out once): cv_mape, the mean over rows, and the long-prefix fold errors
    cv = (
        fold_errors(names, prefix_len, chunk_size, latency_ms, cv_splits(prefix_len, min(CV_FOLDS, n)))
        if n >= 2
        else {}
    )
    splits = held_out_splits(prefix_len, chunk_size)
    held = fold_errors(names, prefix_len, chunk_size, latency_ms, splits) if splits else {}
    every_held = bool(held) and all(f is not None for f in held.values())
    for name, f in fitted.items():
        k = cv.get(name)
        f.cv_mape = float("inf") if k is None else float(k[:, 0] @ k[:, 2] / k[:, 2].sum())
        if splits:
            f.held_out_mape = float("inf") if held[name] is None else float(held[name][:, 0].mean())
        # the choice compares the folds of the score select_model reads: held-out where every model has them
        first = held[name] if every_held else k
        f.folds = None if first is None else first[:, 0]
        f.long_folds = None if k is None else k[:, 1]
    return fitted, failed

"""Least-squares fits of the latency models (scikit-learn), outlier trimming, k-fold cross-validation, diagnostics.

- quadratic (SGLang): f(l) = a l^2 + b l + c on l = prefix_len + chunk_len; >= 8 points; a <= 0 is a failure; a
  negative b is set to 0 (SGLang clamps it).
- prefix (ATOM): t(L, x) = c + g L + b x + a (2 L x + x^2); >= 2 distinct chunk sizes and >= 3 distinct prefixes.
  Coefficients must be non-negative: the most negative term (by its share of the mean latency) is dropped from the
  design and the rest refitted, until none is negative (a refit, not a clamp, so the others absorb its share).
Robustness: after a first fit, points whose relative residual lies more than OUTLIER_MADS robust sigmas (1.4826 MAD,
at least MIN_OUTLIER_REL) from the median are dropped, at most MAX_OUTLIER_FRACTION of them, and the model refitted.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LinearRegression
from sklearn.metrics import r2_score
from sklearn.model_selection import KFold

from ppprof.policy.rule import MODEL_NAMES, LatencyModel

MIN_QUADRATIC_POINTS = 8
MIN_PREFIX_CHUNK_SIZES = 2
MIN_PREFIX_PREFIXES = 3
CV_FOLDS = 5
CV_SEED = 0
OUTLIER_MADS = 5.0
MIN_OUTLIER_REL = 0.05
MAX_OUTLIER_FRACTION = 0.10
MAD_TO_SIGMA = 1.4826
PREFIX_TERMS = ("c", "g", "b", "a")
OUTLIER_RULE = (f"after a first fit, drop points whose relative residual is more than {OUTLIER_MADS:g} x 1.4826 MAD "
                f"(at least {MIN_OUTLIER_REL:.0%}) from the median, at most {MAX_OUTLIER_FRACTION:.0%} of points, "
                f"then refit")


class Unfittable(Exception):
    """The samples do not support the model (not bad input: the policy becomes static with this reason)."""


def ineligible(name: str, prefix_len: np.ndarray, chunk_len: np.ndarray) -> str | None:
    """Why `name` cannot be fitted to these samples, or None."""
    if name == "quadratic":
        if len(chunk_len) < MIN_QUADRATIC_POINTS:
            return f"quadratic needs >= {MIN_QUADRATIC_POINTS} samples, has {len(chunk_len)}"
        if len(np.unique(prefix_len + chunk_len)) < 3:
            return "quadratic needs >= 3 distinct total lengths"
        return None
    num_chunks, num_prefixes = len(np.unique(chunk_len)), len(np.unique(prefix_len))
    if num_chunks < MIN_PREFIX_CHUNK_SIZES or num_prefixes < MIN_PREFIX_PREFIXES:
        return (f"prefix needs >= {MIN_PREFIX_CHUNK_SIZES} distinct chunk sizes and >= {MIN_PREFIX_PREFIXES} distinct "
                f"prefixes, has {num_chunks} and {num_prefixes}")
    return None


def design(name: str, prefix_len, chunk_len, terms=None) -> np.ndarray:
    """Columns of the model's regressors, intercept included as a column of ones (used for the condition number)."""
    L = np.asarray(prefix_len, dtype=float)
    x = np.asarray(chunk_len, dtype=float)
    if name == "quadratic":
        l = L + x
        return np.column_stack([np.ones_like(l), l, l * l])
    cols = {"c": np.ones_like(L), "g": L, "b": x, "a": 2.0 * L * x + x * x}
    return np.column_stack([cols[t] for t in (terms or PREFIX_TERMS)])


def fit_model(name: str, prefix_len: np.ndarray, chunk_len: np.ndarray, latency_ms: np.ndarray) -> LatencyModel:
    reason = ineligible(name, prefix_len, chunk_len)
    if reason:
        raise Unfittable(reason)
    if name == "quadratic":
        X = design(name, prefix_len, chunk_len)[:, 1:]
        reg = LinearRegression().fit(X, latency_ms)
        b, a = (float(v) for v in reg.coef_)
        if a <= 0.0:
            raise Unfittable(f"quadratic fit has a = {a:.3g} ms/token^2 <= 0 (latency does not grow faster than "
                             f"linearly in these samples)")
        return LatencyModel("quadratic", a=a, b=max(b, 0.0), c=float(reg.intercept_))
    terms = list(PREFIX_TERMS)
    mean = float(np.mean(latency_ms))
    while True:
        cols = [t for t in terms if t != "c"]
        if not cols:
            raise Unfittable("prefix fit has no term left with a non-negative coefficient")
        X = design(name, prefix_len, chunk_len, cols)
        reg = LinearRegression(fit_intercept="c" in terms).fit(X, latency_ms)
        coefs = dict(zip(cols, (float(v) for v in reg.coef_)))
        if "c" in terms:
            coefs["c"] = float(reg.intercept_)
        shares = {t: coefs[t] * (X[:, cols.index(t)].mean() if t != "c" else 1.0) / mean for t in terms}
        negative = [t for t in terms if coefs[t] < 0.0]
        if not negative:
            break
        terms.remove(min(negative, key=lambda t: shares[t]))
    values = {t: coefs.get(t, 0.0) for t in PREFIX_TERMS}
    return LatencyModel("prefix", **values)


def outlier_mask(model: LatencyModel, prefix_len, chunk_len, latency_ms) -> np.ndarray:
    """True for points to keep (see the module docstring)."""
    pred = model.sample_latency_ms(prefix_len, chunk_len)
    rel = (latency_ms - pred) / np.maximum(np.abs(pred), 1e-12)
    dev = np.abs(rel - np.median(rel))
    threshold = max(OUTLIER_MADS * MAD_TO_SIGMA * float(np.median(dev)), MIN_OUTLIER_REL)
    keep = np.ones(len(rel), dtype=bool)
    worst = np.argsort(-dev)[: int(MAX_OUTLIER_FRACTION * len(rel))]
    keep[worst[dev[worst] > threshold]] = False
    return keep


def cross_validate(name: str, prefix_len, chunk_len, latency_ms, folds: int = CV_FOLDS) -> float:
    """k-fold cross-validated mean absolute percentage error (a fraction); a fold that cannot be fitted: inf."""
    n = len(latency_ms)
    folds = min(folds, n)
    if folds < 2:
        return float("inf")
    errors = np.empty(n)
    for train, test in KFold(n_splits=folds, shuffle=True, random_state=CV_SEED).split(prefix_len):
        try:
            model = fit_model(name, prefix_len[train], chunk_len[train], latency_ms[train])
        except Unfittable:
            return float("inf")
        pred = model.sample_latency_ms(prefix_len[test], chunk_len[test])
        errors[test] = np.abs(latency_ms[test] - pred) / latency_ms[test]
    return float(errors.mean())


def condition_number(name: str, prefix_len, chunk_len) -> float:
    """Condition number of the design with every column scaled to unit length."""
    X = design(name, prefix_len, chunk_len)
    norms = np.linalg.norm(X, axis=0)
    if np.any(norms == 0):
        return float("inf")
    return float(np.linalg.cond(X / norms))


def diagnostics(model: LatencyModel, prefix_len, chunk_len, latency_ms, cv_mape: float, num_outliers: int) -> dict:
    pred = model.sample_latency_ms(prefix_len, chunk_len)
    resid = latency_ms - pred
    worst = int(np.argmax(np.abs(resid)))
    return {
        "num_samples": int(len(latency_ms)),
        "num_outliers_dropped": int(num_outliers),
        "outlier_rule": OUTLIER_RULE,
        "cv_folds": int(min(CV_FOLDS, len(latency_ms))),
        "cv_mape": cv_mape,
        "r2": float(r2_score(latency_ms, pred)) if len(latency_ms) > 1 else float("nan"),
        "rms_residual_ms": float(np.sqrt(np.mean(resid**2))),
        "mean_latency_ms": float(np.mean(latency_ms)),
        "worst_residual": {"residual_ms": float(resid[worst]), "relative": float(resid[worst] / latency_ms[worst]),
                           "prefix_len": int(prefix_len[worst]), "chunk_len": int(chunk_len[worst]),
                           "latency_ms": float(latency_ms[worst])},
        "condition_number": condition_number(model.name, prefix_len, chunk_len),
    }


def fit_candidates(prefix_len, chunk_len, latency_ms, requested: str) -> tuple[dict, dict]:
    """Fit each requested model (both for 'auto') with trimming and CV.

    Returns ({name: (model, keep_mask, cv_mape)} for the models that fitted, {name: reason} for those that did not).
    """
    names = MODEL_NAMES if requested == "auto" else (requested,)
    fitted, failed = {}, {}
    for name in names:
        try:
            first = fit_model(name, prefix_len, chunk_len, latency_ms)
            keep = outlier_mask(first, prefix_len, chunk_len, latency_ms)
            L, x, y = prefix_len[keep], chunk_len[keep], latency_ms[keep]
            model = fit_model(name, L, x, y)
            fitted[name] = (model, keep, cross_validate(name, L, x, y))
        except Unfittable as e:
            failed[name] = str(e)
    return fitted, failed

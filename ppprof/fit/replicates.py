"""Many fits at once: a model's regressors in the prefix form (every model is that form with the terms it lacks at 0)
and its fit to many replicates of the same rows, one least-squares solve for all of them (the resampled fits of the
status's interval, ppprof.fit.confidence, and of the adaptive design's bootstrap). Pure numpy."""

from __future__ import annotations

import numpy as np

from ppprof.fit.forms import Unfittable, admissible, design, ineligible
from ppprof.fit.least_squares import fit_model, pairs_hold
from ppprof.policy.rule import MODEL_COEFS, LatencyModel

FORM_TERMS = ("c", "g", "b", "a", "h")
"""The prefix form's coefficients, in the order of regressors' columns."""


def model_terms(name: str) -> tuple[str, ...]:
    """The coefficients of model `name` in FORM_TERMS order: quadratic (c, b, a), prefix (c, g, b, a), pairs (c, g,
    b, a, h)."""
    return tuple(t for t in FORM_TERMS if t in MODEL_COEFS[name])


def regressors(name: str, prefix_len, chunk_size) -> np.ndarray:
    """(n, terms) regressors z of chunk_latency_ms in model_terms(name) order: t(L, x) = z . theta on every row."""
    return design("prefix", prefix_len, chunk_size, model_terms(name))


def as_fitted(name: str, coefs: np.ndarray, chunk_size) -> bool:
    """Whether least-squares coefficients are what fit_model would return on the same rows (`chunk_size`: theirs):
    non-negative (prefix: no term to drop; pairs: the bounded solution, its h of either sign where pairs_hold), or
    for the quadratic a > 0 and b >= 0 (c may take any sign)."""
    terms = dict(zip(model_terms(name), coefs))
    if name == "quadratic":
        return terms["a"] > 0.0 and terms["b"] >= 0.0
    if name == "pairs":
        return all(terms[t] >= 0.0 for t in terms if t != "h") and pairs_hold(terms["a"], terms["h"], chunk_size)
    return bool(np.all(coefs >= 0.0))


def least_squares(Z: np.ndarray, Y: np.ndarray) -> np.ndarray:
    """(terms, replicates) least-squares coefficients of every row of Y (replicates, rows) on the regressors Z
    (rows, terms), the columns scaled to unit length: one solve for all replicates."""
    norms = np.linalg.norm(Z, axis=0)
    norms[norms == 0] = 1.0
    # the pseudo-inverse of the small design once, then one product for all replicates (lstsq's LAPACK solve with
    # 200 right-hand sides took 25 ms on the shared 2-core host, this a tenth of that)
    return (np.linalg.pinv(Z / norms) @ Y.T) / norms[:, None]


def refit_all(name: str, L, x, Y: np.ndarray) -> list[LatencyModel | None]:
    """Model `name` fitted to each row of Y (replicates, rows) on its admissible rows of L, x: one least-squares
    solve for all, the replicates whose solution fit_model would not return refitted one by one with fit_model;
    None where a replicate cannot be fitted."""
    rows = admissible(name, L)
    L, x, Y = np.asarray(L)[rows], np.asarray(x)[rows], np.asarray(Y)[:, rows]
    coefs = least_squares(regressors(name, L, x), Y) if ineligible(name, L, x) is None else None
    out: list[LatencyModel | None] = []
    for b in range(Y.shape[0]):
        if coefs is not None and as_fitted(name, coefs[:, b], x):
            out.append(LatencyModel(name, **dict(zip(model_terms(name), (float(v) for v in coefs[:, b])))))
            continue
        try:
            out.append(fit_model(name, L, x, Y[b]))
        except (Unfittable, ValueError):
            out.append(None)
    return out

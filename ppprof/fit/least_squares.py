"""Fitting one latency model form (ppprof.fit.forms) to timed samples: least squares (scikit-learn), the prefix form's
refit without its most negative term, the pairs form's bounded fit (scipy), and outlier trimming. scikit-learn and
scipy are imported by the functions that fit (0.6 s): the CLI and the ranks, which import this module through the
adaptive design, start without them.

Robustness: after a first fit, rows whose relative residual lies more than OUTLIER_MADS robust sigmas (1.4826 MAD,
at least MIN_OUTLIER_REL) from the median are dropped, at most MAX_OUTLIER_FRACTION of them, and the model refitted.
"""

from __future__ import annotations

import numpy as np

from ppprof.fit.forms import MODEL_TERMS, Unfittable, admissible, design, ineligible
from ppprof.policy.rule import LatencyModel

OUTLIER_MADS = 5.0
MIN_OUTLIER_REL = 0.05
MAX_OUTLIER_FRACTION = 0.10
MAD_TO_SIGMA = 1.4826
PAIR_HEADROOM = 2.0
"""A pairs model's negative h holds up to this many times the largest chunk fitted (a + h x >= 0 there: the latency
grows with the chunk at every prefix): beyond the largest plan a policy makes, --extrapolate's 4 B included."""
OUTLIER_RULE = (
    f"after a first fit, drop points whose relative residual is more than {OUTLIER_MADS:g} x 1.4826 MAD "
    f"(at least {MIN_OUTLIER_REL:.0%}) from the median, at most {MAX_OUTLIER_FRACTION:.0%} of points, "
    f"then refit"
)


def fit_model(name: str, prefix_len: np.ndarray, chunk_size: np.ndarray, latency_ms: np.ndarray) -> LatencyModel:
    """Least squares on the model's admissible rows among those given (no trimming)."""
    from sklearn.linear_model import LinearRegression  # here: a rank that never fits need not import scikit-learn

    reason = ineligible(name, prefix_len, chunk_size)
    if reason:
        raise Unfittable(reason)
    if name == "quadratic":
        free = admissible(name, prefix_len)
        X = design(name, prefix_len[free], chunk_size[free])[:, 1:]
        reg = LinearRegression().fit(X, latency_ms[free])
        b, a = (float(v) for v in reg.coef_)
        if a <= 0.0:
            raise Unfittable(
                f"quadratic fit has a = {a:.3g} ms/token^2 <= 0 (latency does not grow faster than "
                f"linearly in the prefix-free samples)"
            )
        return LatencyModel("quadratic", a=a, b=max(b, 0.0), c=float(reg.intercept_))

    if name == "pairs":
        return fit_bounded(name, prefix_len, chunk_size, latency_ms)
    terms = list(MODEL_TERMS[name])
    mean = float(np.mean(latency_ms))
    while True:
        cols = [t for t in terms if t != "c"]
        if not cols:
            raise Unfittable(f"{name} fit has no term left with a non-negative coefficient")
        X = design(name, prefix_len, chunk_size, cols)
        reg = LinearRegression(fit_intercept="c" in terms).fit(X, latency_ms)
        coefs = dict(zip(cols, (float(v) for v in reg.coef_)))
        if "c" in terms:
            coefs["c"] = float(reg.intercept_)
        shares = {t: coefs[t] * (X[:, cols.index(t)].mean() if t != "c" else 1.0) / mean for t in terms}
        negative = [t for t in terms if coefs[t] < 0.0]
        if not negative:
            break
        terms.remove(min(negative, key=lambda t: shares[t]))
    values = {t: coefs.get(t, 0.0) for t in MODEL_TERMS[name]}
    return LatencyModel(name, **values)


def pairs_hold(a: float, h: float, chunk_size) -> bool:
    """Whether a pairs model's pair term stays increasing in the chunk: a + h x >= 0 up to PAIR_HEADROOM x the
    largest of `chunk_size` (always for h >= 0)."""
    return h >= 0.0 or a + h * PAIR_HEADROOM * float(np.max(chunk_size)) >= 0.0


def fit_bounded(name: str, prefix_len, chunk_size, latency_ms) -> LatencyModel:
    """Bounded least squares on the model's terms, columns scaled to unit length for conditioning: every term >= 0
    but the pairs model's h, which may be negative where pairs_hold (else it is refitted with h >= 0 too)."""
    from scipy.optimize import lsq_linear, nnls

    X = design(name, prefix_len, chunk_size)
    norms = np.linalg.norm(X, axis=0)
    norms[norms == 0] = 1.0
    y = np.asarray(latency_ms, dtype=float)
    terms = MODEL_TERMS[name]
    low = np.array([-np.inf if t == "h" else 0.0 for t in terms])
    coef = lsq_linear(X / norms, y, bounds=(low, np.inf), method="bvls").x / norms
    values = dict(zip(terms, (float(v) for v in coef)))
    if not pairs_hold(values["a"], values.get("h", 0.0), chunk_size):
        coef, _ = nnls(X / norms, y)
        values = dict(zip(terms, (float(v) for v in coef / norms)))
    return LatencyModel(name, **values)


def outlier_mask(model: LatencyModel, prefix_len, chunk_size, latency_ms) -> np.ndarray:
    """True for points to keep (see the module docstring: Robustness)."""
    pred = model.chunk_latency_ms(prefix_len, chunk_size)
    rel = (latency_ms - pred) / np.maximum(np.abs(pred), 1e-12)
    dev = np.abs(rel - np.median(rel))
    threshold = max(OUTLIER_MADS * MAD_TO_SIGMA * float(np.median(dev)), MIN_OUTLIER_REL)
    keep = np.ones(len(rel), dtype=bool)
    worst = np.argsort(-dev)[: int(MAX_OUTLIER_FRACTION * len(rel))]
    keep[worst[dev[worst] > threshold]] = False
    return keep


def fit_trimmed(name: str, prefix_len, chunk_size, latency_ms) -> tuple[LatencyModel, np.ndarray]:
    """Fit on the admissible rows, drop their outliers, refit; return (model, mask of the rows it was fitted to)."""
    rows = admissible(name, prefix_len)
    L, x, y = prefix_len[rows], chunk_size[rows], latency_ms[rows]
    first = fit_model(name, L, x, y)
    keep = outlier_mask(first, L, x, y)
    model = fit_model(name, L[keep], x[keep], y[keep])
    fit_rows = rows.copy()
    fit_rows[rows] = keep
    return model, fit_rows

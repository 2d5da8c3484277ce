"""Least-squares fits of the latency models (scikit-learn), outlier trimming, k-fold cross-validation, diagnostics.
scikit-learn is imported by the functions that fit (0.6 s): the CLI and the ranks, which import this module through
the adaptive design, start without it.

- quadratic (SGLang): f(l) = a l^2 + b l + c, fitted only on prefix-free rows (prefix_len == 0), where a request of l
  tokens really takes f(l) (SGLang profiles prefix-free requests only); >= 8 such rows; a <= 0 is a failure; a
  negative b is set to 0 (SGLang clamps it). Prefixed rows are not fitted, but they are scored.
- prefix (ATOM): t(L, x) = c + g L + b x + a (2 L x + x^2) on all rows; >= 2 distinct chunk sizes and >= 3 distinct
  prefixes. Coefficients must be non-negative: the most negative term (by its share of the mean latency) is dropped
  from the design and the rest refitted, until none is negative (a refit, not a clamp, so the others absorb its share).
- pairs: the prefix form plus h L x^2, a per-pair attention cost a + h x / 2 that changes with the chunk (cache and
  tile effects: on CPU a query-key pair costs less in a larger chunk, whose block of queries reuses each key, h < 0);
  exact bounded least squares (scipy's lsq_linear) with c, g, b, a >= 0 and h of either sign, so it never fits worse
  than the prefix model it contains (h = 0). A negative h is kept only while a + h x >= 0 up to PAIR_HEADROOM x the
  largest chunk fitted, where the latency then still grows with the chunk at every prefix; else h >= 0 (nnls).
Every prediction, for scoring and diagnostics alike, is the planner's: model.chunk_latency_ms(prefix_len, chunk_size)
(for the quadratic, c + f(L + x) - f(L), which is f(x) on a prefix-free row).
Robustness: after a first fit, rows whose relative residual lies more than OUTLIER_MADS robust sigmas (1.4826 MAD,
at least MIN_OUTLIER_REL) from the median are dropped, at most MAX_OUTLIER_FRACTION of them, and the model refitted.
Model choice: k-fold CV on the same evaluation rows (all rows given) for every model; in each fold each model is fitted
(with trimming) on its admissible training rows and scored on every held-out row.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ppprof.policy.rule import MODEL_NAMES, LatencyModel

MIN_QUADRATIC_POINTS = 8
MIN_QUADRATIC_LENGTHS = 3
MIN_PREFIX_CHUNK_SIZES = 2
MIN_PREFIX_PREFIXES = 3
CV_FOLDS = 5
CV_SEED = 0
OUTLIER_MADS = 5.0
MIN_OUTLIER_REL = 0.05
MAX_OUTLIER_FRACTION = 0.10
MAD_TO_SIGMA = 1.4826
PREFIX_TERMS = ("c", "g", "b", "a")
MODEL_TERMS = {"prefix": PREFIX_TERMS, "pairs": PREFIX_TERMS + ("h",)}
PAIR_HEADROOM = 2.0
"""A pairs model's negative h holds up to this many times the largest chunk fitted (a + h x >= 0 there: the latency
grows with the chunk at every prefix): beyond the largest plan a policy makes, --extrapolate's 4 B included."""
OUTLIER_RULE = (
    f"after a first fit, drop points whose relative residual is more than {OUTLIER_MADS:g} x 1.4826 MAD "
    f"(at least {MIN_OUTLIER_REL:.0%}) from the median, at most {MAX_OUTLIER_FRACTION:.0%} of points, "
    f"then refit"
)
ADMISSIBLE_ROWS = {
    "quadratic": "prefix-free rows (prefix_len == 0)",
    "prefix": "rows, prefix-free and prefixed",
    "pairs": "rows, prefix-free and prefixed",
}


class Unfittable(Exception):
    """The samples do not support the model (not bad input: the policy becomes static with this reason)."""


def admissible(name: str, prefix_len) -> np.ndarray:
    """Rows the model may be fitted to: the quadratic's f(l) is a request's latency only without a prefix."""
    prefix_len = np.asarray(prefix_len)
    return prefix_len == 0 if name == "quadratic" else np.ones(len(prefix_len), dtype=bool)


def ineligible(name: str, prefix_len: np.ndarray, chunk_size: np.ndarray) -> str | None:
    """Why `name` cannot be fitted to these samples, or None."""
    if name == "quadratic":
        free = admissible(name, prefix_len)
        num_free = int(free.sum())
        if num_free < MIN_QUADRATIC_POINTS:
            return (
                f"quadratic needs >= {MIN_QUADRATIC_POINTS} prefix-free samples (prefix_len == 0), has {num_free} "
                f"of {len(prefix_len)}: profile a prefix-free sweep or use the prefix model"
            )
        if len(np.unique(chunk_size[free])) < MIN_QUADRATIC_LENGTHS:
            return f"quadratic needs >= {MIN_QUADRATIC_LENGTHS} distinct lengths among its prefix-free samples"
        return None
    num_chunks, num_prefixes = len(np.unique(chunk_size)), len(np.unique(prefix_len))
    if num_chunks < MIN_PREFIX_CHUNK_SIZES or num_prefixes < MIN_PREFIX_PREFIXES:
        return (
            f"{name} needs >= {MIN_PREFIX_CHUNK_SIZES} distinct chunk sizes and >= {MIN_PREFIX_PREFIXES} distinct "
            f"prefixes, has {num_chunks} and {num_prefixes}"
        )
    return None


def design(name: str, prefix_len, chunk_size, terms=None) -> np.ndarray:
    """Columns of the model's regressors, intercept included as a column of ones (used for the condition number).

    quadratic: [1, l, l^2] with l = chunk_size, for its prefix-free rows only (pass those).
    """
    L = np.asarray(prefix_len, dtype=float)
    x = np.asarray(chunk_size, dtype=float)
    if name == "quadratic":
        return np.column_stack([np.ones_like(x), x, x * x])
    cols = {"c": np.ones_like(L), "g": L, "b": x, "a": 2.0 * L * x + x * x, "h": L * x * x}
    return np.column_stack([cols[t] for t in (terms or MODEL_TERMS[name])])


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
    """True for points to keep (see the module docstring)."""
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


def cv_splits(prefix_len, folds: int):
    """k folds over all rows, shuffled; stratified by prefix-free or not where both kinds fill every fold, so each
    training set keeps its share of the quadratic's rows."""
    from sklearn.model_selection import KFold, StratifiedKFold

    free = np.asarray(prefix_len) == 0
    if min(free.sum(), (~free).sum()) >= folds:
        return StratifiedKFold(n_splits=folds, shuffle=True, random_state=CV_SEED).split(free, free)
    return KFold(n_splits=folds, shuffle=True, random_state=CV_SEED).split(free)


def band_splits(prefix_len) -> list[tuple[np.ndarray, np.ndarray]]:
    """Leave one prefix band out: each prefixed band (one probe's prefix length) is held out in turn and the rest,
    the prefix-free sweep always among them, trains. [] with fewer than two prefixed bands."""
    prefix_len = np.asarray(prefix_len)
    bands = np.unique(prefix_len[prefix_len > 0])
    if len(bands) < 2:
        return []
    rows = np.arange(len(prefix_len))
    return [(rows[prefix_len != band], rows[prefix_len == band]) for band in bands]


def chunk_range_splits(prefix_len, chunk_size) -> list[tuple[np.ndarray, np.ndarray]]:
    """Hold out the smallest and then the largest third of the prefixed rows' chunk sizes (every prefix at once), so
    the fit must reach chunk sizes it did not see. [] with fewer than three distinct prefixed chunk sizes."""
    prefix_len, chunk_size = np.asarray(prefix_len), np.asarray(chunk_size)
    sizes = np.unique(chunk_size[prefix_len > 0])
    if len(sizes) < 3:
        return []
    third = max(1, len(sizes) // 3)
    rows = np.arange(len(prefix_len))
    out = []
    for held in (sizes[:third], sizes[-third:]):
        test = (prefix_len > 0) & np.isin(chunk_size, held)
        out.append((rows[~test], rows[test]))
    return out


def held_out_splits(prefix_len, chunk_size) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every prefix band held out in turn (with at least three, so that two remain to fit the prefix terms), then the
    smallest and the largest chunk sizes: what the model is asked beyond its samples. [] where neither applies."""
    bands = band_splits(prefix_len) if len(np.unique(np.asarray(prefix_len)[np.asarray(prefix_len) > 0])) >= 3 else []
    return bands + chunk_range_splits(prefix_len, chunk_size)


def cross_validate(names, prefix_len, chunk_size, latency_ms, folds: int = CV_FOLDS, splits=None) -> dict[str, float]:
    """k-fold cross-validated mean absolute percentage error (a fraction) of each model, on the same rows.

    Every row is held out once, and the score is the mean over rows; with `splits` (e.g. held_out_splits, whose
    folds may overlap) it is the mean over folds of each fold's MAPE. In each fold every model is fitted (with
    trimming) on its admissible training rows and scored on all the fold's held-out rows with chunk_latency_ms, as
    the planner uses it. A model that cannot be fitted in some fold scores inf.
    """
    n = len(latency_ms)
    folds = min(folds, n)
    if folds < 2:
        return {name: float("inf") for name in names}
    errors = {name: np.full(n, np.nan) for name in names}
    fold_means: dict[str, list[float]] = {name: [] for name in names}
    unfittable = set()
    for train, test in splits if splits is not None else cv_splits(prefix_len, folds):
        for name in set(names) - unfittable:
            try:
                model, _ = fit_trimmed(name, prefix_len[train], chunk_size[train], latency_ms[train])
            except Unfittable:
                unfittable.add(name)
                continue
            pred = model.chunk_latency_ms(prefix_len[test], chunk_size[test])
            errors[name][test] = np.abs(latency_ms[test] - pred) / latency_ms[test]
            fold_means[name].append(float(errors[name][test].mean()))
    if splits is not None:
        return {name: float("inf") if name in unfittable else float(np.mean(fold_means[name])) for name in names}
    return {name: float("inf") if name in unfittable else float(np.nanmean(errors[name])) for name in names}


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

"""Model choice by cross-validation: k-fold splits of the evaluation rows, the held-out prefix bands and chunk ranges,
and each model's cross-validated MAPE. On the same evaluation rows (all rows given) for every model, in each fold each
model is fitted (with trimming) on its admissible training rows and scored on every held-out row. scikit-learn is
imported by the functions that use it.
"""

from __future__ import annotations

import numpy as np

from ppprof.fit.forms import Unfittable
from ppprof.fit.least_squares import fit_trimmed

CV_FOLDS = 5
CV_SEED = 0


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


def long_prefix_rows(prefix_len) -> np.ndarray:
    """(n,) True for the rows at a long prefix: prefixed, at or above the median of the distinct prefixed prefix
    lengths (the longer half of the profiled prefixes, where the policy's chunks shrink most)."""
    prefix_len = np.asarray(prefix_len)
    levels = np.unique(prefix_len[prefix_len > 0])
    if not len(levels):
        return np.zeros(len(prefix_len), dtype=bool)
    return prefix_len >= np.median(levels)


def fold_errors(names, prefix_len, chunk_size, latency_ms, splits) -> dict[str, np.ndarray | None]:
    """{name: (folds, 3) array: each fold's held-out MAPE on all its held-out rows, on those at a long prefix
    (long_prefix_rows; nan where the fold holds none), and its number of held-out rows}, each model fitted with
    trimming on its admissible training rows and scored with chunk_latency_ms as the planner uses it; None for a
    model that cannot be fitted in some fold."""
    long = long_prefix_rows(prefix_len)
    out: dict[str, np.ndarray | None] = {}
    splits = list(splits)
    for name in names:
        rows: list | None = []
        for train, test in splits:
            try:
                model, _ = fit_trimmed(name, prefix_len[train], chunk_size[train], latency_ms[train])
            except Unfittable:
                rows = None
                break
            pred = model.chunk_latency_ms(prefix_len[test], chunk_size[test])
            err = np.abs(latency_ms[test] - pred) / latency_ms[test]
            at = long[test]
            rows.append((err.mean(), err[at].mean() if at.any() else np.nan, len(test)))
        out[name] = None if rows is None else np.array(rows, dtype=float).reshape(-1, 3)
    return out


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


NOISE_SES = 1.0
"""Two models are within noise of each other on held-out rows when the mean over folds of their difference in
held-out MAPE is at most this many of its standard errors (the one-standard-error rule of Hastie, Tibshirani and
Friedman, ESL 7.10, the folds paired)."""
ERROR_RESOLUTION = 1e-4
"""Held-out MAPEs closer than this (0.01%) are equal: no timing resolves them (exact samples score every model that
contains the surface at rounding error)."""
CHOICE_RULE = (
    "the least held-out MAPE (mean over folds); among the models within one standard error of it (the folds "
    "paired), the least cross-validated MAPE at long prefixes (5 folds; the prefixed rows at or above the median "
    "profiled prefix length, where the policy's chunks shrink); among those within one standard error of that, "
    "the fewest coefficients"
)


def fold_mean(errors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, folds) over the last axis of the finite values (nan where there is none)."""
    finite = np.isfinite(errors)
    n = finite.sum(axis=-1)
    total = np.where(finite, errors, 0.0).sum(axis=-1)
    return np.where(n > 0, total / np.maximum(n, 1), np.nan), n


def within_noise(errors: np.ndarray, best: np.ndarray) -> np.ndarray:
    """(models, replicates) True where a model's fold errors (models, replicates, folds; nan where a fold has no
    rows to score, inf where the model could not be fitted) are within NOISE_SES standard errors of the `best`
    model's (replicates,), the folds paired; the best model always is."""
    with np.errstate(invalid="ignore"):  # inf - inf (two models that could not be fitted): nan, not a fold
        d = errors - np.take_along_axis(errors, best[None, :, None], axis=0)
    mean, n = fold_mean(d)
    finite = np.isfinite(d)
    sq = np.where(finite, (d - np.nan_to_num(mean)[..., None]) ** 2, 0.0).sum(axis=-1)
    se = np.sqrt(sq / np.maximum(n - 1, 1) / np.maximum(n, 1))
    fitted = ~np.isinf(errors).any(axis=2)
    near = fitted & (n >= 1) & (np.nan_to_num(mean, nan=np.inf) <= NOISE_SES * se + ERROR_RESOLUTION)
    near[best, np.arange(errors.shape[1])] = True
    return near


def choose_model(errors: np.ndarray, long_errors: np.ndarray) -> np.ndarray:
    """(replicates,) index of the model CHOICE_RULE picks, from each model's fold errors (models, replicates, folds):
    `errors` on all held-out rows of the held-out folds, `long_errors` on the rows at a long prefix of the k folds
    (nan where a fold holds none; inf where the model could not be fitted); the models in order of their number of
    coefficients (MODEL_NAMES)."""
    cols = np.arange(errors.shape[1])
    score = np.where(np.isinf(errors).any(axis=2), np.inf, fold_mean(errors)[0])  # (models, replicates)
    best = np.argmin(score, axis=0)  # the first of equals: the fewest coefficients
    near = within_noise(errors, best)
    long_mean, long_folds = fold_mean(long_errors)
    long_score = np.where(near & (long_folds >= 2), long_mean, np.inf)
    judged = np.isfinite(long_score).any(axis=0)  # replicates whose long-prefix rows can tell the near models apart
    best_long = np.where(judged, np.argmin(long_score, axis=0), best)
    nearer = near & (within_noise(long_errors, best_long) | ~judged[None, :])
    nearer[best_long, cols] = True
    return np.argmax(nearer, axis=0)

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

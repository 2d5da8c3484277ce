"""How sure the samples make the policy's decision: the model's form judged on cell medians, where row noise averages
out, and the predicted gain over the best fixed chunk resampled. Pure numpy; no torch.

Cells: the rows of one (prefix_len, chunk_size); the chunk sizes of a prefix length that hold fewer than MIN_CELL_ROWS
rows (the sweep's one request a chunk size) are pooled with their neighbours into cells of MIN_CELL_ROWS rows. In logs
(timing noise is multiplicative, so symmetric there), a cell's deviation is the median of its rows' log(latency /
model) less the offset, the cells' mean of those medians weighted by their latency (a least-squares fit runs through
the mean of skewed timing noise, above its median by a common factor: an offset, not a form). The form error is the RMS
of the deviations, each cell weighted by its median latency (the share of a prompt's time it stands for), less the
noise each median carries (1.2533 x sigma / sqrt(n), sigma from the pairs of rows of one cell, pooled over the cells
of its prefix length), at its lower bound (FORM_ERROR_SES standard errors below); a log deviation of 0.1 is 10.5%.

Resampling (RESAMPLES replicates, seed SEED): the rows the model was fitted to, as run; each row's log residual is
its probe's offset (the median of the probe's log residuals: the shared slowness of the probe) plus its own. A
replicate gives every probe an offset drawn whole from the probes' (centred) and every row a residual drawn from its
cell's (MIN_CELL_ROWS or more rows) or else its probe's, and refits the model. Each refit prices the policy's own plans
of the workload and every fixed chunk of the domain on its planning model: the gain of the plans over the refit's best
fixed chunk (at least -1, 100% slower). A replicate that cannot be fitted counts as -1.

The model choice is part of the interval (rechosen_refits): where the choice ranges over several models, the
replicates are drawn about the richest of them (a bootstrap from the full model, then the choice made again in each
replicate, as Buckland, Burnham and Augustin, Biometrics 1997, put the selection into the interval), each replicate
chooses by the policy's own rule (ppprof.fit.crossval.CHOICE_RULE) on its held-out folds, and the model it chose is
refitted to it. So a status that depends on which model wins is not sure until the samples settle the choice. The
replicates' folds are scored with plain least squares on the rows the richest model kept (no trimming, no sign
constraints: one solve for all replicates a fold), the equivalent of the point choice's trimmed fits at a
hundredth of their cost.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ppprof.config.workload import Workload
from ppprof.fit.crossval import CV_FOLDS, choose_model, cv_splits, held_out_splits, long_prefix_rows
from ppprof.fit.forms import admissible, ineligible
from ppprof.fit.regress import Fit
from ppprof.fit.replicates import least_squares, refit_all, regressors
from ppprof.fit.samples import Samples
from ppprof.policy.planners import fixed_chunks
from ppprof.policy.rule import MODEL_NAMES, LatencyModel

RESAMPLES = 200
"""Replicates of the gain: its 10th percentile rests on the 20 lowest, and 200 refits cost well under a second."""
SEED = 0
LOWER_QUANTILE = 0.10
"""The gain's lower bound is its 10th percentile over the replicates (a one-sided 90% bound): a dynamic policy whose
gain is not there costs little (the rules plan within a few % of fixed chunks), so 90% suffices, and a tail of 20
replicates keeps the bound steady from one seed to the next where a 5th percentile of 10 would not."""
MIN_CELL_ROWS = 3
MAX_FORM_ERROR = 0.10
"""The most RMS deviation of the cells' medians from the model, noise removed: the 10% the per-row CV gate held rows
to, now held by cells, where timing noise averages out and a wrong form does not."""
PAIR_MEDIAN = math.sqrt(2.0) * 0.6744897501960817
"""The median |difference| of two normal values of sigma 1."""
FORM_ERROR_SES = 2.0
"""The form error judged is its lower bound: the squared estimate less this many of its standard errors under noise
alone (a design of few cells, each of few rows, estimates it poorly; a wrong form is refused when the samples show
it, not when noise might)."""
MEDIAN_SE = math.sqrt(math.pi / 2)
"""The standard error of a median of n normal values is this x sigma / sqrt(n)."""


def cells(prefix_len: np.ndarray, chunk_size: np.ndarray) -> np.ndarray:
    """(n,) cell index of each row: its (prefix_len, chunk_size) where that chunk size has MIN_CELL_ROWS rows or more;
    the rows of the sizes with fewer pooled with their neighbouring such sizes' in runs of MIN_CELL_ROWS (a short last
    run joins the one before). A well-filled size stays one cell even where others of its prefix length are pooled: cut
    into runs of rows in the order they ran, a burst on the host over a few consecutive requests took a whole run's
    median (two adaptive profiles of 2026-12-05 failed the form check on one such 3-row run at 2.5-2.7x the model)."""
    out = np.empty(len(prefix_len), dtype=np.int64)
    next_id = 0
    for L in np.unique(prefix_len):
        rows = np.flatnonzero(prefix_len == L)
        _, same, counts = np.unique(chunk_size[rows], return_inverse=True, return_counts=True)
        full = counts[same] >= MIN_CELL_ROWS
        bins = np.empty(len(rows), dtype=np.int64)
        bins[full] = np.unique(same[full], return_inverse=True)[1]
        taken = int(bins[full].max()) + 1 if full.any() else 0
        sparse = np.flatnonzero(~full)
        if sparse.size:
            rank = np.empty(sparse.size, dtype=np.int64)
            rank[np.argsort(chunk_size[rows[sparse]], kind="stable")] = np.arange(sparse.size)
            bins[sparse] = taken + np.minimum(rank // MIN_CELL_ROWS, max(0, sparse.size // MIN_CELL_ROWS - 1))
        out[rows] = next_id + bins
        next_id += int(bins.max()) + 1
    return out


def form_check(model: LatencyModel, used: Samples) -> dict:
    """The model against the medians of the cells of every evaluation row (`used`): each cell's deviation, the noise
    of its median, and the form error (module doc); passed when the form error is at most MAX_FORM_ERROR."""
    L, x, y = used.prefix_len, used.chunk_size, used.chunk_latency_ms
    ratio = np.log(y / model.chunk_latency_ms(L, x))  # timing noise is multiplicative: symmetric in logs
    cell = cells(L, x)
    ids = np.unique(cell)
    med = np.array([np.median(ratio[cell == c]) for c in ids])
    n = np.array([(cell == c).sum() for c in ids])
    weight = np.array([np.median(y[cell == c]) for c in ids])
    offset = float(np.sum(weight * med) / weight.sum())
    dev = med - offset
    noise = MEDIAN_SE * np.sqrt(pooled_variance(ratio, cell, L, ids) / n)
    share = weight / weight.sum()
    excess = float(np.sum(share * (dev**2 - noise**2)))  # the squared form error, noise removed
    spread = float(np.sqrt(2.0 * np.sum(share**2 * noise**4)))  # its standard error were the form right
    error = math.sqrt(max(0.0, excess - FORM_ERROR_SES * spread))
    worst = int(np.argmax(np.abs(dev)))
    first = np.array([np.flatnonzero(cell == c)[0] for c in ids])
    return {
        "name": "form_error",
        "value": error,
        "estimate": math.sqrt(max(0.0, excess)),
        "op": "<=",
        "limit": MAX_FORM_ERROR,
        "passed": bool(error <= MAX_FORM_ERROR),
        "num_cells": int(len(ids)),
        "offset": math.exp(offset),
        "worst_cell": {
            "prefix_len": int(L[first[worst]]),
            "chunk_size": int(x[first[worst]]),
            "rows": int(n[worst]),
            "deviation": float(math.expm1(dev[worst])),
            "noise": float(noise[worst]),
        },
        "rule": (
            f"RMS over {len(ids)} cells (weighted by latency) of log(median latency / model / offset), less each "
            f"median's noise and {FORM_ERROR_SES:g} standard errors, <= {MAX_FORM_ERROR:.0%}; cells: (prefix_len, chunk_size), neighbouring chunk sizes pooled to "
            f"{MIN_CELL_ROWS} rows where fewer"
        ),
    }


def pooled_variance(ratio: np.ndarray, cell: np.ndarray, prefix_len: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """(cells,) the variance of one row's log(latency / model) (`ratio`) in each cell, pooled over the cells of its prefix length:
    (the median |difference| of two rows of one cell / PAIR_MEDIAN)^2 over every such pair of the prefix length. A
    median, so that a few slow rows do not pass for noise; pairs, so that cells of three rows estimate it without
    bias; pooled, since a few rows a cell estimate it poorly, a prefix length's hundred well."""
    prefix = np.array([prefix_len[cell == c][0] for c in ids])
    pairs = []
    for c in ids:
        r = ratio[cell == c]
        i, j = np.triu_indices(len(r), k=1)
        pairs.append(np.abs(r[i] - r[j]))
    out = np.empty(len(ids))
    for L in np.unique(prefix):
        at = np.flatnonzero(prefix == L)
        diffs = np.concatenate([pairs[k] for k in at])
        out[at] = (np.median(diffs) / PAIR_MEDIAN) ** 2 if len(diffs) else 0.0
    return out


def probe_ids(used: Samples) -> np.ndarray:
    """Each row's probe: the samples' probe column, else its prefix length (`ppprof profile` runs a probe a prefix)."""
    if used.probe is not None and np.all(np.isfinite(used.probe)):
        return np.asarray(used.probe)
    return np.asarray(used.prefix_len)


def resampled_latencies(model: LatencyModel, used: Samples, rows: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """(resamples, rows) latencies of the rows `rows` of `used` (module doc: probe offsets drawn whole, each row's own
    residual from its cell's or its probe's)."""
    L, x, y = used.prefix_len[rows], used.chunk_size[rows], used.chunk_latency_ms[rows]
    fitted = model.chunk_latency_ms(L, x)
    e = np.log(y / fitted)
    probe = probe_ids(used)[rows]
    probes, of_row = np.unique(probe, return_inverse=True)
    offset = np.array([np.median(e[of_row == p]) for p in range(len(probes))])
    own = e - offset[of_row]
    rng = np.random.default_rng(seed)
    drawn = (offset - offset.mean())[rng.integers(len(probes), size=(resamples, len(probes)))][:, of_row]
    cell = cells(L, x)
    for c in np.unique(cell):
        members = np.flatnonzero(cell == c)
        pool = members if len(members) >= MIN_CELL_ROWS else np.flatnonzero(of_row == of_row[members[0]])
        drawn[:, members] += own[pool][rng.integers(len(pool), size=(resamples, len(members)))]
    return fitted[None, :] * np.exp(drawn)


def refits(model: LatencyModel, used: Samples, fit_rows: np.ndarray, resamples: int, seed: int) -> list:
    """The model refitted (on the rows it was fitted to) to each replicate; None where one cannot be."""
    rows = np.flatnonzero(fit_rows)
    Y = resampled_latencies(model, used, rows, resamples, seed)
    return refit_all(model.name, used.prefix_len[rows], used.chunk_size[rows], Y)


def replicate_fold_errors(names, L, x, Y: np.ndarray, splits) -> tuple[np.ndarray, np.ndarray]:
    """(errors, long_errors), each (models, replicates, folds): every replicate's held-out MAPE in each fold, on all
    its rows and at long prefixes (nan where a fold holds none), of each model fitted by plain least squares to its
    admissible training rows; inf where the training rows cannot support the model (ppprof.fit.forms.ineligible)."""
    long = long_prefix_rows(L)
    shape = (len(names), Y.shape[0], len(splits))
    errors, long_errors = np.full(shape, np.inf), np.full(shape, np.inf)
    for m, name in enumerate(names):
        Z, ok = regressors(name, L, x), admissible(name, L)
        for f, (train, test) in enumerate(splits):
            train = train[ok[train]]
            if ineligible(name, L[train], x[train]) is not None:
                continue
            pred = Z[test] @ least_squares(Z[train], Y[:, train])  # (held-out rows, replicates)
            e = np.abs(Y[:, test] - pred.T) / Y[:, test]
            errors[m, :, f] = e.mean(axis=1)
            long_errors[m, :, f] = e[:, long[test]].mean(axis=1) if long[test].any() else np.nan
    return errors, long_errors


def rechosen_refits(fitted: dict[str, Fit], names, used: Samples, resamples: int, seed: int) -> tuple[list, list[str]]:
    """(models, chosen): the replicates drawn about the richest of the models `names` (those the choice ranges
    over) on the rows it was fitted to, each replicate's model chosen again by CHOICE_RULE on its folds (the point
    choice's: held-out, or k-fold where there are none) and refitted to it (module doc); a model None where the
    replicate cannot be fitted. With one model, its refits (as `refits`)."""
    names = [n for n in MODEL_NAMES if n in names]
    base = fitted[names[-1]]
    if len(names) == 1:
        return refits(base.model, used, base.fit_rows, resamples, seed), names * resamples
    rows = np.flatnonzero(base.fit_rows)
    Y = resampled_latencies(base.model, used, rows, resamples, seed)
    L, x = used.prefix_len[rows], used.chunk_size[rows]
    k_folds = list(cv_splits(L, min(CV_FOLDS, len(rows))))
    k_errors, long_errors = replicate_fold_errors(names, L, x, Y, k_folds)
    splits = held_out_splits(L, x)
    errors = replicate_fold_errors(names, L, x, Y, splits)[0] if splits else k_errors
    if np.isinf(errors).any():  # as select_model: the k folds where a model has no held-out score
        errors = k_errors
    picked = choose_model(errors, long_errors)
    models: list = [None] * resamples
    for m, name in enumerate(names):
        reps = np.flatnonzero(picked == m)
        if len(reps):
            for b, model in zip(reps, refit_all(name, L, x, Y[reps])):
                models[b] = model
    return models, [names[m] for m in picked]


class Pricer:
    """Weighted mean TTFT of fixed plans (lists of chunk sizes) of a workload on any model: the chunks of every plan
    laid end to end once, then one latency evaluation a model."""

    def __init__(self, plans: list[list[list[int]]], weights, pp_size: int):
        """plans[k][i]: the chunks of plan set k for the workload's prompt i."""
        starts, sizes, seg = [], [], []
        for group in plans:
            for chunks in group:
                seg.append(len(sizes))
                sizes += chunks
                starts += list(np.cumsum([0] + chunks[:-1]))
        self.L, self.x, self.seg = np.array(starts, float), np.array(sizes, float), np.array(seg)
        self.shape = (len(plans), len(plans[0]))
        self.weights, self.pp = np.asarray(weights, float), pp_size

    def mean_ttft(self, model: LatencyModel) -> np.ndarray:
        """(plan sets,) weighted mean TTFT."""
        t = model.chunk_latency_ms(self.L, self.x)
        ttft = np.add.reduceat(t, self.seg) + (self.pp - 1) * np.maximum.reduceat(t, self.seg)
        return ttft.reshape(self.shape) @ self.weights


@dataclass(frozen=True, slots=True)
class Pricing:
    """What gain_interval prices plans on: the workload on `pp_size` stages, against the best fixed chunk of `sizes`."""

    workload: Workload
    pp_size: int
    sizes: Sequence[int]
    """The prompt lengths with their weights, the stages, and the fixed chunk sizes (Domain.sizes)."""


def gain_interval(
    models: list,
    planning: Callable[[LatencyModel], LatencyModel],
    plans: list[list[int]] | dict[str, list[list[int]]],
    pricing: Pricing,
    min_gain: float,
    chosen: list[str] | None = None,
) -> dict:
    """The gain of `plans` (the policy's, one a workload prompt; or {model: the plans of that model's point fit}, each
    replicate pricing its chosen model's, `chosen`) over `pricing`'s best fixed chunk, on each resampled model's planning
    model (`planning`): its LOWER_QUANTILE quantile (the status's lower bound), median and 1 - LOWER_QUANTILE quantile,
    the share at `min_gain` or more, and (`chosen`, rechosen_refits) each model's share of the replicates."""
    names, sets = (list(plans), list(plans.values())) if isinstance(plans, dict) else ([None], [plans])
    fixed = [[fixed_chunks(int(s), int(n)) for n in pricing.workload.prompt_lens] for s in pricing.sizes]
    pricer = Pricer(sets + fixed, list(pricing.workload.weights), pricing.pp_size)
    gains = np.full(len(models), -1.0)  # a replicate that could not be fitted: the least gain there is
    for b, m in enumerate(models):
        if m is not None:
            mean = pricer.mean_ttft(planning(m))
            k = names.index(chosen[b]) if names[0] is not None else 0
            gains[b] = max(-1.0, 1.0 - mean[k] / mean[len(sets) :].min())
    failed = int(sum(m is None for m in models))
    return {
        "lower": float(np.quantile(gains, LOWER_QUANTILE, method="lower")),
        "median": float(np.quantile(gains, 0.5, method="lower")),
        "upper": float(np.quantile(gains, 1.0 - LOWER_QUANTILE, method="higher")),
        "quantile": LOWER_QUANTILE,
        "share_above_threshold": float(np.mean(gains >= min_gain)),
        "resamples": len(models),
        "failed": failed,
        "seed": SEED,
        **({} if chosen is None else {"models": model_shares(chosen)}),
        "method": (
            f"{len(models)} refits on the samples resampled by probe (a probe's shared slowness drawn whole) and "
            f"cell, seed {SEED}{'' if chosen is None else ', each choosing its model again'}; each prices the policy's plans of the workload against its best fixed chunk; "
            f"{failed} could not be fitted (counted as -1)"
        ),
    }


MIN_PLAN_SHARE = 0.05
"""The model other than the policy's that most resampled fits choose, where at least this share of them do, has its
own prompt-aware rule built, whose plans its replicates price; the replicates of any other model price the policy's
plans (a rule build costs 0.3-0.7 s on 2 cores, about what the rest of the fit costs; a model's own rule gains
more on its own surface than another's, so this errs towards "not sure")."""


def plans_by_model(plans: list[list[int]], name: str, chosen: list[str], own: Callable[[str], list]) -> dict:
    """{model: the plans its replicates price}: `plans` (the policy's, of model `name`) for its own and for any
    model but the most chosen other one (MIN_PLAN_SHARE of the replicates at least), whose plans are `own(model)`:
    the plans of the rule that model's point fit gives."""
    out = {name: plans}
    others = sorted(set(chosen) - {name}, key=lambda n: -chosen.count(n))
    for k, other in enumerate(others):
        out[other] = own(other) if k == 0 and chosen.count(other) >= MIN_PLAN_SHARE * len(chosen) else plans
    return out


def model_shares(chosen: list[str]) -> dict[str, float]:
    """{model: share of the replicates that chose it}, in MODEL_NAMES order."""
    return {n: chosen.count(n) / len(chosen) for n in MODEL_NAMES if n in chosen}

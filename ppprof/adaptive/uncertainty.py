"""How stable the policy's fit makes its tables: a residual bootstrap of the model the policy's fit picks (refit
REPLICATES times), the spread of the chunk-size table per entry in alignment units and of the predicted TTFT (half of
the adaptive design's stopping rule, ppprof.adaptive.stop; the status is the other), and the stopping reasons. Pure
numpy / scikit-learn; no torch.

Every model is the prefix form t(L, x) = z(L, x) . theta with the terms it lacks at 0 (ppprof.policy.rule):
model_terms gives its coefficients, regressors its z, on every row (a quadratic predicts prefixed rows too, though it
is fitted to the prefix-free ones only).
Residual bootstrap: the rows the fit kept are refitted with y* = y_hat (1 + r*), where r* are drawn with replacement
from the fit's relative residuals (centred, scaled by sqrt(n / (n - p)) for the p coefficients fitted). It keeps the
design as it was run (a row bootstrap of a small design would often drop a whole design point and leave the model
unidentifiable), and relative residuals match timing noise, which grows with the latency.
Table stability: entry i of the point table holds chunk_size s_i on [start_i, start_{i+1}); a replicate's size is
non-increasing in prefix_len there, so its largest deviation on the entry is at one of the two ends. The entry is
stable when at least CONFIDENCE of the replicates stay within one alignment unit on the whole entry.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ppprof.config import ChunkSettings
from ppprof.fit.forms import Unfittable
from ppprof.fit.regress import Fit
from ppprof.fit.replicates import FORM_TERMS, as_fitted, model_terms, refit_all, regressors  # noqa: F401 (here before)
from ppprof.policy.planners import chunk_latencies_ms, ttft_ms
from ppprof.policy.rule import LatencyModel, build_table
from ppprof.policy.tables import table_chunk_size, table_plan

REPLICATES = 200
CONFIDENCE = 0.95
TABLE_TOLERANCE_UNITS = 1
"""A table entry is stable when it stays within this many alignment units."""
TTFT_TOLERANCE = 0.02
"""Predicted TTFT is stable when the half-width of its CONFIDENCE interval is at most this fraction of it."""
BOOTSTRAP_SEED = 0
FULL_FORM = "pairs"
"""The richest candidate model: every model is its form with the terms it lacks at 0 (FORM_TERMS)."""
STABLE = "stable"
MAX_REQUESTS = "max-requests"
MAX_SECONDS = "max-seconds"
STOPPING_REASONS = {
    STABLE: (
        "after 3 probes at least, the status sure (its gain's 10% quantile over resampled fits at --min-gain or "
        "more, or at most 10% of them there) and, for a dynamic status, every table entry stable to one alignment "
        "unit and predicted TTFT to 2%, at 95% confidence; and the model choice settled (80% of the resampled fits "
        "choose the fit's model, or the prefix terms g and h are identified to 2% of a chunk's latency at the "
        "longest prefix)"
    ),
    MAX_REQUESTS: "the request budget is spent (--max-requests; default: the grid design's number of requests)",
    MAX_SECONDS: "the --max-seconds budget is spent",
}


def ttft_prompt_lens(settings: ChunkSettings) -> tuple[int, ...]:
    """The prompts whose predicted TTFT must be stable: 16 x B and the whole context (bench's default lengths)."""
    return tuple(sorted({min(16 * settings.base_chunk_size, settings.context_len), settings.context_len}))


def plan_ttft_ms(
    model: LatencyModel, starts: list[int], sizes: list[int], prompt_len: int, pp_size: int
) -> tuple[float, list[int]]:
    """Predicted TTFT of the greedy plan of `prompt_len` tokens, and the plan."""
    chunks = table_plan(starts, sizes, prompt_len)
    return ttft_ms(chunk_latencies_ms(model, chunks), pp_size), chunks


def relative_residuals(model: LatencyModel, L, x, y, num_terms: int) -> np.ndarray:
    """y / y_hat - 1, centred and scaled by sqrt(n / (n - p)) (the fit's residuals understate the noise)."""
    r = np.asarray(y, dtype=float) / model.chunk_latency_ms(L, x) - 1.0
    r = r - r.mean()
    n = len(r)
    return r * math.sqrt(n / (n - num_terms)) if n > num_terms else r


def plan_gradient(name: str, chunks: list[int], latencies_ms, pp_size: int, factor=1.0) -> np.ndarray:
    """d(TTFT of the plan `chunks`)/d(theta) of model `name`, the plan and its slowest chunk (by `latencies_ms`)
    held: the chunks' regressors summed, the slowest's P - 1 times more; `factor` multiplies each column (a
    calibration's linear scale on c and b)."""
    pos = np.concatenate([[0], np.cumsum(chunks)[:-1]])
    Z = regressors(name, pos, chunks) * factor
    return Z.sum(axis=0) + (pp_size - 1) * Z[int(np.argmax(latencies_ms))]


@dataclass(slots=True)
class Uncertainty:
    """The point fit, its table, and how far the bootstrap replicates move them."""

    model: LatencyModel
    fit_rows: np.ndarray  # (n,) bool: the rows the point fit kept
    target_ms: float
    starts: list[int]
    sizes: list[int]
    alignment: int
    within_one_unit: list[float]  # per table entry: fraction of replicates within one unit on the whole entry
    deviation_units_p95: list[float]  # per table entry: 95th percentile of the replicates' largest deviation
    prompt_lens: tuple[int, ...]
    ttft_ms: list[float]
    ttft_half_width: list[float]  # per prompt: half the 95% interval, as a fraction of ttft_ms
    coefficients: dict[str, dict]
    replicates: int
    failed_replicates: int
    residual_rel_std: float
    full: LatencyModel | None = None
    """The richest candidate fitted to the same rows (FULL_FORM, else the prefix model; design_fit sets it): the form
    whose terms the design must identify to tell the models apart; None where none fitted."""
    full_rel_std: float = math.nan
    """The relative residual std of `full` on the rows it was fitted to."""

    @property
    def table_stable(self) -> bool:
        return min(self.within_one_unit) >= CONFIDENCE

    @property
    def ttft_stable(self) -> bool:
        return max(self.ttft_half_width) <= TTFT_TOLERANCE

    @property
    def stable(self) -> bool:
        return self.failed_replicates <= (1 - CONFIDENCE) * self.replicates and self.table_stable and self.ttft_stable

    def to_dict(self) -> dict:
        """What run.json and policy.json record (the `uncertainty` of their `design`)."""
        return {
            "model": self.model.name,
            "method": (
                f"residual bootstrap, {self.replicates} refits ({self.failed_replicates} failed); "
                f"{CONFIDENCE:.0%} confidence"
            ),
            "residual_rel_std": self.residual_rel_std,
            "coefficients": self.coefficients,
            "table": {
                "alignment": self.alignment,
                "prefix_len": self.starts,
                "chunk_size": self.sizes,
                "within_one_unit": self.within_one_unit,
                "deviation_units_p95": self.deviation_units_p95,
                "stable": self.table_stable,
            },
            "ttft": {
                "prompt_len": list(self.prompt_lens),
                "ttft_ms": self.ttft_ms,
                "half_width": self.ttft_half_width,
                "tolerance": TTFT_TOLERANCE,
                "stable": self.ttft_stable,
            },
            "stable": self.stable,
        }


def bootstrap(
    fit: Fit,
    rows: tuple,
    settings: ChunkSettings,
    pp_size: int,
    *,
    full: Fit | None = None,
    replicates: int = REPLICATES,
    seed: int = BOOTSTRAP_SEED,
) -> Uncertainty:
    """Bootstrap `fit`, a model fitted with the policy's trimming to `rows`, (L, x, y): prefix lengths, chunk sizes
    and latencies (ppprof.fit.regress's fit_candidates); `full`: the richest candidate fitted to them
    (Uncertainty.full; `fit` itself where None and it has a prefix term). Raises Unfittable where its rule has no
    positive target latency."""
    L, x, y = (np.asarray(v) for v in rows)
    model, fit_rows = fit.model, fit.fit_rows
    terms = model_terms(model.name)
    target = model.target_ms(settings.base_chunk_size)
    if not target > 0:
        raise Unfittable(f"target latency {target:.4g} ms is not positive")
    starts, sizes = build_table(model, settings, target)
    Lk, xk, yk = L[fit_rows], x[fit_rows], y[fit_rows]
    num_terms = sum(getattr(model, t) != 0.0 for t in terms)
    r = relative_residuals(model, Lk, xk, yk, num_terms)
    rng = np.random.default_rng(seed)
    Y = model.chunk_latency_ms(Lk, xk)[None, :] * (1.0 + r[rng.integers(len(r), size=(replicates, len(r)))])
    models = refit_all(model.name, Lk, xk, Y)
    prompts = ttft_prompt_lens(settings)
    point_ttft = [plan_ttft_ms(model, starts, sizes, n, pp_size)[0] for n in prompts]
    dev, ttfts = replicate_spread(models, starts, sizes, settings, prompts, pp_size)
    return Uncertainty(
        model=model,
        fit_rows=fit_rows,
        target_ms=target,
        starts=starts,
        sizes=sizes,
        alignment=settings.alignment,
        within_one_unit=[float(np.mean(dev[:, i] <= TABLE_TOLERANCE_UNITS)) for i in range(len(starts))],
        deviation_units_p95=[float(np.percentile(dev[:, i], 95, method="higher")) for i in range(len(starts))],
        prompt_lens=prompts,
        ttft_ms=[float(v) for v in point_ttft],
        ttft_half_width=ttft_half_widths(ttfts, point_ttft),
        coefficients=coefficient_intervals(model, models, terms),
        replicates=replicates,
        failed_replicates=int((~np.isfinite(dev[:, 0])).sum()),
        residual_rel_std=float(r.std()),
        **full_form(full or (fit if model.name != "quadratic" else None), L, x, y),
    )


def full_form(fit: Fit | None, L, x, y) -> dict:
    """Uncertainty's `full` and `full_rel_std` of the richest candidate's fit (none: {})."""
    if fit is None:
        return {}
    rows = fit.fit_rows
    r = np.asarray(y)[rows] / fit.model.chunk_latency_ms(np.asarray(L)[rows], np.asarray(x)[rows]) - 1.0
    terms = sum(getattr(fit.model, t) != 0.0 for t in model_terms(fit.model.name))
    return {"full": fit.model, "full_rel_std": float(np.sqrt(np.sum(r**2) / max(len(r) - terms, 1)))}


def replicate_spread(
    models: list[LatencyModel | None],
    starts: list[int],
    sizes: list[int],
    settings: ChunkSettings,
    prompts: tuple[int, ...],
    pp_size: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(deviation, ttft) of each replicate: its largest deviation from the point table on each entry, in alignment
    units, (replicates, entries), inf where it failed or has no positive target; its predicted TTFT of each prompt,
    (replicates, prompts), nan there."""
    ends = starts[1:] + [starts[-1] + 1]
    dev = np.full((len(models), len(starts)), np.inf)
    ttfts = np.full((len(models), len(prompts)), np.nan)
    for b, m in enumerate(models):
        t = None if m is None else m.target_ms(settings.base_chunk_size)
        if m is None or not t > 0:
            continue
        bs, bz = build_table(m, settings, t)
        for i, (lo, hi, size) in enumerate(zip(starts, ends, sizes)):
            ends_sizes = (table_chunk_size(bs, bz, lo), table_chunk_size(bs, bz, hi - 1))
            dev[b, i] = max(abs(s - size) for s in ends_sizes) / settings.alignment
        ttfts[b] = [plan_ttft_ms(m, bs, bz, n, pp_size)[0] for n in prompts]
    return dev, ttfts


def ttft_half_widths(ttfts: np.ndarray, point_ttft: list[float]) -> list[float]:
    """Half the CONFIDENCE interval of each prompt's TTFT over the replicates that gave one, as a fraction of the
    point fit's; inf for every prompt when none did."""
    good = ttfts[np.isfinite(ttfts[:, 0])]
    if not len(good):
        return [math.inf] * len(point_ttft)
    lo, hi = np.percentile(good, [100 * (1 - CONFIDENCE) / 2, 100 * (1 + CONFIDENCE) / 2], axis=0)
    return [float((h - l) / 2 / p) for l, h, p in zip(lo, hi, point_ttft)]


def coefficient_intervals(model: LatencyModel, models: list[LatencyModel | None], terms: tuple[str, ...]) -> dict:
    """Each coefficient's point value, and its std and 95% interval over the replicates that fitted."""
    ok = np.array([m is not None for m in models])
    coefs = {}
    for term in terms:
        values = np.array([getattr(m, term) for m, k in zip(models, ok) if k])
        point = getattr(model, term)
        q = np.percentile(values, [2.5, 97.5]) if len(values) else (math.nan, math.nan)
        coefs[term] = {
            "value": point,
            "std": float(values.std()) if len(values) else math.nan,
            "interval_95": [float(q[0]), float(q[1])],
        }
    return coefs


def table_differences(a: dict, b: dict, alignment: int) -> tuple[int, int]:
    """(entries that differ by more than one alignment unit, entries) between two breakpoint tables
    {"prefix_len": starts, "chunk_size": sizes}, an entry being a stretch of prefix_len on which neither table
    changes (the union of both tables' breakpoints)."""
    starts = sorted(set(a["prefix_len"]) | set(b["prefix_len"]))

    def size(t: dict, L: int) -> int:
        return table_chunk_size(t["prefix_len"], t["chunk_size"], L)

    diff = sum(abs(size(a, L) - size(b, L)) > TABLE_TOLERANCE_UNITS * alignment for L in starts)
    return diff, len(starts)

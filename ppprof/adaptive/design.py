"""The adaptive probe design: a small D-optimal initial design for the prefix model t(L, x) = c + g L + b x +
a (2 L x + x^2) on a candidate grid of (prefix_len, chunk_size), the identifiability check, and each next batch, for
the model the policy's fit picks (ppprof.adaptive.uncertainty): the candidates that most reduce the uncertainty of the
status's gain, the chunk-size table and the predicted TTFT per second they cost. Pure numpy; no torch.

1. Initial design (before anything is timed, so before any model is picked: the prefix model, whose four terms every
   model shares or extends): INITIAL_POINTS distinct candidates maximizing log det(Z^T Z), Z its regressors (columns
   scaled to the grid's largest value) each divided by sqrt(prior cost): the D-optimal design for a fixed probing
   time (a point that costs k times more must carry k times the information). Greedy, then Fedorov exchange;
   at least MIN_PREFIX_LEVELS prefix lengths and two chunk sizes (what the fit needs). Each point INITIAL_REPEATS
   times, so that the first fit sees the noise.
2. Next batch (after a fit, its bootstrap, ppprof.adaptive.uncertainty, and the status the fit would write,
   ppprof.adaptive.status): for each quantity q the stop waits on (the status's gain over the best fixed chunk while
   the status is not sure, in units of its distance from --min-gain; a table entry's chunk size at both ends of the
   entry, in alignment units; predicted TTFT, in units of 2% of it), its gradient in the coefficients, and
   Var(q) = sigma^2 g^T M^-1 g with M = sum w z z^T, w = 1 / y_hat^2 (timing noise is relative). Adding a request
   at z lowers sum Var(q) / tol_q^2 by w (g^T M^-1 z)^2 / (1 + w z^T M^-1 z) (Sherman-Morrison); candidates are
   taken greedily by that gain per predicted second, until every such variance has shrunk by the factor the
   resampled spread asks for (NEED_MARGIN of it) and the batch costs MIN_BATCH_GROWTH x the probing time so far,
   or it costs BATCH_GROWTH x that time. M and every gradient are the richest model's (FULL_FORM: c, g, b, a, h),
   whichever model the fit chose, so every candidate informs it (a quadratic's fit would weigh its prefix-free
   rows only and leave the prefix terms unprobed); until the terms that tell the models apart (g, h) are
   identified (term_errors), they are quantities too, each to TERM_TOLERANCE of a chunk's latency at the longest
   candidate prefix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ppprof.adaptive.status import StatusCheck, gain_need
from ppprof.adaptive.uncertainty import (
    CONFIDENCE,
    FORM_TERMS,
    FULL_FORM,
    TTFT_TOLERANCE,
    Uncertainty,
    plan_gradient,
    regressors,
)
from ppprof.config import ChunkSettings
from ppprof.policy.planners import chunk_latencies_ms
from ppprof.policy.rule import LatencyModel
from ppprof.policy.tables import table_plan

INITIAL_MODEL = "prefix"
"""The model the initial design determines."""
INITIAL_POINTS = 6
INITIAL_REPEATS = 2
INITIAL_REQUESTS = INITIAL_POINTS * INITIAL_REPEATS
MIN_PREFIX_LEVELS = 3
"""Distinct prefix lengths (0 counts) the fit needs (ppprof.fit.forms.MIN_PREFIX_PREFIXES)."""
MAX_CONDITION = 1e6
"""Largest condition number of the scaled regressors an identifiable design may have."""
PRIOR_ATTENTION_SPAN = 2
"""Prior cost of a request before anything is measured, in tokens of forward work: B/4 fixed, plus x (1 + (L + x/2)
/ (PRIOR_ATTENTION_SPAN B)): attention over 2B cached tokens taken to cost as much as the rest of the forward, which
overstates long prefixes on most models and keeps the initial design cheap there."""
BATCH_GROWTH = 0.5
"""Each next batch is predicted to cost this fraction of the probing time so far (few fits, little overshoot)."""
MIN_BATCH = 4
MIN_BATCH_GROWTH = 0.25
"""Each next batch is predicted to cost at least this fraction of the probing time so far (or of `budget_s`, when
less): every design step refits and resamples the samples (about a second on 2 CPU cores), so steps of a few
requests would cost more in fits than in probes; with a floor on the growth, the steps are logarithmic in the time."""
NEED_MARGIN = 0.8
"""A batch aims at this fraction of the variance the bootstrap says would just be stable."""
MAX_REPEATS_PER_BATCH = 8
"""A candidate appears at most this often in one batch: the greedy gain would otherwise pile a batch onto one point,
and a design that leans on one point is at the mercy of the model's misfit there."""
MIN_BATCH_SECONDS = 0.05
MODEL_TERMS_APART = ("g", "h")
"""The terms that tell the candidate models apart: the prefix term g (the quadratic has none) and the pairs model's
prefix-by-chunk term h (the prefix model has none)."""
TERM_TOLERANCE = TTFT_TOLERANCE
"""Such a term is identified when its standard error moves the latency of a chunk of B at the longest candidate
prefix by at most this fraction: then the models it tells apart differ by less there than a plan's TTFT may."""


def prior_cost(prefix_len, chunk_size, base_chunk_size: int) -> np.ndarray:
    L = np.asarray(prefix_len, dtype=float)
    x = np.asarray(chunk_size, dtype=float)
    return base_chunk_size / 4 + x * (1.0 + (L + x / 2) / (PRIOR_ATTENTION_SPAN * base_chunk_size))


def log_det(Z: np.ndarray) -> float:
    sign, value = np.linalg.slogdet(Z.T @ Z)
    return float(value) if sign > 0 else -math.inf


def feasible(prefix_len: np.ndarray, chunk_size: np.ndarray, picks: list[int]) -> bool:
    return len(set(prefix_len[picks].tolist())) >= MIN_PREFIX_LEVELS and len(set(chunk_size[picks].tolist())) >= 2


def d_optimal(prefix_len, chunk_size, num_points: int, cost=None) -> list[int]:
    """Indices of `num_points` distinct candidates maximizing log det(Z^T Z) (Z: regressors scaled, / sqrt(cost)),
    with at least MIN_PREFIX_LEVELS prefix lengths and two chunk sizes. Greedy (a small ridge until the design has
    rank 4), then exchanges while one improves the determinant."""
    L, x = np.asarray(prefix_len), np.asarray(chunk_size)
    Z = regressors(INITIAL_MODEL, L, x)
    Z = Z / np.abs(Z).max(axis=0)
    if cost is not None:
        Z = Z / np.sqrt(np.asarray(cost, dtype=float))[:, None]
    m, p = Z.shape
    levels, sizes = len(np.unique(L)), len(np.unique(x))
    if levels < MIN_PREFIX_LEVELS or sizes < 2:
        raise ValueError(
            f"the candidate grid has {levels} prefix lengths and {sizes} chunk sizes: the prefix model "
            f"needs >= {MIN_PREFIX_LEVELS} and >= 2"
        )
    if num_points > m:
        raise ValueError(f"the candidate grid has {m} points, fewer than the {num_points} the design needs")
    ridge = 1e-6 * np.eye(p)
    picks: list[int] = []
    for k in range(num_points):
        picked_levels = set(L[picks].tolist())
        missing_levels = MIN_PREFIX_LEVELS - len(picked_levels)
        pool = [
            j for j in range(m) if j not in picks and (missing_levels < num_points - k or L[j] not in picked_levels)
        ]
        M = Z[picks].T @ Z[picks] + ridge
        picks.append(max(pool, key=lambda j: np.linalg.slogdet(M + np.outer(Z[j], Z[j]))[1]))
    best = log_det(Z[picks])
    improved = True
    while improved:
        improved = False
        for i in range(num_points):
            for j in range(m):
                if j in picks:
                    continue
                trial = picks[:i] + [j] + picks[i + 1 :]
                if not feasible(L, x, trial):
                    continue
                value = log_det(Z[trial])
                if value > best + 1e-9:
                    picks, best, improved = trial, value, True
    return picks


def check_identifiable(prefix_len, chunk_size) -> None:
    """ValueError (one line, naming what is missing) unless the design determines the four coefficients."""
    L, x = np.asarray(prefix_len), np.asarray(chunk_size)
    levels, sizes = len(np.unique(L)), len(np.unique(x))
    if levels < MIN_PREFIX_LEVELS or sizes < 2:
        raise ValueError(
            f"design has {levels} prefix lengths and {sizes} chunk sizes: the prefix model needs >= "
            f"{MIN_PREFIX_LEVELS} and >= 2"
        )
    Z = regressors(INITIAL_MODEL, L, x)
    Z = Z / np.maximum(np.abs(Z).max(axis=0), 1e-300)
    rank = int(np.linalg.matrix_rank(Z))
    cond = float(np.linalg.cond(Z)) if rank == Z.shape[1] else math.inf
    if rank < Z.shape[1] or cond > MAX_CONDITION:
        raise ValueError(
            f"design does not determine the prefix model's {Z.shape[1]} coefficients (rank {rank}, "
            f"condition number {cond:.3g}): add points at other prefix lengths and chunk sizes"
        )


def initial_design(
    prefix_len, chunk_size, base_chunk_size: int, num_points: int = INITIAL_POINTS, repeats: int = INITIAL_REPEATS
) -> list[tuple[int, int]]:
    """(prefix_len, chunk_size) of the initial design: D-optimal for a fixed probing time under the prior cost, each
    point `repeats` times; checked identifiable."""
    L, x = np.asarray(prefix_len), np.asarray(chunk_size)
    picks = d_optimal(L, x, num_points, prior_cost(L, x, base_chunk_size))
    points = [(int(L[j]), int(x[j])) for j in picks for _ in range(repeats)]
    check_identifiable([p for p, _ in points], [c for _, c in points])
    return points


def chunk_size_gradient(
    model: LatencyModel, settings: ChunkSettings, target_ms: float, prefix_len: int
) -> np.ndarray | None:
    """d(smoothed chunk size)/d(theta) (FORM_TERMS order: every model is the full form with the terms it lacks at
    0) at `prefix_len`, by implicit differentiation of the equal-latency equation F = t(L, x) - t(0, B) = z(L, x) .
    theta - z(0, B) . theta = 0 (the fixed cost c drops out); None where the rule has no root there."""
    x = model.equal_latency_chunk(prefix_len, target_ms)
    if not x:
        return None
    L, B = float(prefix_len), float(settings.base_chunk_size)
    dF_dx = model.b + 2 * model.a * (L + x) + 2 * model.h * L * x
    if dF_dx <= 0:
        return None
    dF = regressors(FULL_FORM, [L], [x])[0] - regressors(FULL_FORM, [0.0], [B])[0]
    return -settings.smooth_factor * dF / dF_dx


def ttft_gradient(
    model: LatencyModel, starts: list[int], sizes: list[int], prompt_len: int, pp_size: int
) -> np.ndarray:
    """d(predicted TTFT)/d(theta) (FORM_TERMS order) with the plan held: the chunks' regressors summed, the
    slowest's P - 1 times more."""
    chunks = table_plan(starts, sizes, prompt_len)
    return plan_gradient(FULL_FORM, chunks, chunk_latencies_ms(model, chunks), pp_size)


def information(model: LatencyModel, rows_L, rows_x) -> tuple[np.ndarray, np.ndarray]:
    """(M, scale): the full form's information matrix sum w z z^T over the rows (z: regressors scaled by `scale`,
    the largest of each column; w = 1 / y_hat^2, timing noise being relative), a tiny ridge added."""
    L, x = np.asarray(rows_L), np.asarray(rows_x)
    Z = regressors(FULL_FORM, L, x)
    scale = np.maximum(np.abs(Z).max(axis=0), 1e-300)
    Z = Z / scale
    M = (Z / model.chunk_latency_ms(L, x)[:, None] ** 2).T @ Z
    return M + 1e-12 * np.trace(M) * np.eye(len(scale)), scale


def term_tolerances(model: LatencyModel, settings: ChunkSettings, longest_prefix: int) -> dict[str, float]:
    """{term: the standard error at which it counts as identified} for MODEL_TERMS_APART: TERM_TOLERANCE of a
    chunk of B's latency at the longest candidate prefix, over what the term multiplies there (L; L B^2)."""
    L, B = float(max(longest_prefix, 1)), float(settings.base_chunk_size)
    t = float(model.chunk_latency_ms(L, B))
    return {"g": TERM_TOLERANCE * t / L, "h": TERM_TOLERANCE * t / (L * B * B)}


def term_errors(u: Uncertainty, rows_L, rows_x, tolerances: dict[str, float]) -> dict[str, float]:
    """{term: its standard error over its tolerance} for MODEL_TERMS_APART, under the full form fitted to the
    rows (the linearized sigma^2 (M^-1)_kk, sigma the full form's relative residual std); inf where no full form
    was fitted."""
    if u.full is None or not np.isfinite(u.full_rel_std):
        return {t: np.inf for t in MODEL_TERMS_APART}
    M, scale = information(u.full, rows_L, rows_x)
    cov = np.linalg.inv(M)
    out = {}
    for t in MODEL_TERMS_APART:
        k = FORM_TERMS.index(t)
        out[t] = float(u.full_rel_std * np.sqrt(max(cov[k, k], 0.0)) / scale[k] / tolerances[t])
    return out


def unstable_gradients(
    u: Uncertainty,
    settings: ChunkSettings,
    pp_size: int,
    check: StatusCheck | None = None,
    term_error: dict[str, float] | None = None,
    tolerances: dict[str, float] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Gradients (FORM_TERMS order) of the quantities the stopping rule waits on (the status's gain while it is not
    sure; the terms that tell the models apart while not identified, `term_error` > 1; the table entries and
    predicted TTFTs not yet stable), each divided by its tolerance (all quantities when none is waited on), and for
    each the factor by which its variance must shrink (from the resampled spread, with a margin: the gain's
    standard deviation must come down to its distance from --min-gain over Z_LOWER, a term's standard error to its
    tolerance, a table entry's 95th-percentile deviation to one unit, a TTFT's half-width to 2%)."""
    grads, need = [], []
    if check is not None and (want := gain_need(check, NEED_MARGIN)) is not None:
        grads.append(check.gradient / check.tolerance())
        need.append(want)
    for t, ratio in (term_error or {}).items():
        if ratio > 1.0 and np.isfinite(ratio):
            grads.append(np.eye(len(FORM_TERMS))[FORM_TERMS.index(t)] / tolerances[t])
            need.append(NEED_MARGIN / ratio**2)
    ends = u.starts[1:] + [u.starts[-1] + 1]
    for want_unstable in (True, False):
        for i, f in enumerate(u.within_one_unit):
            if want_unstable and f >= CONFIDENCE:
                continue
            for L in {u.starts[i], ends[i] - 1}:
                g = chunk_size_gradient(u.model, settings, u.target_ms, L) if L >= 1 else None
                if g is not None:
                    grads.append(g / u.alignment)
                    need.append(NEED_MARGIN / max(u.deviation_units_p95[i], 1.0) ** 2)
        for n, half, ttft in zip(u.prompt_lens, u.ttft_half_width, u.ttft_ms):
            if not want_unstable or half > TTFT_TOLERANCE:
                grads.append(ttft_gradient(u.model, u.starts, u.sizes, n, pp_size) / (TTFT_TOLERANCE * ttft))
                need.append(NEED_MARGIN * min(1.0, (TTFT_TOLERANCE / half) ** 2) if half > 0 else NEED_MARGIN)
        if grads:
            break
    return np.array(grads), np.array(need)


@dataclass(frozen=True, slots=True)
class DesignStep:
    """What a design step is judged on: the bootstrap of the model so far (`u`), the rule's settings and the stages,
    the rows fitted (prefix lengths and chunk sizes), the candidate grid (the same) with each candidate's predicted
    cost in seconds, and the status the fit would write on the rows (None: the table and predicted TTFT alone)."""

    u: Uncertainty
    settings: ChunkSettings
    pp_size: int
    rows: tuple[np.ndarray, np.ndarray]
    candidates: tuple[np.ndarray, np.ndarray]
    cost_s: np.ndarray
    check: StatusCheck | None = None


def next_batch(step: DesignStep, budget_s: float, max_count: int, min_s: float = 0.0) -> list[tuple[int, int]]:
    """Greedy batch of candidates (repeats allowed) by uncertainty reduction per second (module docstring, step 2),
    until the linearized variances have shrunk as much as the bootstrap says they must (at least MIN_BATCH
    requests and `min_s` seconds), or the batch is predicted to cost `budget_s`, or holds `max_count`. The
    information is the full form's, whichever model the fit chose: every candidate, prefixed or not, informs it."""
    u, settings, pp_size, check, cost_s = step.u, step.settings, step.pp_size, step.check, step.cost_s
    (cand_L, cand_x), (rows_L, rows_x) = step.candidates, step.rows
    cand_L, cand_x = np.asarray(cand_L), np.asarray(cand_x)
    rows_L, rows_x = np.asarray(rows_L), np.asarray(rows_x)
    M, scale = information(u.model, rows_L, rows_x)
    Zc = regressors(FULL_FORM, cand_L, cand_x) / scale
    w_cand = 1.0 / u.model.chunk_latency_ms(cand_L, cand_x) ** 2
    tolerances = term_tolerances(u.model, settings, int(cand_L.max()))
    G, need = unstable_gradients(u, settings, pp_size, check, term_errors(u, rows_L, rows_x, tolerances), tolerances)
    G = G / scale  # d q / d(theta * scale)

    def variances(Minv: np.ndarray) -> np.ndarray:
        return np.einsum("ij,jk,ik->i", G, Minv, G)

    start = variances(np.linalg.inv(M))
    picks: list[tuple[int, int]] = []
    taken = np.zeros(len(cand_L), dtype=int)
    spent = 0.0
    while len(picks) < max_count and spent < budget_s:
        Minv = np.linalg.inv(M)
        if len(picks) >= MIN_BATCH and spent >= min_s and np.all(variances(Minv) <= need * start):
            break
        A = G @ Minv @ Zc.T  # (quantities, candidates): g^T M^-1 z
        gain = w_cand * (A**2).sum(axis=0) / (1.0 + w_cand * np.einsum("ij,jk,ik->i", Zc, Minv, Zc))
        score = np.where(taken < MAX_REPEATS_PER_BATCH, gain / cost_s, -np.inf)
        j = int(np.argmax(score))
        taken[j] += 1
        picks.append((int(cand_L[j]), int(cand_x[j])))
        spent += float(cost_s[j])
        M += w_cand[j] * np.outer(Zc[j], Zc[j])
    return picks

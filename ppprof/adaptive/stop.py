"""The stopping rule of the adaptive design, and what rank 0 decides after each design step: stop, and why (the
decision sure, or a budget spent), or the next batch (ppprof.adaptive.design.next_batch). Pure numpy; no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ppprof.adaptive.design import (
    BATCH_GROWTH,
    MIN_BATCH_GROWTH,
    MIN_BATCH_SECONDS,
    DesignStep,
    next_batch,
    term_errors,
    term_tolerances,
)
from ppprof.adaptive.status import StatusCheck
from ppprof.adaptive.uncertainty import MAX_REQUESTS, MAX_SECONDS, STABLE, Uncertainty

MIN_STEPS = 3
"""The design stops after this many probes at the earliest: the status's resampling draws a probe's offset whole, and
two probes' offsets say little of a third's."""
CHOICE_CONFIDENCE = 0.8
"""The model choice is settled when at least this share of the resampled fits, each choosing its model again,
choose the fit's model; or when the terms that tell the models apart are identified (design.term_errors), so that
the models still in play differ by less than the tolerance where the policy's chunks shrink."""


@dataclass(slots=True)
class Decision:
    """What rank 0 decided after a design step: the next batch, or why it stopped; and the uncertainty so far."""

    points: list[tuple[int, int]] = field(default_factory=list)
    stop_reason: str | None = None
    uncertainty: dict | None = None


@dataclass(frozen=True, slots=True)
class Budget:
    """What the probing has spent (requests, seconds) and may spend: requests a probe, and the most requests and
    seconds in all (None: no bound)."""

    requests_run: int
    seconds_spent: float
    requests_per_probe: int
    max_requests: int | None = None
    max_seconds: float | None = None


def decide(step: DesignStep, budget: Budget, steps: int = MIN_STEPS) -> Decision:
    """Stop when the decision is sure (sure_enough) and the model choice settled (choice_settled), or a budget is
    spent; else the next batch, sized to BATCH_GROWTH x the time spent and to what the budgets leave, aimed at what
    the stop waits on. step.check: the status the fit would write on the samples so far (None: judge the table and
    predicted TTFT alone, as before a status is judged). `steps`: the probes run so far."""
    u, check, (rows_L, rows_x) = step.u, step.check, step.rows
    tolerances = term_tolerances(u.model, step.settings, int(np.max(step.candidates[0])))
    errors = term_errors(u, rows_L, rows_x, tolerances)
    settled = choice_settled(check, errors)
    record = (
        u.to_dict()
        | ({} if check is None else {"status": check.to_dict()})
        | {"model_choice": {"settled": settled, "term_error_over_tolerance": errors}}
    )
    if steps >= MIN_STEPS and sure_enough(u, check) and settled:
        return Decision(stop_reason=STABLE, uncertainty=record)
    per_probe, spent = budget.requests_per_probe, budget.seconds_spent
    left_requests = (
        per_probe if budget.max_requests is None else min(per_probe, budget.max_requests - budget.requests_run)
    )
    if left_requests <= 0:
        return Decision(stop_reason=MAX_REQUESTS, uncertainty=record)
    seconds = max(BATCH_GROWTH * spent, MIN_BATCH_SECONDS)
    if budget.max_seconds is not None:
        if spent >= budget.max_seconds:
            return Decision(stop_reason=MAX_SECONDS, uncertainty=record)
        seconds = min(seconds, budget.max_seconds - spent)
    least = min(MIN_BATCH_GROWTH * spent, seconds)
    return Decision(points=next_batch(step, seconds, left_requests, least), uncertainty=record)


def sure_enough(u: Uncertainty, check: StatusCheck | None) -> bool:
    """The stopping rule (after MIN_STEPS probes): the status sure under resampling (ppprof.adaptive.status) and,
    where it is dynamic, the tables and the plans' predicted TTFT stable under the bootstrap (Uncertainty.stable:
    every entry within one alignment unit, the TTFTs within 2%, at 95% confidence); a static policy has no table to
    settle. Without a status check: Uncertainty.stable alone."""
    if check is None:
        return u.stable
    return check.sure and (check.status == "static" or u.stable)


def choice_settled(check: StatusCheck | None, term_error: dict[str, float]) -> bool:
    """CHOICE_CONFIDENCE of the resampled fits choose the fit's model (the status's interval, where it has one), or
    every term that tells the models apart is identified (its standard error at most its tolerance)."""
    identified = all(r <= 1.0 for r in term_error.values())
    shares = {} if check is None else check.model_shares
    return identified or (bool(shares) and shares.get(check.model, 0.0) >= CHOICE_CONFIDENCE)

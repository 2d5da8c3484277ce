"""Rank 0's side of the adaptive design, and the design record of run.json. Each step reads the rows as the policy's
fit reads them (the rows rank 0 holds, checked by ppprof.fit.samples, so the same bottleneck stage; less the warm-up rows
ppprof.fit.build drops), bootstraps the model the policy's fit picks on them, and stops or chooses the next batch.
Pure (numpy, scikit-learn); no torch."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ppprof.adaptive.design import DesignStep
from ppprof.adaptive.probes import candidate_grid
from ppprof.adaptive.status import status_check
from ppprof.adaptive.stop import Budget, Decision, decide
from ppprof.adaptive.uncertainty import FULL_FORM, MAX_REQUESTS, MAX_SECONDS, STOPPING_REASONS, Uncertainty, bootstrap
from ppprof.config import ProfileConfig
from ppprof.fit.build import PROFILE_LATENCY_MODEL
from ppprof.fit.forms import Unfittable
from ppprof.fit.regress import fit_candidates
from ppprof.fit.samples import Samples
from ppprof.fit.selection import pick, without_warmup
from ppprof.io import finite
from ppprof.probe.synth import Probe

log = logging.getLogger("ppprof")
GRID_DONE = "grid"
STOPPING_REASONS_ALL = {**STOPPING_REASONS, GRID_DONE: "the grid design: every probe ran"}


@dataclass(slots=True)
class DesignState:
    """What the adaptive design hands from one step to the next, and to the design record."""

    stopping_reason: str | None = None
    """Why the probing stopped (a key of STOPPING_REASONS_ALL); None while it runs."""
    uncertainty: dict | None = None
    """The stopping step's Uncertainty.to_dict(); None where its samples determined no model."""
    history: list[dict] = field(default_factory=list)
    """One entry a design step: requests and seconds so far, the status and how sure, the table's and the TTFT's
    stability."""


@dataclass(slots=True)
class DesignFit:
    """The policy fit's view of the samples so far, and the bootstrap of the model it picks."""

    used: Samples
    """The rows the policy's fit reads: samples.csv less its warm-up rows (ppprof.fit.build.without_warmup)."""
    uncertainty: Uncertainty | None
    """The bootstrap of the model the policy's fit picks (ppprof.fit.selection.pick) on `used`; None where there is
    none."""
    error: str | None
    """Why there is no uncertainty: no model fits, or the picked one's rule has no positive target."""


def design_fit(cfg: ProfileConfig, pp_size: int, samples: Samples) -> DesignFit:
    """The rows, model choice and fit of the policy a profile's own fit would write from `samples` (fit_run: the
    warm-up rows dropped, PROFILE_LATENCY_MODEL, the held-out choice among the models whose form the cells bear out),
    and that model's bootstrap."""
    used, _ = without_warmup(samples)
    L, x, y = used.prefix_len, used.chunk_size, used.chunk_latency_ms
    fitted, failed = fit_candidates(L, x, y, PROFILE_LATENCY_MODEL)
    picked = pick(fitted, used) if fitted else None
    if picked is None:
        return DesignFit(used, None, "; ".join(failed.values()) or "no samples left after the warm-up rows")
    full = fitted.get(FULL_FORM) or fitted.get("prefix")  # the richest candidate: the terms the design identifies
    try:
        return DesignFit(used, bootstrap(fitted[picked[0]], (L, x, y), cfg.chunk_settings(), pp_size, full=full), None)
    except (Unfittable, ValueError) as e:
        return DesignFit(used, None, str(e))


@dataclass(frozen=True, slots=True)
class Seconds:
    """The time a design step is costed from: the last probe's wall time, and the probing's so far."""

    last_probe: float
    spent: float


def choose(
    cfg: ProfileConfig,
    pp_size: int,
    probes: list[Probe],
    samples: Samples,
    e2e_ms: list[list[float]],
    seconds: Seconds,
    pipeline_overhead: dict | None = None,
) -> Decision:
    """Rank 0, after every probe in `probes` ran (`samples`: their rows, held in memory; e2e_ms[probe][request]): fit,
    bootstrap, judge the status as the profile's fit would (with `pipeline_overhead`, measured before the probes),
    and stop or choose the next batch (costed from what the probes so far took)."""
    requests_run = len(samples)
    step = design_fit(cfg, pp_size, samples)
    u = step.uncertainty
    if u is None:  # e.g. noise so large that no term keeps a non-negative coefficient: measure the start again
        log.warning(
            "the samples so far do not determine the latency model (%s): the initial design runs again", step.error
        )
        if cfg.probes.max_seconds is not None and seconds.spent >= cfg.probes.max_seconds:
            return Decision(stop_reason=MAX_SECONDS)
        left = min(cfg.request_budget - requests_run, cfg.probes.requests_per_probe)
        if left <= 0:
            return Decision(stop_reason=MAX_REQUESTS)
        return Decision(points=[(r.prefix_len, r.chunk_size) for r in probes[0].requests][:left])
    cand_L, cand_x = (np.array(v) for v in candidate_grid(cfg))
    overhead_ms = max(0.0, (seconds.last_probe * 1e3 - float(np.sum(e2e_ms[-1]))) / len(probes[-1].requests))
    # samples.csv holds the requests of every probe that ran, in order (a resumed run's earlier ones too), and
    # e2e_ms theirs.
    e2e_per_stage_ms = float(np.median(np.concatenate(e2e_ms) / samples.chunk_latency_ms))
    cost_s = (e2e_per_stage_ms * u.model.chunk_latency_ms(cand_L, cand_x) + overhead_ms) / 1e3
    rows = (step.used.prefix_len, step.used.chunk_size)
    check = status_check(cfg, pp_size, samples, pipeline_overhead)
    design = DesignStep(u, cfg.chunk_settings(), pp_size, rows, (cand_L, cand_x), cost_s, check)
    budget = Budget(
        requests_run, seconds.spent, cfg.probes.requests_per_probe, cfg.request_budget, cfg.probes.max_seconds
    )
    return decide(design, budget, steps=len(probes))


def final_uncertainty(cfg: ProfileConfig, pp_size: int, samples: Samples) -> tuple[dict | None, str | None]:
    """(Uncertainty.to_dict(), None) of the whole run's samples, or (None, why not): what a run records where no
    design step bootstrapped its last rows (the grid design; an adaptive one stopped by a budget)."""
    step = design_fit(cfg, pp_size, samples)
    return (None, step.error) if step.uncertainty is None else (step.uncertainty.to_dict(), None)


def design_record(
    cfg: ProfileConfig,
    design: DesignState,
    probes: list[Probe],
    rows: Callable[[], Samples],
    pp_size: int,
    spent: tuple[float, int],
) -> dict:
    """run.json's `design` (policy.json copies it): what the probing of `probes` cost (`spent`: its wall seconds and
    forward tokens a stage), why it stopped, and the uncertainty of the table, the predicted TTFT and the
    coefficients of the policy fit's model on the whole run's samples (`rows`, held in memory; called only where no
    step judged the last ones: for the grid too, from the same bootstrap)."""
    probe_wall_s, forward_tokens = spent
    reason = design.stopping_reason or GRID_DONE
    u, error = design.uncertainty, None
    if u is None:
        try:
            u, error = final_uncertainty(cfg, pp_size, rows())
        except ValueError as e:  # the rows as the fit would refuse them; the fit names the row
            u, error = None, str(e)
    return finite(
        {
            "design": cfg.probes.design,
            "steps": 1 + max((p.design_step for p in probes), default=0),
            "requests": sum(len(p.requests) for p in probes),
            "forward_tokens": forward_tokens,
            "probe_wall_s": round(probe_wall_s, 3),
            "stopping_reason": reason,
            "stopping_rule": STOPPING_REASONS_ALL[reason],
            "max_requests": cfg.request_budget if cfg.probes.design == "adaptive" else None,
            "max_seconds": cfg.probes.max_seconds,
            "uncertainty": u,
            "uncertainty_error": error,
            "history": design.history,
        }
    )

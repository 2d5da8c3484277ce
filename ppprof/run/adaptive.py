"""The probe design's part of the profile job: the sequence of probes (the grid's, fixed; or the adaptive design's,
where after each probe rank 0 fits the samples so far and chooses the next probe or stops, and every rank gets
that decision), and the design record of run.json (requests, tokens, time, why it stopped, the final uncertainty)."""

from __future__ import annotations

import logging
import time
from typing import Iterator

import numpy as np

from ppprof.dist.agree import agreed
from ppprof.io import finite
from ppprof.fit.design import Decision, decide
from ppprof.fit.regress import Unfittable
from ppprof.fit.uncertainty import MAX_REQUESTS, MAX_SECONDS, STOPPING_REASONS, Uncertainty, bootstrap
from ppprof.config import ChunkSettings
from ppprof.probe.synth import Probe, candidate_grid, design_probe
from ppprof.run.rank import RankRun

log = logging.getLogger("ppprof")
GRID_DONE = "grid"
STOPPING_REASONS_ALL = {**STOPPING_REASONS, GRID_DONE: "the grid design: every probe ran"}


def chunk_settings(run: RankRun) -> ChunkSettings:
    """The rule's settings the policy will be fitted with (ppprof.fit.settings defaults on the run's config)."""
    return run.cfg.chunk_settings()


def timed_rows(probes: list[Probe], stage_ms: list, e2e_ms: list) -> tuple[np.ndarray, ...]:
    """(prefix_len, chunk_size, bottleneck-stage latency, end-to-end latency) of every timed request so far; the
    bottleneck stage is the one with the largest total, as ppprof.fit.samples reads samples.csv."""
    L = np.array([r.prefix_len for p in probes[:len(stage_ms)] for r in p.requests])
    x = np.array([r.chunk_size for p in probes[:len(stage_ms)] for r in p.requests])
    per_stage = np.array([[v for p in stage_ms for v in p[s]] for s in range(len(stage_ms[0]))])
    e2e = np.array([v for p in e2e_ms for v in p])
    return L, x, per_stage[int(np.argmax(per_stage.sum(axis=1)))], e2e


def fit_uncertainty(run: RankRun, L, x, y) -> tuple[Uncertainty | None, str | None]:
    """The bootstrap of the samples so far, or (None, why the prefix model or the rule's settings do not hold; a grid
    run records that instead, an adaptive one was checked before launch)."""
    try:
        return bootstrap(L, x, y, chunk_settings(run), run.info.world_size), None
    except (Unfittable, ValueError) as e:
        return None, str(e)


def choose(run: RankRun, probes: list[Probe], stage_ms: list, e2e_ms: list, last_probe_s: float) -> Decision:
    """Rank 0: fit, bootstrap, and stop or choose the next batch (costed from what the probes so far took)."""
    cfg = run.cfg
    L, x, y, e2e = timed_rows(probes, stage_ms, e2e_ms)
    u, why = fit_uncertainty(run, L, x, y)
    if u is None:  # e.g. noise so large that no term keeps a non-negative coefficient: measure the start again
        log.warning("the samples so far do not determine the prefix model (%s): the initial design runs again", why)
        seconds = time.perf_counter() - run.state["t_probes"]
        if cfg.max_seconds is not None and seconds >= cfg.max_seconds:
            return Decision(stop_reason=MAX_SECONDS)
        left = min(cfg.request_budget - len(L), cfg.requests_per_probe)
        if left <= 0:
            return Decision(stop_reason=MAX_REQUESTS)
        return Decision(points=[(r.prefix_len, r.chunk_size) for r in probes[0].requests][:left])
    cand_L, cand_x = (np.array(v) for v in candidate_grid(cfg))
    last = probes[len(stage_ms) - 1]
    overhead_ms = max(0.0, (last_probe_s * 1e3 - float(np.sum(e2e_ms[-1]))) / len(last.requests))
    e2e_per_stage_ms = float(np.median(e2e / y))
    cost_s = (e2e_per_stage_ms * u.model.chunk_latency_ms(cand_L, cand_x) + overhead_ms) / 1e3
    return decide(u, chunk_settings(run), run.info.world_size, L, x, cand_L, cand_x, cost_s=cost_s,
                  requests_run=len(L), seconds_spent=time.perf_counter() - run.state["t_probes"],
                  requests_per_probe=cfg.requests_per_probe, max_requests=cfg.request_budget,
                  max_seconds=cfg.max_seconds)


def probe_sequence(run: RankRun, stage_ms: list, e2e_ms: list, first: int = 0) -> Iterator[Probe]:
    """The probes to run, in order. Grid: run.state["probes"] from `first` (a resumed run's first probe not yet
    complete). Adaptive (never resumed): the initial design, then after each probe
    (once the caller has gathered its latencies into `stage_ms` and `e2e_ms`) the next one rank 0 chooses, appended
    to run.state["probes"], until it stops; every rank gets the same probe or the stop."""
    probes = run.state["probes"]
    if run.cfg.design != "adaptive":
        yield from probes[first:]
        run.state["stopping_reason"] = GRID_DONE
        return
    history = run.state.setdefault("design_history", [])
    i = 0
    while True:
        start = time.perf_counter()
        yield probes[i]
        i += 1
        if i < len(probes):
            continue
        decision = None
        with agreed(run.pipe, "choose the next probe"):
            if run.rank == 0:
                decision = choose(run, probes, stage_ms, e2e_ms, time.perf_counter() - start)
        decision = run.pipe.broadcast(decision)
        u = decision.uncertainty
        history.append({"design_step": probes[-1].design_step, "requests": sum(len(p.requests) for p in probes),
                        "seconds": round(time.perf_counter() - run.state["t_probes"], 3),
                        "table_within_one_unit": None if u is None else min(u["table"]["within_one_unit"]),
                        "ttft_half_width": None if u is None else u["ttft"]["half_width"]})
        if u is not None:
            log.info("design step %d: %d requests, table entries within one unit in >= %.0f%% of refits, predicted "
                     "TTFT +-%s; %s", probes[-1].design_step, history[-1]["requests"],
                     100 * history[-1]["table_within_one_unit"],
                     ", ".join(f"{h:.1%}" for h in u["ttft"]["half_width"]),
                     f"stop: {decision.stop_reason}" if decision.stop_reason else
                     f"next {len(decision.points)} requests")
        if decision.stop_reason:
            run.state["stopping_reason"], run.state["uncertainty"] = decision.stop_reason, u
            return
        first_rid = 1 + max(r.rid for p in probes for r in p.requests)
        probes.append(design_probe(len(probes), len(probes), decision.points, first_rid, run.cfg.seed))


def design_record(run: RankRun, probes: list[Probe], stage_ms: list, e2e_ms: list, forward_tokens: int) -> dict:
    """run.json's `design` (policy.json copies it): what the probing cost, why it stopped, and the final uncertainty
    of the table, the predicted TTFT and the coefficients (for the grid too, from the same bootstrap)."""
    reason = run.state.get("stopping_reason", GRID_DONE)
    u = run.state.get("uncertainty")
    error = None
    if u is None:
        fitted, error = fit_uncertainty(run, *timed_rows(probes, stage_ms, e2e_ms)[:3])
        u = None if fitted is None else fitted.to_dict()
    return finite({"design": run.cfg.design, "steps": 1 + max(p.design_step for p in probes),
            "requests": sum(len(p.requests) for p in probes), "forward_tokens": forward_tokens,
            "probe_wall_s": round(run.state["probe_wall_s"], 3), "stopping_reason": reason,
            "stopping_rule": STOPPING_REASONS_ALL[reason],
            "max_requests": run.cfg.request_budget if run.cfg.design == "adaptive" else None,
            "max_seconds": run.cfg.max_seconds, "uncertainty": u, "uncertainty_error": error,
            "history": run.state.get("design_history", [])})

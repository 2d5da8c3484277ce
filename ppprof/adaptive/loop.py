"""The probe design's part of the profile job, every rank's view: the sequence of probes (the grid's, fixed; or the
adaptive design's, where after each probe rank 0 chooses the next probe or stops from the rows it holds in memory,
and every rank gets that decision)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from typing import Protocol

from ppprof.adaptive.probes import design_probe
from ppprof.adaptive.step import GRID_DONE, DesignState, Seconds, choose
from ppprof.config import ProfileConfig
from ppprof.distributed.agree import agreed
from ppprof.distributed.pipe import Pipe
from ppprof.fit.samples import Samples
from ppprof.probe.synth import Probe

log = logging.getLogger("ppprof")


class ProbingState(Protocol):
    """What the sequence of probes reads of the profile's state (ppprof.run.profile_state.ProfileState) and extends."""

    probes: list[Probe]
    """Every probe of the run, in order: the adaptive design appends each one it chooses."""
    design: DesignState
    t_probes: float
    """When this run's probing began (time.perf_counter())."""
    first_probe: int
    """A resumed run's first probe not yet complete (0 otherwise)."""
    overhead: dict | None
    """Rank 0's pipeline overhead, measured before the probes, which the status checks plan with."""


def probe_sequence(
    pipe: Pipe, cfg: ProfileConfig, state: ProbingState, rows: Callable[[], Samples], e2e_ms: list
) -> Iterator[Probe]:
    """The probes to run, in order, from state.first_probe. Grid: state.probes. Adaptive: the initial design, then
    after each probe (once the caller has kept its rows, which `rows` gives rank 0 in memory, and appended its
    end-to-end latencies to `e2e_ms`) the next one rank 0 chooses, appended to state.probes, until it stops; every
    rank gets the same probe or the stop. A run resumed after its last whole probe (first_probe = len(probes); rank
    0's `e2e_ms` holds the probes that ran) chooses first; the probes before a resume count as their end-to-end
    latencies."""
    probes, design, first = state.probes, state.design, state.first_probe
    if cfg.probes.design != "adaptive":
        yield from probes[first:]
        design.stopping_reason = GRID_DONE
        return
    i = first
    spent_before = sum(map(sum, e2e_ms)) / 1e3 if first else 0.0
    while True:
        start = time.perf_counter()
        if i < len(probes):
            yield probes[i]
            i += 1
            if i < len(probes):
                continue
            last_s = time.perf_counter() - start
        else:  # resumed: no probe ran yet, so none tells the overhead between requests
            last_s = sum(e2e_ms[-1]) / 1e3 if e2e_ms else 0.0
        decision = None
        with agreed(pipe, "choose the next probe"):
            if pipe.global_rank == 0:  # under TP, stage 0's other ranks have pipe.rank 0 too
                seconds = Seconds(last_s, time.perf_counter() - state.t_probes + spent_before)
                decision = choose(cfg, pipe.pp_size, probes, rows(), e2e_ms, seconds, state.overhead)
        decision = pipe.broadcast(decision)
        record_step(design, probes, decision, time.perf_counter() - state.t_probes + spent_before)
        if decision.stop_reason:
            design.stopping_reason, design.uncertainty = decision.stop_reason, decision.uncertainty
            return
        first_rid = 1 + max(r.rid for p in probes for r in p.requests)
        probes.append(design_probe(len(probes), len(probes), decision.points, first_rid, cfg.probes.seed))


def record_step(design: DesignState, probes: list[Probe], decision, seconds: float) -> None:
    """The step's entry in the design's history, and its log line."""
    u = decision.uncertainty
    design.history.append(
        {
            "design_step": probes[-1].design_step,
            "requests": sum(len(p.requests) for p in probes),
            "seconds": round(seconds, 3),
            "table_within_one_unit": None if u is None else min(u["table"]["within_one_unit"]),
            "ttft_half_width": None if u is None else u["ttft"]["half_width"],
            "status": None if u is None else u.get("status"),
        }
    )
    if u is not None:
        log.info(
            "design step %d: %d requests, %s, table entries within one unit in >= %.0f%% of refits, predicted "
            "TTFT +-%s; %s",
            probes[-1].design_step,
            design.history[-1]["requests"],
            status_words(u.get("status")),
            100 * design.history[-1]["table_within_one_unit"],
            ", ".join(f"{h:.1%}" for h in u["ttft"]["half_width"]),
            f"stop: {decision.stop_reason}" if decision.stop_reason else f"next {len(decision.points)} requests",
        )


def status_words(status: dict | None) -> str:
    """A design step's status check in words: "static (not sure; gain 1.2%, 80% interval -0.3% to 2.2%; models
    prefix 60%, pairs 40%)" (the models the resampled fits chose, where they chose more than one)."""
    if status is None:
        return "no status judged"
    sure = "sure" if status["sure"] else "not sure"
    if status["gain_lower"] is None:
        return f"{status['status']} ({sure}: a check failed)"
    models = status.get("models") or {}
    chosen = f"; models {', '.join(f'{n} {v:.0%}' for n, v in models.items())}" if len(models) > 1 else ""
    return (
        f"{status['status']} ({sure}; gain {status['gain']:.1%}, 80% interval {status['gain_lower']:.1%} to "
        f"{status['gain_upper']:.1%}{chosen})"
    )

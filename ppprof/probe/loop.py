"""The probe loop of one rank: every request goes through every stage in lockstep, each stage timing its own compute.

Per request, on every rank: set up (admit, write the synthetic prefix, extend by the chunk), receive from the previous
stage, the primer (an untimed forward of the chunk's first token), forward (timed, device-synchronized; transfers
excluded), send on, and release in a finally path (KV slots, Mamba slot, request entry). Rank 0 also times the request
end to end, from its timed forward until the last stage reports it done.
After each request the ranks agree on whether any failed; after each probe, that every pool is full again.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ppprof.distributed.agree import RunError, stop_if_any_failed
from ppprof.distributed.pipe import FAILED, OK, Pipe
from ppprof.mem import Request, StageCache
from ppprof.mem.cache import describe_leaks
from ppprof.mem.req import NO_MAMBA_SLOT
from ppprof.model.stage import Stage
from ppprof.probe.request import set_up_request
from ppprof.probe.synth import Probe, ProbeRequest
from ppprof.probe.timer import Timer

log = logging.getLogger("ppprof.probe")

SKIP_MAMBA_RELEASE = "skip-mamba-release"
RAISE_IN_FORWARD = "raise-in-forward"
RAISE_ON_ONE_TP_RANK = "raise-on-one-tp-rank"
FAULTS = (SKIP_MAMBA_RELEASE, RAISE_IN_FORWARD, RAISE_ON_ONE_TP_RANK)
"""Deliberate faults for tests: a release that forgets the Mamba slot (the historical leak), a forward that raises on
the last stage at the third timed request, and one that raises there on the last TP rank of the first stage only
(its TP peers wait in an all-reduce)."""


@dataclass(slots=True)
class ProbeTimings:
    """What one rank measured in one probe: stage latency per request (and, on rank 0, end-to-end latency)."""

    probe: int
    stage_ms: list[float] = field(default_factory=list)
    e2e_ms: list[float] = field(default_factory=list)


def release_without_mamba(cache: StageCache, req: Request) -> None:
    """A deliberately broken release that forgets the Mamba slot (the historical leak): the leak check must catch it."""
    if req.req_pool_idx is not None:
        cache.req_pool.mamba_slot[req.req_pool_idx] = NO_MAMBA_SLOT
    cache.release(req)


class ProbeRunner:
    """Runs probe requests through this rank's stage in lockstep with the other ranks, timing the stage's forward."""

    def __init__(self, *, stage: Stage, cache: StageCache, pipe: Pipe, seed: int, fault: str | None = None) -> None:
        self.stage = stage
        self.cache = cache
        self.pipe = pipe
        self.seed = seed
        self.fault = fault
        self.device = cache.device
        self.vocab_size = stage.spec.vocab_size
        self.forward_tokens = 0
        self.tp_rank_ms: list[float] = []
        """This TP rank's own timed forwards (ms), before the slowest of the stage's TP ranks is taken."""
        self._timed_requests = 0
        self._release: Callable[[StageCache, Request], None] = (
            release_without_mamba if fault == SKIP_MAMBA_RELEASE else StageCache.release
        )

    def run_request(self, pr: ProbeRequest, timed: bool) -> tuple[float, float, str | None]:
        """One request through this rank's stage: (stage_ms, e2e_ms (rank 0, else nan), error or None)."""
        pipe = self.pipe
        start = time.perf_counter()
        req = Request(pr.rid)
        stage_ms = e2e_ms = math.nan
        error = None
        status, out, residual = OK, None, None
        try:
            setup_error = None
            try:
                gen = (
                    torch.Generator().manual_seed(self.seed * 1_000_003 + pr.rid * 31 + pipe.rank)
                    if pr.prefix_len
                    else None
                )  # only a prefix is filled with random values
                set_up_request(self.cache, req, pr, gen)
                if pipe.is_first:
                    x = torch.randint(
                        self.vocab_size, (pr.chunk_size,), generator=torch.Generator().manual_seed(self.seed + pr.rid)
                    ).to(self.device)
            except Exception as e:
                setup_error = f"setup of request {pr.rid} failed: {e}"
            # Every rank finishes its set-up before any rank starts the timed part, so that no later stage's set-up
            # (the prefix fill) runs beside an earlier stage's timed forward; a failed set-up stops every rank here.
            if pipe.any_true(setup_error is not None):
                return stage_ms, e2e_ms, setup_error
            if not pipe.is_first:
                status, x, residual = pipe.recv_activation()
            if status == OK:
                status, out, residual, stage_ms, e2e_start, error = self._forward(pr, req, x, residual, timed)
            if not pipe.is_last:
                pipe.send_activation(status, out, residual)
            elif not pipe.is_first:
                pipe.send_done(status)
            if pipe.is_first:
                done = pipe.recv_done() if not pipe.is_last else status
                if status == OK and done == OK:
                    e2e_ms = (time.perf_counter() - e2e_start) * 1e3
        finally:
            try:
                self._release(self.cache, req)
            except Exception as e:  # reported through the same agreement as a failed forward
                error = error or f"release of request {pr.rid} raised {type(e).__name__}: {e}"
        if timed:
            self._timed_requests += 1
        pipe.measured(time.perf_counter() - start)  # the deadlines of later waits follow it
        return stage_ms, e2e_ms, error

    def _forward(
        self, pr: ProbeRequest, req: Request, x: torch.Tensor, residual: torch.Tensor | None, timed: bool
    ) -> tuple[int, torch.Tensor | None, torch.Tensor | None, float, float, str | None]:
        """The primer, then the timed forward of the chunk: (status, out, residual, stage_ms, when the timer started,
        error or None).

        The primer is an untimed forward of the chunk's first token at its own position (prefix_len), which the timed
        forward then computes again. In lockstep this rank has just waited through the other stages' forwards, and a
        forward after a wait runs slower the longer the wait, whether the rank sleeps or spins (on CPU about 1 ms
        after 20 ms: what the forward touches has gone cold), while a running prompt's chunks follow each other on
        the bottleneck stage; timed cold, every request paid that millisecond and the fit's c carried it. The primer
        rewrites only the chunk's first K/V and moves the Mamba state by one token: values, not costs."""
        try:
            if timed and self.fault == RAISE_IN_FORWARD and self.pipe.is_last and self._timed_requests == 2:
                raise RuntimeError("injected fault (--inject-fault raise-in-forward)")
            if (
                timed
                and self.fault == RAISE_ON_ONE_TP_RANK
                and self.pipe.is_first
                and self._timed_requests == 2
                and self.pipe.tp is not None
                and self.pipe.tp.rank == self.pipe.tp_size - 1
            ):
                raise RuntimeError("injected fault (--inject-fault raise-on-one-tp-rank)")
            self.stage(self.cache, req, x[:1], None if residual is None else residual[:1], pr.prefix_len)
            self.pipe.tp_barrier()  # the TP ranks of the stage start the timed forward together
            with Timer(self.device) as t:
                out, residual = self.stage(self.cache, req, x, residual, pr.prefix_len)
        except Exception as e:
            error = (
                f"forward of request {pr.rid} (prefix {pr.prefix_len}, chunk {pr.chunk_size}) raised "
                f"{type(e).__name__}: {e}"
            )
            self.pipe.tp_failed(error)
            return FAILED, None, None, math.nan, math.nan, error
        self.forward_tokens += pr.chunk_size
        self.tp_rank_ms.append(t.elapsed_ms)
        return OK, out, residual, self.pipe.tp_slowest(t.elapsed_ms), t.start, None

    def check_leaks(self, when: str) -> None:
        """Every pool of every rank is back to full capacity, or every rank raises naming rank, pool and count."""
        everyone = self.pipe.all_gather_ranks(self.cache.leaks())
        if any(everyone):
            parts = [f"rank {r}: {describe_leaks(lk, sep=f'; rank {r}: ')}" for r, lk in enumerate(everyone) if lk]
            raise RunError(f"leak check failed {when}: " + "; ".join(parts))

    def warm_up(self, requests: list[ProbeRequest]) -> None:
        for pr in requests:
            _, _, error = self.run_request(pr, timed=False)
            stop_if_any_failed(self.pipe, error)
        self.check_leaks("after the warm-up")

    def run_probe(self, probe: Probe, on_request: Callable[[], None] | None = None) -> ProbeTimings:
        """All requests of `probe`; their Mamba slots are taken in one grouped window."""
        timings = ProbeTimings(probe.index)
        mamba = self.cache.mamba_alloc
        if mamba is not None:
            grouped = mamba.alloc_group_begin(len(probe.requests))
            if not grouped:
                log.debug(
                    "probe %d: %d Mamba slots free for %d requests; slots taken one by one",
                    probe.index,
                    mamba.available_size(),
                    len(probe.requests),
                )
        try:
            for pr in probe.requests:
                stage_ms, e2e_ms, error = self.run_request(pr, timed=True)
                stop_if_any_failed(self.pipe, error)
                timings.stage_ms.append(stage_ms)
                timings.e2e_ms.append(e2e_ms)
                if on_request is not None:
                    on_request()
        finally:
            if mamba is not None and mamba.group_open:
                mamba.alloc_group_end()
        self.check_leaks(f"after probe {probe.index}")
        return timings

"""One rank's part of a serving bench level through the ranks (`ppprof serve-bench` without --simulate). Rank 0 (the
first stage) runs the scheduler of ppprof.serving.scheduler on the wall clock, as ppprof.serving.simulate runs it on
model time: the micro-batch slots round robin, a slot's next batch built once its previous one has left the last
stage, arrivals from the closed loop, the Poisson times or a request trace's (whose prefills start past the prefix
its block cache holds: that prefix written into the request's KV slots and Mamba slot on every stage, as the probes
write theirs, so its chunks attend over it as a server's do). Each batch is one packed forward on every stage
(Stage.forward_packed), sent on without waiting; the last stage tells rank 0 when each batch left. A request holds its
KV slots, Mamba slot and request entry on every stage from its first chunk until its last chunk left that stage (on
the first stage: left the last stage, when the scheduler retires it), and releases them in the one order (KV, Mamba,
request entry); every stage's pools are checked after every level."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from ppprof.distributed.agree import RunError, stop_if_any_failed
from ppprof.distributed.batches import (
    STOP,
    BatchLimits,
    BatchMessage,
    PendingBatch,
    PendingLeft,
    isend_batch,
    isend_left,
    wait_works,
)
from ppprof.distributed.pipe import FAILED, OK, Pipe
from ppprof.mem import Request, StageCache
from ppprof.mem.cache import describe_leaks
from ppprof.model.layer import Piece
from ppprof.model.stage import Stage
from ppprof.probe.request import write_prefix
from ppprof.probe.timer import Timer
from ppprof.serving.scheduler import Batch, Capacity, Scheduler, Sizer
from ppprof.serving.scheduler import Piece as Planned
from ppprof.serving.scheduler import Request as Arrival
from ppprof.serving.simulate import LoadLevel, Served, TraceArrivals, arrival_times

log = logging.getLogger("ppprof")
SEND_DEPTH = 2
"""Batches a stage keeps in its sends beyond the micro-batch slots before it waits for the oldest to be received."""


@dataclass(slots=True)
class LevelResult:
    """What one level did on this rank: a row per batch this rank's stage ran; on rank 0 also what was served."""

    rows: list[dict] = field(default_factory=list)
    served: Served | None = None


class ServingRunner:
    """Serves levels through this rank's stage; every rank calls run() for the same level, in the same order."""

    def __init__(self, stage: Stage, cache: StageCache, pipe: Pipe, seed: int, slots: int, limits: BatchLimits) -> None:
        """`limits`: the most pieces (requests a level holds at once) and tokens a batch carries."""
        self.stage, self.cache, self.pipe, self.seed, self.slots = stage, cache, pipe, seed, slots
        self.limits = limits
        self.device = cache.device
        self.vocab = stage.spec.vocab_size
        self.trace = None
        """Where each forward is also recorded (`record(pieces, start_perf_s, latency_ms)`: a forward trace's rank
        part, ppprof.run.forward_trace), or None."""

    def run(
        self,
        prompts: Sequence[int],
        level: LoadLevel | None,
        sizer: Sizer | None,
        capacity: Capacity | None,
        tag: dict,
        trace: TraceArrivals | None = None,
    ) -> LevelResult:
        """Serve `prompts` at `level`, or (level None) at `trace`'s arrivals with its prefix cache (rank 0 sizes with
        `sizer` within `capacity`; the others take None); `tag` goes into every row. Collective. Raises RunError on
        every rank when any rank failed or leaked."""
        result, self.error, self.reqs = LevelResult(), None, {}
        self.pipe.barrier()  # every rank's level clock starts here
        self.t0 = time.perf_counter()
        try:
            if self.pipe.is_first:
                result.served = self._drive(prompts, level, sizer, capacity, tag, result.rows, trace)
            else:
                self._follow(tag, result.rows)
        finally:
            for req in self.reqs.values():
                self.cache.release(req)
        stop_if_any_failed(self.pipe, self.error)
        leaks = self.pipe.all_gather_ranks(self.cache.leaks())
        found = [f"rank {r}: {describe_leaks(lk)}" for r, lk in enumerate(leaks) if lk]
        if found:
            raise RunError(f"leak check failed after {tag}: " + "; ".join(found))
        log.info("%s, %s, repeat %s: pools back to full capacity", tag["level"], tag["arm"], tag["repeat"])
        return result

    def _ms(self) -> float:
        return (time.perf_counter() - self.t0) * 1e3

    # --- rank 0: the scheduler ---------------------------------------------------------------------------------

    def _drive(self, prompts, level, sizer, capacity, tag, rows, trace) -> Served:
        pipe = self.pipe
        scheduler = Scheduler(self.slots, sizer, capacity, None if trace is None else trace.cache)
        times = arrival_times(level, len(prompts), self.seed) if trace is None else list(trace.arrivals_ms)
        self.blocks = [()] * len(prompts) if trace is None else list(trace.blocks)
        queue = deque() if times is None else deque(zip(times, range(len(prompts)), prompts))
        self.issued = 0 if times is not None else min(level.concurrency, len(prompts))
        for rid in range(self.issued):
            scheduler.arrive(Arrival(rid, prompts[rid], 0.0, blocks=self.blocks[rid]))
        self.prompt_lens, self.tokens, self.left_at = list(prompts), {}, {}
        self.sends: deque[list] = deque()
        self.pending_left, self.received, self.sent = None, 0, 0  # "left" messages: their receive, counts
        in_flight: dict[int, int] = {}  # slot -> its batch's number
        left: dict[int, float] = {}  # batch number -> when it left the last stage (ms)
        batches, done, slot, seq = [], [], 0, 0
        while len(done) < len(prompts) and self.error is None:
            if slot in in_flight:  # the loop waits for this slot's batch to leave the last stage
                done += self._retire(scheduler, slot, self._left(in_flight.pop(slot), left), times is None)
            while queue and queue[0][0] <= self._ms():
                t, rid, n = queue.popleft()
                scheduler.arrive(Arrival(rid, n, t, blocks=self.blocks[rid]))
            batch = scheduler.next_batch(slot) if self.error is None else None
            if batch is not None:
                start, end = self._first_stage(batch, seq, tag, rows)
                if pipe.is_last:
                    left[seq] = end
                in_flight[slot] = seq
                self.sent += 1
                batches.append((batch, start, seq))
                seq += 1
            elif not in_flight and queue:  # nothing in the pipeline: wait for the next arrival
                time.sleep(max(0.0, queue[0][0] - self._ms()) / 1e3)
            elif not in_flight and not queue and len(done) < len(prompts):
                self.error = f"the scheduler stalled with {len(prompts) - len(done)} requests left"
            slot = (slot + 1) % self.slots
        for s in list(in_flight):  # after a failure: what is in the pipeline drains
            self._left(in_flight.pop(s), left)
        if not pipe.is_last:
            self.sends.append(isend_batch(pipe, self.limits, seq, STOP, []))
            for works in self.sends:
                wait_works(pipe, works, 1)
        return Served(
            sorted(done, key=lambda r: r.rid),
            [(b, start, self.left_at[s]) for b, start, s in batches if s in self.left_at],
            [],
        )

    def _retire(self, scheduler: Scheduler, slot: int, at: float, closed_loop: bool) -> list[Arrival]:
        """Slot `slot`'s batch left the last stage at `at` (ms): the requests it finished release what this stage
        holds of them, and (a closed loop) as many new ones arrive."""
        done = scheduler.finish(slot, at)
        for request in done:
            self.cache.release(self.reqs.pop(request.rid))
            self.tokens.pop(request.rid)
            if closed_loop and self.issued < len(self.prompt_lens):  # closed loop: the next request arrives now
                rid = self.issued
                scheduler.arrive(Arrival(rid, self.prompt_lens[rid], at, blocks=self.blocks[rid]))
                self.issued += 1
        return done

    def _left(self, seq: int, left: dict[int, float]) -> float:
        """When batch `seq` left the last stage (ms into the level): the last stage's messages come in batch order;
        the receive of the next is posted as soon as one comes, while batches are still out."""
        while seq not in left:
            self.pending_left = self.pending_left or PendingLeft(self.pipe)
            got, status, left_us = self.pending_left.wait()
            self.received += 1
            self.pending_left = PendingLeft(self.pipe) if self.received < self.sent else None
            left[got] = left_us / 1e3
            if status != OK and self.error is None:
                self.error = f"batch {got} failed on a later stage"
        self.left_at[seq] = left[seq]
        return left.pop(seq)

    def _first_stage(self, batch: Batch, seq: int, tag: dict, rows: list[dict]) -> tuple[float, float]:
        """Batch `batch` on the first stage: its new requests admitted and their tokens drawn, each piece's KV slots
        taken, the packed forward, the send. Returns its (start, end) in ms."""
        x = []
        for p in batch.pieces:
            if p.rid not in self.tokens:  # its first chunk: at 0, or past the prefix the cache held
                gen = torch.Generator().manual_seed(self.seed * 1_000_003 + p.rid)
                self.tokens[p.rid] = torch.randint(self.vocab, (self.prompt_lens[p.rid],), generator=gen).to(
                    self.device
                )
            x.append(self.tokens[p.rid][p.prefix_len : p.prefix_len + p.size])
        table = [(p.rid, p.prefix_len, p.size, p.last) for p in batch.pieces]
        return self._stage(BatchMessage(seq, OK, table, torch.cat(x)), batch.pieces, tag, rows, slot=batch.slot)

    # --- every stage ---------------------------------------------------------------------------------------------

    def _stage(self, message: BatchMessage, pieces, tag, rows, slot=-1) -> tuple[float, float]:
        """This stage's part of the batch `message` (its number, status, table of pieces and activations; `pieces`
        its table as the scheduler's pieces): bookkeeping, the forward where the status is OK, the send on (or, on
        the last stage, the word to rank 0), the release of the pieces that end their prompt here (not on the first
        stage of a deeper pipeline: its requests end when the scheduler retires them). Returns (start, end) in ms."""
        seq, status, x, residual = message.seq, message.status, message.hidden, message.residual
        pipe, held = self.pipe, []
        try:
            for p in pieces:
                rid, prefix_len, size = p.rid, p.prefix_len, p.size
                if rid not in self.reqs:
                    self._admit(rid, prefix_len)
                req = self.reqs[rid]
                if self.cache.extend(req, size) is None:
                    raise RuntimeError(f"KV cache too small for request {rid} at {prefix_len} + {size} tokens")
                held.append(Piece(req, prefix_len, size))
        except Exception as e:
            status, self.error = FAILED, self.error or f"stage {pipe.rank}, batch {seq}: {type(e).__name__}: {e}"
        start = end = self._ms()
        if status == OK:
            try:
                with Timer(self.device) as t:
                    x, residual = self.stage.forward_packed(self.cache, held, x, residual)
                start, end = (t.start - self.t0) * 1e3, (t.start - self.t0) * 1e3 + t.elapsed_ms
                pipe.measured(t.elapsed_ms / 1e3)
                if self.trace is not None:
                    self.trace.record([(p.prefix_len, p.size) for p in pieces], t.start, t.elapsed_ms)
            except Exception as e:
                status = FAILED
                self.error = self.error or f"stage {pipe.rank}, batch {seq}: {type(e).__name__}: {e}"
        rows.append(
            {
                **tag,
                "batch": seq,
                "slot": slot,
                "stage": pipe.rank,
                "tokens": sum(p.size for p in pieces),
                "pieces": len(pieces),
                "requests": " ".join(f"{p.rid}:{p.prefix_len}+{p.size}" for p in pieces),
                "start_ms": round(start, 4),
                "end_ms": round(end, 4),
                "compute_ms": round(end - start, 4),
            }
        )
        if pipe.is_last:
            if not pipe.is_first:
                self.sends.append(isend_left(pipe, seq, status, int(self._ms() * 1e3)))
        else:
            self.sends.append(isend_batch(pipe, self.limits, seq, status, message.pieces, x, residual))
            if len(self.sends) > self.slots + SEND_DEPTH:
                wait_works(pipe, self.sends.popleft(), pipe.rank + 1)
        if not pipe.is_first:
            for p in pieces:
                if p.last and p.rid in self.reqs:
                    self.cache.release(self.reqs.pop(p.rid))
        return start, end

    def _admit(self, rid: int, prefix_len: int) -> None:
        """Request `rid`'s first chunk on this stage: its request entry and Mamba slot, and where it starts past a
        cached prefix, that prefix as a server holds it: `prefix_len` KV slots with K/V written and its Mamba state
        (the probes' synthetic prefix, ppprof.probe.request.write_prefix), so that its chunks attend over them."""
        req = self.reqs[rid] = Request(rid)
        if not self.cache.admit(req):
            raise RuntimeError(f"cannot admit request {rid}: {self.cache.outstanding()}")
        if prefix_len and not write_prefix(self.cache, req, prefix_len, None):
            raise RuntimeError(f"KV cache too small for the cached prefix of request {rid} ({prefix_len} tokens)")

    def _follow(self, tag: dict, rows: list[dict]) -> None:
        """A later stage: each batch as it comes, until the level's STOP."""
        pipe, self.sends = self.pipe, deque()
        pending = PendingBatch(pipe, self.limits)
        while True:
            m = pending.wait()
            if m.status == STOP:
                if not pipe.is_last:
                    self.sends.append(isend_batch(pipe, self.limits, m.seq, STOP, []))
                break
            pending = PendingBatch(pipe, self.limits)  # the next header's receive, posted before this forward
            pieces = [Planned(r, p, n, last) for r, p, n, last in m.pieces]
            self._stage(m, pieces, tag, rows)
        peer = 0 if pipe.is_last else pipe.rank + 1
        for works in self.sends:
            wait_works(pipe, works, peer)

"""Packed forwards: several requests' chunks, each at its own prefix, in one forward of every stage (as a server's
variable-length batch runs them; Stage.forward_packed), timed in lockstep as the probes are. The design (pure,
seeded): 2 to 8 pieces a forward, each a (prefix length, chunk size) cell the probes ran, within the largest probe
chunk's tokens and the pools. The runner: per forward, on every rank, set up every piece (request entry, Mamba slot,
prefix, KV slots; the Mamba slots in one grouped window), receive, the primer, the timed forward, send on, and release
every piece in a finally path (KV slots, Mamba slot, request entry); the ranks agree after each forward, and every
pool is checked after the last. The rows go into packed.csv (the fit scores its additive form on them)."""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import pandas as pd
import torch

from ppprof.chunks import align_up
from ppprof.distributed.agree import stop_if_any_failed
from ppprof.distributed.pipe import FAILED, OK
from ppprof.io import atomic_write
from ppprof.mem import Request
from ppprof.model.layer import Piece
from ppprof.probe.loop import ProbeRunner
from ppprof.probe.request import fill_request
from ppprof.probe.synth import Probe, ProbeRequest
from ppprof.probe.timer import Timer
from ppprof.runfiles import stage_column

MIN_PIECES, MAX_PIECES = 2, 8
"""Requests in one packed forward: a forward of one is a probe's."""
LIST_SEP = " "
"""What separates a packed forward's prefix lengths (and chunk sizes) in one packed.csv field."""


@dataclass(frozen=True, slots=True)
class Pack:
    """One packed forward: its pieces (a request each, `chunk_size` new tokens after `prefix_len` cached ones), in
    the order they are packed."""

    index: int
    requests: tuple[ProbeRequest, ...]

    @property
    def tokens(self) -> int:
        return sum(r.chunk_size for r in self.requests)


@dataclass(frozen=True, slots=True)
class PackLimits:
    """What a pack must fit: the tokens of one forward (the largest probe chunk), the KV slots of a stage (each
    request's whole pages), a request's positions (the context length), the Mamba slots and request entries."""

    tokens: int
    kv_slots: int
    page_size: int
    context_len: int
    max_pieces: int


def pack_design(probes: list[Probe], limits: PackLimits, num_forwards: int, seed: int) -> list[Pack]:
    """`num_forwards` packs of 2, 3, ..., 8, 2, ... pieces (fewer where the limits hold fewer), seeded, each piece a
    cell (prefix length, chunk size) the probes measured, so that the pack's additive latency can also be read off the
    probes' own latencies: its prefix drawn among the prefixes with a cell that leaves room (tokens, KV slots, the
    context) for the smallest cell in every piece still to draw, then its chunk size among that prefix's such cells;
    the pieces then shuffled. Request ids follow the probes'. [] where no two of the smallest cell fit."""
    page = limits.page_size
    cells = sorted(
        {
            (r.prefix_len, r.chunk_size)
            for p in probes
            for r in p.requests
            if r.prefix_len + r.chunk_size <= limits.context_len
        }
    )
    if not cells:
        return []
    kv = {cell: align_up(sum(cell), page) for cell in cells}
    reserve = min(cells, key=lambda cell: (kv[cell], cell[1]))  # what every piece still to draw keeps room for
    most = min(MAX_PIECES, limits.max_pieces, limits.tokens // reserve[1], limits.kv_slots // kv[reserve])
    if most < MIN_PIECES:
        return []
    rng = random.Random(seed * 7919 + 33)
    rid = 1 + max(r.rid for p in probes for r in p.requests)
    packs = []
    for k in range(num_forwards):
        n = min(MIN_PIECES + k % (MAX_PIECES - MIN_PIECES + 1), most)
        pieces, tokens, slots = [], limits.tokens, limits.kv_slots
        for i in range(n):
            rest = n - 1 - i
            room, kv_room = tokens - reserve[1] * rest, slots - kv[reserve] * rest
            fits = [cell for cell in cells if cell[1] <= room and kv[cell] <= kv_room]
            prefix_len = rng.choice(sorted({L for L, _ in fits}))
            pieces.append(rng.choice([cell for cell in fits if cell[0] == prefix_len]))
            tokens, slots = tokens - pieces[-1][1], slots - kv[pieces[-1]]
        rng.shuffle(pieces)
        packs.append(Pack(k, tuple(ProbeRequest(rid + j, L, x) for j, (L, x) in enumerate(pieces))))
        rid += n
    return packs


class PackedRunner:
    """Runs packed forwards through this rank's stage in lockstep with the other ranks, with the probe runner's stage,
    cache and pipe, timing the stage's forward."""

    def __init__(self, runner: ProbeRunner) -> None:
        self.runner = runner
        self.stage, self.cache, self.pipe = runner.stage, runner.cache, runner.pipe

    def run(self, packs: list[Pack]) -> list[float]:
        """The first pack untimed (no timed forward is the first of its kind), then every pack timed: this stage's
        latency of each (ms); RunError on every rank when any rank failed, or a pool is not full after the last."""
        out = []
        for pack, timed in [(packs[0], False)] + [(p, True) for p in packs]:
            stage_ms, error = self.run_pack(pack, timed)
            stop_if_any_failed(self.pipe, error)
            if timed:
                out.append(stage_ms)
        self.runner.check_leaks("after the packed forwards")
        return out

    def run_pack(self, pack: Pack, timed: bool) -> tuple[float, str | None]:
        """One packed forward through this rank's stage: (stage_ms, error or None)."""
        pipe, cache, start = self.pipe, self.cache, time.perf_counter()
        reqs = [Request(pr.rid) for pr in pack.requests]
        stage_ms, error, status, out, residual = math.nan, None, OK, None, None
        try:
            setup_error = self._set_up(pack, reqs)
            if pipe.is_first:
                x = torch.cat([self._tokens(pr) for pr in pack.requests])
            # Every rank sets up before any times (as the probes): a failed set-up stops every rank here.
            if pipe.any_true(setup_error is not None):
                return stage_ms, setup_error
            if not pipe.is_first:
                status, x, residual = pipe.recv_activation()
            if status == OK:
                pieces = [Piece(req, pr.prefix_len, pr.chunk_size) for req, pr in zip(reqs, pack.requests)]
                status, out, residual, stage_ms, error = self._forward(pack, pieces, x, residual)
            if not pipe.is_last:
                pipe.send_activation(status, out, residual)
        finally:
            for req in reqs:  # the one release path: KV slots, Mamba slot, request entry
                try:
                    cache.release(req)
                except Exception as e:
                    error = error or f"release of request {req.rid} raised {type(e).__name__}: {e}"
        pipe.measured(time.perf_counter() - start)
        return (stage_ms if timed else math.nan), error

    def _set_up(self, pack: Pack, reqs: list[Request]) -> str | None:
        """Admit every piece's request (its Mamba slot from one grouped window) and fill its prefix and chunk slots;
        the error, or None. The caller releases every request either way."""
        cache, mamba = self.cache, self.cache.mamba_alloc
        if mamba is not None:
            mamba.alloc_group_begin(len(reqs))
        try:
            for req, pr in zip(reqs, pack.requests):
                if not cache.admit(req):
                    return (
                        f"packed forward {pack.index}: request {pr.rid} cannot be admitted beside "
                        f"{len(pack.requests) - 1} others: {cache.outstanding()} slots held"
                    )
                seed = self.runner.seed * 1_000_003 + pr.rid * 31 + self.pipe.rank
                fill_request(cache, req, pr, torch.Generator().manual_seed(seed) if pr.prefix_len else None)
        except Exception as e:
            return f"set-up of packed forward {pack.index} failed: {e}"
        finally:
            if mamba is not None and mamba.group_open:
                mamba.alloc_group_end()
        return None

    def _tokens(self, pr: ProbeRequest) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.runner.seed + pr.rid)
        return torch.randint(self.runner.vocab_size, (pr.chunk_size,), generator=gen).to(self.runner.device)

    def _forward(self, pack: Pack, pieces: list[Piece], x, residual):
        """The primer (each piece's first token at its own position, untimed: as a probe's, so that the timed forward
        runs as warm), then the timed forward: (status, out, residual, stage_ms, error or None)."""
        try:
            firsts = torch.tensor([0] + [p.size for p in pieces[:-1]], device=x.device).cumsum(0)
            ones = [Piece(p.req, p.prefix_len, 1) for p in pieces]
            self.stage.forward_packed(self.cache, ones, x[firsts], None if residual is None else residual[firsts])
            self.pipe.tp_barrier()  # the TP ranks of the stage start the timed forward together
            with Timer(self.runner.device) as t:
                out, residual = self.stage.forward_packed(self.cache, pieces, x, residual)
        except Exception as e:
            error = f"packed forward {pack.index} ({len(pieces)} pieces) raised {type(e).__name__}: {e}"
            self.pipe.tp_failed(error)
            return FAILED, None, None, math.nan, error
        return OK, out, residual, self.pipe.tp_slowest(t.elapsed_ms), None


def packed_frame(packs: list[Pack], stage_ms: list[list[float]]) -> pd.DataFrame:
    """stage_ms[stage][pack] -> packed.csv's rows: one a packed forward, its pieces' prefix lengths and chunk sizes
    (LIST_SEP between them, in packing order) and every stage's latency."""
    rows = []
    for k, pack in enumerate(packs):
        row = {
            "forward": pack.index,
            "pieces": len(pack.requests),
            "tokens": pack.tokens,
            "prefix_lens": LIST_SEP.join(str(r.prefix_len) for r in pack.requests),
            "chunk_sizes": LIST_SEP.join(str(r.chunk_size) for r in pack.requests),
        }
        row.update({stage_column(s): round(ms[k], 4) for s, ms in enumerate(stage_ms)})
        rows.append(row)
    return pd.DataFrame(rows)


def write_packed(path, packs: list[Pack], stage_ms: list[list[float]]):
    """packed.csv, atomically."""
    frame = packed_frame(packs, stage_ms)
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))

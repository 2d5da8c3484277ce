"""The messages of a serving bench between the ranks (ppprof.bench.serving): each batch down the pipeline, its
pieces' table before the packed activations, and, from the last stage back to the first, when each batch left the
pipeline. Non-blocking sends, so that the first stage builds its next batch while the others run this one; blocking
receives, each under the watchdog's deadline."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ppprof.distributed.pipe import OK, Pipe

STOP = 2
"""A batch status: the level is over, no batch follows."""
PIECE_FIELDS = 4
"""A piece in the table: (rid, prefix_len, chunk_size, last)."""


@dataclass(slots=True)
class BatchMessage:
    """A batch as a stage receives it: its number in the level, its status (OK, FAILED: a stage before failed, so
    this one skips the forward but keeps the bookkeeping, or STOP), its pieces and the packed activations."""

    seq: int
    status: int
    pieces: list[tuple[int, int, int, bool]]
    hidden: torch.Tensor | None = None
    residual: torch.Tensor | None = None


def isend_batch(
    pipe: Pipe,
    seq: int,
    status: int,
    pieces: list[tuple[int, int, int, bool]],
    hidden: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> list:
    """To the next stage: the header (seq, status, tokens, pieces), the pieces' table, then (when OK) hidden and
    residual, each (tokens, hidden_size). Returns the works (they hold the tensors) to wait on."""
    dst = pipe.peer(pipe.rank + 1)
    tokens = sum(p[2] for p in pieces) if status == OK else 0
    tensors = [torch.tensor([seq, status, tokens, len(pieces)], dtype=torch.int64, device=pipe.device)]
    if pieces:
        tensors.append(torch.tensor([[r, p, n, int(last)] for r, p, n, last in pieces], dtype=torch.int64))
        tensors[-1] = tensors[-1].to(pipe.device)
    if status == OK:
        tensors += [hidden.to(pipe.dtype).contiguous(), residual.to(pipe.dtype).contiguous()]
    return [dist.isend(t, dst, group=pipe.group) for t in tensors]


def recv_batch(pipe: Pipe) -> BatchMessage:
    """The previous stage's next batch."""
    src = pipe.peer(pipe.rank - 1)
    header = torch.zeros(4, dtype=torch.int64, device=pipe.device)
    with pipe.waiting(src):
        dist.recv(header, src, group=pipe.group)
        seq, status, tokens, count = (int(v) for v in header.tolist())
        pieces = []
        if count:
            table = torch.zeros((count, PIECE_FIELDS), dtype=torch.int64, device=pipe.device)
            dist.recv(table, src, group=pipe.group)
            pieces = [(r, p, n, bool(last)) for r, p, n, last in table.tolist()]
        message = BatchMessage(seq, status, pieces)
        if status == OK:
            message.hidden = torch.empty((tokens, pipe.hidden_size), dtype=pipe.dtype, device=pipe.device)
            message.residual = torch.empty_like(message.hidden)
            dist.recv(message.hidden, src, group=pipe.group)
            dist.recv(message.residual, src, group=pipe.group)
    return message


def isend_left(pipe: Pipe, seq: int, status: int, left_us: int) -> list:
    """Last stage -> first: batch `seq` left the pipeline `left_us` microseconds into the level (every rank's level
    clock starts at the same barrier)."""
    t = torch.tensor([seq, status, left_us], dtype=torch.int64, device=pipe.device)
    return [dist.isend(t, pipe.peer(0), group=pipe.group)]


def recv_left(pipe: Pipe) -> tuple[int, int, int]:
    """(seq, status, left_us) of the next batch to leave the last stage."""
    t = torch.zeros(3, dtype=torch.int64, device=pipe.device)
    last = pipe.peer(pipe.world_size - 1)
    with pipe.waiting(last):
        dist.recv(t, last, group=pipe.group)
    seq, status, left_us = (int(v) for v in t.tolist())
    return seq, status, left_us


def wait_works(pipe: Pipe, works: list, peer: int) -> None:
    """Wait for sends to `peer`'s stage to be received (at a level's end), under the deadline."""
    with pipe.waiting(pipe.peer(peer)):
        for w in works:
            w.wait()

"""The messages of a serving bench between the ranks (ppprof.bench.serving): each batch down the pipeline, and, from
the last stage back to the first, when each batch left the pipeline. A batch is two messages: a header of fixed size
(seq, status, tokens, pieces, then the pieces' table padded to the most pieces a batch can carry), which the
receiver posts before it runs its current batch, so that a header is never waited for, and the packed activations
(hidden and residual, one tensor), received once the header says their size. Non-blocking sends, so that a stage
builds or runs its next batch while the next stage runs this one; every wait is under the watchdog's deadline."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from ppprof.distributed.pipe import OK, Pipe

STOP = 2
"""A batch status: the level is over, no batch follows."""
PIECE_FIELDS = 4
"""A piece in the table: (rid, prefix_len, chunk_size, last)."""
HEAD_FIELDS = 4
"""(seq, status, tokens, number of pieces) before the table."""


@dataclass(slots=True)
class BatchMessage:
    """A batch as a stage receives it: its number in the level, its status (OK, FAILED: a stage before failed, so
    this one skips the forward but keeps the bookkeeping, or STOP), its pieces and the packed activations."""

    seq: int
    status: int
    pieces: list[tuple[int, int, int, bool]]
    hidden: torch.Tensor | None = None
    residual: torch.Tensor | None = None


def header_size(max_pieces: int) -> int:
    return HEAD_FIELDS + PIECE_FIELDS * max_pieces


def isend_batch(
    pipe: Pipe,
    max_pieces: int,
    seq: int,
    status: int,
    pieces: list[tuple[int, int, int, bool]],
    hidden: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> list:
    """To the next stage: the header, then (when OK) hidden and residual as one (2 x tokens, hidden_size) tensor.
    Returns the works (they hold the tensors) to wait on."""
    if len(pieces) > max_pieces:
        raise ValueError(f"a batch of {len(pieces)} pieces: the header holds {max_pieces}")
    dst = pipe.peer(pipe.rank + 1)
    tokens = sum(p[2] for p in pieces) if status == OK else 0
    head = [seq, status, tokens, len(pieces)] + [int(v) for piece in pieces for v in piece]
    header = torch.zeros(header_size(max_pieces), dtype=torch.int64)
    header[: len(head)] = torch.tensor(head, dtype=torch.int64)
    tensors = [header.to(pipe.device)]
    if status == OK:
        tensors.append(torch.cat([hidden.to(pipe.dtype), residual.to(pipe.dtype)]).contiguous())
    return [dist.isend(t, dst, group=pipe.group) for t in tensors]


class PendingBatch:
    """The receive of the previous stage's next header, posted ahead; wait() gives the batch with its activations."""

    def __init__(self, pipe: Pipe, max_pieces: int) -> None:
        self.pipe, self.src = pipe, pipe.peer(pipe.rank - 1)
        self.header = torch.zeros(header_size(max_pieces), dtype=torch.int64, device=pipe.device)
        self.work = dist.irecv(self.header, self.src, group=pipe.group)

    def wait(self) -> BatchMessage:
        pipe = self.pipe
        with pipe.waiting(self.src):
            self.work.wait()
            head = self.header.tolist()
            seq, status, tokens, count = head[:HEAD_FIELDS]
            table = head[HEAD_FIELDS : HEAD_FIELDS + PIECE_FIELDS * count]
            pieces = [(r, p, n, bool(last)) for r, p, n, last in zip(*[iter(table)] * PIECE_FIELDS)]
            message = BatchMessage(seq, status, pieces)
            if status == OK:
                both = torch.empty((2 * tokens, pipe.hidden_size), dtype=pipe.dtype, device=pipe.device)
                dist.recv(both, self.src, group=pipe.group)
                message.hidden, message.residual = both[:tokens], both[tokens:]
        return message


def isend_left(pipe: Pipe, seq: int, status: int, left_us: int) -> list:
    """Last stage -> first: batch `seq` left the pipeline `left_us` microseconds into the level (every rank's level
    clock starts at the same barrier)."""
    t = torch.tensor([seq, status, left_us], dtype=torch.int64, device=pipe.device)
    return [dist.isend(t, pipe.peer(0), group=pipe.group)]


class PendingLeft:
    """The first stage's receive of the next "left" message, posted ahead; wait() gives (seq, status, left_us)."""

    def __init__(self, pipe: Pipe) -> None:
        self.pipe, self.last = pipe, pipe.peer(pipe.world_size - 1)
        self.t = torch.zeros(3, dtype=torch.int64, device=pipe.device)
        self.work = dist.irecv(self.t, self.last, group=pipe.group)

    def wait(self) -> tuple[int, int, int]:
        with self.pipe.waiting(self.last):
            self.work.wait()
            seq, status, left_us = (int(v) for v in self.t.tolist())
        return seq, status, left_us


def wait_works(pipe: Pipe, works: list, peer: int) -> None:
    """Wait for sends to `peer`'s stage to be received (at a level's end), under the deadline."""
    with pipe.waiting(pipe.peer(peer)):
        for w in works:
            w.wait()

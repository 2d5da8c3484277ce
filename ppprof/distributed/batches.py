"""The messages of a serving bench between the ranks (ppprof.bench.serving): each batch down the pipeline, and, from
the last stage back to the first, when each batch left the pipeline. A batch is two messages: a header of fixed size
(seq, status, tokens, pieces, then the pieces' table padded to the most pieces a batch can carry) and the packed
activations (hidden and residual, one tensor). The receiver posts both before it runs its current batch, so that the
transfer overlaps that forward: gloo takes a message into a larger buffer, so on CPU the activations land in one of
the largest batch's size; NCCL needs the exact size, so on CUDA they are received once the header says it (a GPU's
copy engines do not wait on a busy CPU thread as gloo's transfers do on 2 busy cores). Non-blocking sends, so that a
stage builds or runs its next batch while the next stage runs this one; every wait is under the watchdog's
deadline."""

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


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """What every stage's receives are sized for: the most pieces and the most tokens a batch carries."""

    max_pieces: int
    max_tokens: int

    @property
    def header_size(self) -> int:
        return HEAD_FIELDS + PIECE_FIELDS * self.max_pieces


def posted_ahead(pipe: Pipe) -> bool:
    """True where the activations' receive is posted before their size is known (gloo: CPU)."""
    return pipe.device.type == "cpu"


def isend_batch(
    pipe: Pipe,
    limits: BatchLimits,
    seq: int,
    status: int,
    pieces: list[tuple[int, int, int, bool]],
    hidden: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
) -> list:
    """To the next stage: the header, then hidden and residual as one (2 x tokens, hidden_size) tensor (when OK; on
    gloo always, one row of zeros when not OK, so that the receive posted ahead takes it). Returns the works (they
    hold the tensors) to wait on."""
    tokens = sum(p[2] for p in pieces) if status == OK else 0
    if len(pieces) > limits.max_pieces or tokens > limits.max_tokens:
        raise ValueError(
            f"a batch of {len(pieces)} pieces and {tokens} tokens: the receives hold {limits.max_pieces} and "
            f"{limits.max_tokens}"
        )
    dst = pipe.peer(pipe.rank + 1)
    head = [seq, status, tokens, len(pieces)] + [int(v) for piece in pieces for v in piece]
    header = torch.zeros(limits.header_size, dtype=torch.int64)
    header[: len(head)] = torch.tensor(head, dtype=torch.int64)
    tensors = [header.to(pipe.device)]
    if status == OK:
        tensors.append(torch.cat([hidden.to(pipe.dtype), residual.to(pipe.dtype)]).contiguous())
    elif posted_ahead(pipe):
        tensors.append(torch.zeros((1, pipe.hidden_size), dtype=pipe.dtype, device=pipe.device))
    return [dist.isend(t, dst, group=pipe.group) for t in tensors]


class PendingBatch:
    """The receives of the previous stage's next batch, posted ahead; wait() gives the batch with its activations."""

    def __init__(self, pipe: Pipe, limits: BatchLimits) -> None:
        self.pipe, self.src = pipe, pipe.peer(pipe.rank - 1)
        self.header = torch.zeros(limits.header_size, dtype=torch.int64, device=pipe.device)
        self.works = [dist.irecv(self.header, self.src, group=pipe.group)]
        self.both = None
        if posted_ahead(pipe):
            self.both = torch.empty((2 * limits.max_tokens, pipe.hidden_size), dtype=pipe.dtype, device=pipe.device)
            self.works.append(dist.irecv(self.both, self.src, group=pipe.group))

    def wait(self) -> BatchMessage:
        pipe = self.pipe
        with pipe.waiting(self.src):
            for work in self.works:
                work.wait()
            head = self.header.tolist()
            seq, status, tokens, count = head[:HEAD_FIELDS]
            table = head[HEAD_FIELDS : HEAD_FIELDS + PIECE_FIELDS * count]
            pieces = [(r, p, n, bool(last)) for r, p, n, last in zip(*[iter(table)] * PIECE_FIELDS)]
            message = BatchMessage(seq, status, pieces)
            if status == OK:
                both = self.both
                if both is None:
                    both = torch.empty((2 * tokens, pipe.hidden_size), dtype=pipe.dtype, device=pipe.device)
                    dist.recv(both, self.src, group=pipe.group)
                message.hidden, message.residual = both[:tokens], both[tokens : 2 * tokens]
        return message


def isend_left(pipe: Pipe, seq: int, status: int, left_us: int) -> list:
    """Last stage -> first: batch `seq` left the pipeline `left_us` microseconds into the level (every rank's level
    clock starts at the same barrier)."""
    t = torch.tensor([seq, status, left_us], dtype=torch.int64, device=pipe.device)
    return [dist.isend(t, pipe.peer(0), group=pipe.group)]


class PendingLeft:
    """The first stage's receive of the next "left" message, posted ahead; wait() gives (seq, status, left_us)."""

    def __init__(self, pipe: Pipe) -> None:
        self.pipe, self.last = pipe, pipe.peer(pipe.pp_size - 1)
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

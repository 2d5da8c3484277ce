"""Point-to-point transfer of activations between neighbouring stages, and the few collectives of a profile.

Every message down the pipeline starts with a header (status, chunk_size), so that a stage whose forward failed
still tells its successors, which then skip their forward instead of waiting on a tensor that never comes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
import torch.distributed as dist

from ppprof.distributed.mesh import Mesh, TPGroup
from ppprof.distributed.rankstate import EVERY_RANK
from ppprof.distributed.watchdog import Watchdog

OK = 0
FAILED = 1


class PendingActivation:
    """Receives posted for one chunk: wait() gives (status, hidden, residual), the tensors None unless OK; `gather`
    makes a received slice the whole tensor (Pipe.gathered)."""

    def __init__(
        self,
        works: list,
        header: torch.Tensor,
        hidden: torch.Tensor,
        residual: torch.Tensor,
        waiting: AbstractContextManager,
        gather: Callable[[torch.Tensor], torch.Tensor],
    ) -> None:
        self.works, self.header, self.hidden, self.residual = works, header, hidden, residual
        self.waiting, self.gather = waiting, gather

    def wait(self) -> tuple[int, torch.Tensor | None, torch.Tensor | None]:
        with self.waiting:  # on CUDA the wait ends at .item(), when the stream has the header
            for w in self.works:
                w.wait()
            status = int(self.header[0].item())
        if status != OK:
            return status, None, None
        return status, self.gather(self.hidden), self.gather(self.residual)


class Pipe:
    """This rank's links to its neighbours in the pipeline (activations down, "done" back to rank 0), and the few
    collectives of a run (agreement, gather, broadcast). With a watchdog, every wait on another rank has a deadline
    (ppprof.distributed.watchdog).

    `rank` is this rank's stage and `pp_size` the number of stages (the job's world_size counts its ranks, pp_size x
    tp_size). With a (pp, tp) mesh, as servers send it (vLLM's and SGLang's send_tensor_dict with an all-gather
    group): after the row-parallel all-reduce every TP rank holds the whole (replicated) hidden and residual, so TP
    rank t of a stage sends only its 1/tp slice of each (flattened) to TP rank t of the next over the mesh's pp
    group, and the receiving stage's TP ranks all-gather the slices; a chunk whose n x hidden values tp does not
    divide crosses whole. The agreement, gathers, broadcasts and barriers span every rank of the mesh; `all_gather`
    gives one entry a stage (its TP rank 0's: the TP ranks of a stage agree on what they gather, their latencies
    being the slowest's), `all_gather_ranks` one a rank."""

    def __init__(
        self,
        *,
        rank: int,
        pp_size: int,
        device: torch.device,
        hidden_size: int,
        dtype: torch.dtype,
        watchdog: Watchdog | None = None,
        mesh: Mesh | None = None,
    ) -> None:
        self.rank = rank
        self.pp_size = pp_size
        self.device = device
        self.hidden_size = hidden_size
        self.dtype = dtype
        self.watchdog = watchdog
        self.mesh = mesh
        self.tp_size = 1 if mesh is None else mesh.coords.tp_size
        self.num_ranks = pp_size * self.tp_size
        self._group = None if mesh is None else mesh.pp_group

    @property
    def group(self):
        """The process group of the pipeline's transfers (the mesh's pp group; None: the default group)."""
        return self._group

    @property
    def tp(self) -> TPGroup | None:
        """This stage's TP group (None without a mesh)."""
        return None if self.mesh is None else self.mesh.tp

    @property
    def global_rank(self) -> int:
        """This rank's place among all of the mesh's ranks (0: the rank that writes the run folder and chooses the
        adaptive design's probes); `rank` is its stage."""
        return self.rank if self.mesh is None else self.mesh.coords.rank

    def peer(self, stage: int) -> int:
        """The global rank this rank talks to on `stage` (its own TP rank there)."""
        return stage if self.mesh is None else self.mesh.coords.global_rank(stage)

    def tp_barrier(self) -> None:
        """Every TP rank of this stage starts the next timed forward together (nothing at TP = 1)."""
        if self.tp_size > 1:
            self.mesh.tp.barrier()

    def tp_slowest(self, ms: float) -> float:
        """A stage's latency: the slowest of its TP ranks' (`ms` at TP = 1)."""
        return self.mesh.tp.slowest(ms) if self.tp_size > 1 else ms

    def tp_failed(self, message: str) -> None:
        """This TP rank's forward failed (nothing at TP = 1, where the agreement reaches every rank). Its TP peers
        may be waiting for it inside a layer's all-reduce, out of reach of the agreement, and any collective this
        rank joined now could meet theirs on the same communicator (at PP = 1 the TP group is every rank): so the
        failure becomes the run's verdict and this rank waits, joining nothing, until the watchdog's deadline ends
        it; every other rank ends at its own deadline with the same message. Does not return under a watchdog."""
        if self.tp_size == 1 or self.watchdog is None:
            return
        self.watchdog.publish(f"rank {self.mesh.coords.rank}: {message}")
        with self.waiting():
            while True:
                time.sleep(1.0)

    def waiting(self, peer: int = EVERY_RANK) -> AbstractContextManager:
        """Around a wait on rank `peer` (EVERY_RANK: a collective): the watchdog's deadline applies."""
        return self.watchdog.waiting(peer) if self.watchdog is not None else nullcontext()

    def measured(self, seconds: float) -> None:
        """One request took `seconds` on this rank: the deadlines of later waits follow it."""
        if self.watchdog is not None:
            self.watchdog.measured(seconds)

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    @property
    def is_last(self) -> bool:
        return self.rank == self.pp_size - 1

    def _header(self, status: int, chunk_size: int) -> torch.Tensor:
        return torch.tensor([status, chunk_size], dtype=torch.int64, device=self.device)

    def sliced(self, chunk_size: int) -> bool:
        """Whether a chunk of `chunk_size` tokens crosses the stage boundary in 1/tp slices (TP > 1, and tp divides
        its chunk_size x hidden_size values), else whole."""
        return self.tp_size > 1 and chunk_size * self.hidden_size % self.tp_size == 0

    def outgoing(self, x: torch.Tensor) -> torch.Tensor:
        """What this rank sends of x: (chunk_size, hidden) -> its TP rank's slice of the flattened values, or x whole;
        in the pipeline dtype (the receiver allocates buffers of it)."""
        x = x.to(self.dtype).contiguous()
        if not self.sliced(x.shape[0]):
            return x
        return x.view(-1).chunk(self.tp_size)[self.mesh.coords.tp_rank].contiguous()

    def incoming(self, chunk_size: int) -> torch.Tensor:
        """A receive buffer of what the previous stage's peer sends of a chunk (outgoing's shape)."""
        shape = (
            (chunk_size * self.hidden_size // self.tp_size,)
            if self.sliced(chunk_size)
            else (chunk_size, self.hidden_size)
        )
        return torch.empty(shape, dtype=self.dtype, device=self.device)

    def gathered(self, part: torch.Tensor) -> torch.Tensor:
        """A received slice -> the whole (chunk_size, hidden), all-gathered over this stage's TP ranks (every one
        calls it); a whole tensor as it is."""
        if part.dim() == 2:
            return part
        return self.mesh.tp.all_gather(part).view(-1, self.hidden_size)

    def send_activation(self, status: int, hidden: torch.Tensor | None, residual: torch.Tensor | None) -> None:
        """To the next stage: the header, then (when OK) hidden and residual, each (chunk_size, hidden_size), or this
        TP rank's slice of each."""
        dst = self.peer(self.rank + 1)
        chunk_size = 0 if status != OK else hidden.shape[0]
        with self.waiting(dst):
            dist.send(self._header(status, chunk_size), dst, group=self._group)
            if status == OK:
                dist.send(self.outgoing(hidden), dst, group=self._group)
                dist.send(self.outgoing(residual), dst, group=self._group)

    def recv_activation(self) -> tuple[int, torch.Tensor | None, torch.Tensor | None]:
        """From the previous stage: (status, hidden, residual); the tensors are None when the status is not OK."""
        src = self.peer(self.rank - 1)
        header = self._header(OK, 0)
        with self.waiting(src):
            dist.recv(header, src, group=self._group)
            status, chunk_size = (int(v) for v in header.tolist())
            if status != OK:
                return status, None, None
            hidden, residual = self.incoming(chunk_size), self.incoming(chunk_size)
            dist.recv(hidden, src, group=self._group)
            dist.recv(residual, src, group=self._group)
        return status, self.gathered(hidden), self.gathered(residual)

    def isend_activation(
        self, status: int, hidden: torch.Tensor | None, residual: torch.Tensor | None, chunk_size: int
    ) -> list:
        """Non-blocking send to the next stage of the header and both tensors (or this TP rank's slices), always of
        a chunk of chunk_size tokens, zeros when the status is not OK (the receiver posted its receives for exactly
        these shapes). Returns the works to wait on."""
        dst = self.peer(self.rank + 1)
        if status != OK:
            hidden = residual = torch.zeros((chunk_size, self.hidden_size), dtype=self.dtype, device=self.device)
        tensors = (self._header(status, chunk_size), self.outgoing(hidden), self.outgoing(residual))
        return [dist.isend(t, dst, group=self._group) for t in tensors]

    def irecv_activation(self, chunk_size: int) -> PendingActivation:
        """Post the receives of the previous stage's next chunk of `chunk_size` tokens; wait() on the result (which
        all-gathers sliced tensors over this stage's TP ranks)."""
        src = self.peer(self.rank - 1)
        header = self._header(OK, 0)
        hidden, residual = self.incoming(chunk_size), self.incoming(chunk_size)
        works = [dist.irecv(t, src, group=self._group) for t in (header, hidden, residual)]
        return PendingActivation(works, header, hidden, residual, self.waiting(src), self.gathered)

    def wait_sends(self, works: list) -> None:
        """Wait for the works of isend_activation (the next stage receives them); on CUDA until they are done, so that
        a next stage that never receives is met here, under the deadline, not in a later unwatched sync."""
        with self.waiting(self.peer(self.rank + 1)):
            for w in works:
                w.wait()
            if self.device.type == "cuda":
                torch.cuda.current_stream(self.device).synchronize()

    def barrier(self) -> None:
        with self.waiting():
            dist.barrier()  # every rank of the mesh

    def round_trips_ms(self, boundary: int, chunk_size: int, repeats: int) -> list[float]:
        """Transfer time across the boundary between ranks `boundary` and `boundary + 1`: the first sends one chunk's
        hidden and residual and waits for them to come back, `repeats` times; returns its round trips (ms), [] on
        every other rank (the second echoes). Half a round trip is one transfer, whatever the nodes' clocks."""
        if self.rank not in (boundary, boundary + 1):
            return []
        tensors = [torch.zeros((chunk_size, self.hidden_size), dtype=self.dtype, device=self.device) for _ in range(2)]
        out = []
        peer = self.peer(boundary + 1 if self.rank == boundary else boundary)
        with self.waiting(peer):
            for _ in range(repeats):
                if self.rank == boundary:
                    start = time.perf_counter()
                    for t in tensors:
                        dist.send(t, peer, group=self._group)
                    for t in tensors:
                        dist.recv(t, peer, group=self._group)
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)
                    out.append((time.perf_counter() - start) * 1e3)
                else:
                    for t in tensors:
                        dist.recv(t, peer, group=self._group)
                    for t in tensors:
                        dist.send(t, peer, group=self._group)
        return out

    def send_done(self, status: int) -> None:
        """Last stage -> first stage: the request has left the pipeline (ends the end-to-end timing)."""
        first = self.peer(0)
        with self.waiting(first):
            dist.send(self._header(status, 0), first, group=self._group)

    def recv_done(self) -> int:
        header = self._header(OK, 0)
        last = self.peer(self.pp_size - 1)
        with self.waiting(last):
            dist.recv(header, last, group=self._group)
            return int(header[0].item())

    def any_true(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on any rank."""
        t = torch.tensor([int(flag)], dtype=torch.int64, device=self.device)
        with self.waiting():
            dist.all_reduce(t, op=dist.ReduceOp.MAX)
            return bool(t.item())

    def all_gather(self, obj: Any) -> list[Any]:
        """`obj` of every stage (its TP rank 0's), on every rank (picklable objects)."""
        return self.all_gather_ranks(obj)[:: self.tp_size]

    def all_gather_ranks(self, obj: Any) -> list[Any]:
        """`obj` of every rank, in rank order, on every rank (picklable objects)."""
        out: list[Any] = [None] * self.num_ranks
        with self.waiting():
            dist.all_gather_object(out, obj)
        return out

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj`, on every rank."""
        box = [obj]
        with self.waiting():
            dist.broadcast_object_list(box, src=0)
        return box[0]

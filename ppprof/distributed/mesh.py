"""The 2-D device mesh of a job, pipeline stages by TP ranks, each rank placed as ppprof.distributed.coords says.
Built with torch's init_device_mesh; its `pp` groups carry the activations between stages (TP rank t of a stage to
TP rank t of the next), its `tp` groups the all-reduces inside a stage (TPGroup, the handle the layers of
ppprof.model take)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ppprof.distributed.coords import MeshCoords, mesh_problem
from ppprof.distributed.rankstate import EVERY_RANK
from ppprof.distributed.watchdog import Watchdog


class TPGroup:
    """The TP group of this rank's stage: the collectives its layers run (ppprof.model.tp.TPComm), each a wait under
    the watchdog's deadline (a TP rank that stops ends the run, not a hang)."""

    def __init__(self, group, size: int, rank: int, watchdog: Watchdog | None = None) -> None:
        self.group, self.size, self.rank, self.watchdog = group, size, rank, watchdog

    def _waiting(self) -> AbstractContextManager:
        return self.watchdog.waiting(EVERY_RANK) if self.watchdog is not None else nullcontext()

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        with self._waiting():
            dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        parts = [torch.empty_like(x) for _ in range(self.size)]
        with self._waiting():
            dist.all_gather(parts, x.contiguous(), group=self.group)
        return torch.cat(parts, dim=0)

    def slowest(self, value: float) -> float:
        """The largest `value` over the TP ranks (a stage's latency: its slowest TP rank)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self._device())
        with self._waiting():
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return float(t.item())

    def barrier(self) -> None:
        """Every TP rank of the stage reaches this point before any goes on (the start of a timed forward)."""
        if self.size == 1:
            return
        t = torch.zeros(1, device=self._device())
        with self._waiting():
            dist.all_reduce(t, group=self.group)
            t.item()

    def _device(self) -> torch.device:
        return (
            torch.device("cuda", torch.cuda.current_device())
            if dist.get_backend(self.group) == "nccl"
            else torch.device("cpu")
        )


@dataclass(slots=True)
class Mesh:
    """The job's mesh: this rank's coordinates, the torch DeviceMesh, this rank's pp group (its TP index across the
    stages) and its stage's TP group."""

    coords: MeshCoords
    device_mesh: object
    pp_group: object
    tp: TPGroup


def build_mesh(device_type: str, world_size: int, rank: int, tp_size: int, watchdog: Watchdog | None = None) -> Mesh:
    """The (pp, tp) mesh over the job's ranks (every rank calls it: creating the groups is collective)."""
    from torch.distributed.device_mesh import init_device_mesh

    problem = mesh_problem(world_size, tp_size, None, None)
    if problem:
        raise ValueError(problem)
    pp_size = world_size // tp_size
    device_mesh = init_device_mesh(device_type, (pp_size, tp_size), mesh_dim_names=("pp", "tp"))
    coords = MeshCoords(pp_size, tp_size, rank)
    tp = TPGroup(device_mesh.get_group("tp"), tp_size, coords.tp_rank, watchdog)
    return Mesh(coords, device_mesh, device_mesh.get_group("pp"), tp)

"""The (pp, tp) mesh as plain rank arithmetic: rank = stage * tp_size + tp_rank, so that the TP ranks of a stage are
adjacent (on one node, as servers place them), and whether a job's ranks form such a mesh at all. Pure: no torch;
the launcher checks a job with it before any rank starts, and every rank places itself with it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MeshCoords:
    """Where a rank sits in the (pp, tp) mesh. Pure arithmetic; every rank computes every rank's place alike."""

    pp_size: int
    tp_size: int
    rank: int

    @property
    def stage(self) -> int:
        return self.rank // self.tp_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    def global_rank(self, stage: int, tp_rank: int | None = None) -> int:
        """The rank of TP rank `tp_rank` (default: this rank's) of `stage`."""
        return stage * self.tp_size + (self.tp_rank if tp_rank is None else tp_rank)


def mesh_problem(world_size: int, tp_size: int, pp_size: int | None, local_world_size: int | None) -> str | None:
    """Why a job of `world_size` ranks (`local_world_size` a node) cannot run as a pp_size x tp_size mesh, or None."""
    if world_size % tp_size:
        return (
            f"--tp-size {tp_size} does not divide the {world_size} ranks of the job (nnodes x nproc-per-node): "
            f"start a multiple of {tp_size} ranks, e.g. --nproc-per-node {tp_size * max(1, world_size // tp_size)}"
        )
    if pp_size is not None and pp_size * tp_size != world_size:
        return (
            f"--pp-size {pp_size} x --tp-size {tp_size} = {pp_size * tp_size} ranks but the job has {world_size} "
            f"(nnodes x nproc-per-node): set --nproc-per-node so that the job has {pp_size * tp_size} ranks"
        )
    if local_world_size is not None and tp_size > 1 and local_world_size % tp_size:
        return (
            f"--tp-size {tp_size} would span nodes: a node's {local_world_size} ranks must hold whole TP groups "
            f"(the TP ranks of a stage on one node); use --nproc-per-node a multiple of {tp_size}"
        )
    return None

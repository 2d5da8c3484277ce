"""This rank's place in the process group: join it on the right device and backend (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

import datetime as _dt
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ppprof.distributed.board import launcher_store
from ppprof.distributed.mesh import Mesh, build_mesh
from ppprof.distributed.parent import die_with_parent
from ppprof.distributed.rankstate import EVERY_RANK
from ppprof.distributed.watchdog import DEFAULT_TIMEOUT_S, Watchdog

JOIN_PHASE = "join the process group"
"""The watchdog's phase from the rank's start until its job names the first phase of its own."""
DIST_TIMEOUT_S = 600
"""How long gloo / NCCL let a collective wait (PPPROF_DIST_TIMEOUT overrides it): a backstop behind the watchdog."""


@dataclass(frozen=True, slots=True)
class RankInfo:
    """Who this rank is and what it runs on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    watchdog: Watchdog | None = None
    """Deadlines on this rank's waits, its signals and its parent (ppprof.distributed.watchdog)."""
    mesh: Mesh | None = None
    """The job's (pp, tp) mesh (ppprof.distributed.mesh): this rank's stage and TP rank, and their groups."""


@contextmanager
def process_group(device_type: str, timeout_s: float = DEFAULT_TIMEOUT_S, tp_size: int = 1) -> Iterator[RankInfo]:
    """Join the group that torchrun (or the elastic launcher) described in the environment, as a (world / tp_size,
    tp_size) mesh; leave it on exit. The rank dies with its launcher, and its watchdog (deadlines from `timeout_s`,
    SIGINT/SIGTERM) runs from the start."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    die_with_parent()
    watchdog = Watchdog(rank, world_size, timeout_s).start()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = _dt.timedelta(seconds=int(os.environ.get("PPPROF_DIST_TIMEOUT", DIST_TIMEOUT_S)))
    # The heartbeat runs before the group forms, so that a rank stopped while it starts is told from a slow one.
    store = launcher_store()
    if store is not None:
        watchdog.attach(store)
    watchdog.phase = JOIN_PHASE
    with watchdog.waiting(EVERY_RANK):  # joining waits for every rank
        dist.init_process_group(backend, timeout=timeout)
    with watchdog.waiting(EVERY_RANK):  # creating the mesh's groups is collective
        mesh = build_mesh(device_type, world_size, rank, tp_size, watchdog)
    try:
        yield RankInfo(rank, world_size, local_rank, device, backend, watchdog, mesh)
    finally:
        watchdog.close()
        dist.destroy_process_group()

"""This rank's place in the process group: join it on the right device and backend (gloo on CPU, NCCL on CUDA)."""

from __future__ import annotations

import datetime as _dt
import os
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 600
"""How long a collective may wait (PPPROF_DIST_TIMEOUT overrides it, e.g. in tests)."""


@dataclass(frozen=True, slots=True)
class RankInfo:
    """Who this rank is and what it runs on."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str


@contextmanager
def process_group(device_type: str) -> Iterator[RankInfo]:
    """Join the group that torchrun (or the elastic launcher) described in the environment; leave it on exit."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device_type == "cuda":
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    timeout = _dt.timedelta(seconds=int(os.environ.get("PPPROF_DIST_TIMEOUT", DEFAULT_TIMEOUT_S)))
    dist.init_process_group(backend, timeout=timeout)
    try:
        yield RankInfo(rank, world_size, local_rank, device, backend)
    finally:
        dist.destroy_process_group()

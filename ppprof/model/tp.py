"""What a tensor-parallel layer needs besides its shapes (ppprof.specs.tp): the TP group as a small handle (the
collectives come from ppprof.distributed, which builds it; this package never imports torch.distributed), and the
sharding of a parameter drawn at its full shape, so that the TP ranks' shards of one seed's weights together are
exactly the TP = 1 weights.

A sharded parameter carries its full shape and how to cut its shard from a full tensor (`tp_full_shape`,
`tp_take`), as Megatron tags its parameters: the init draws the full tensor from the generator (the same draws as
TP = 1, whatever the TP degree) and keeps the rank's shard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import torch

from ppprof.specs.tp import Shard


class TPComm(Protocol):
    """The TP group of a stage, as its layers use it."""

    size: int
    rank: int

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum of x over the TP ranks, in place; returns x."""

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """x of every TP rank, concatenated along dim 0 in rank order."""


class NoTP:
    """TP = 1: every collective is the identity."""

    size = 1
    rank = 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        return x


NO_TP = NoTP()

Segment = tuple[Shard, int]
"""A run of a sharded dimension: its shard (in heads, groups or channels) and the width of one unit (head_dim for
heads, d_state for groups, 1 for channels). A fused projection's dimension is a concatenation of segments."""


def take_segments(full: torch.Tensor, segments: Sequence[Segment], dim: int) -> torch.Tensor:
    """The rank's rows (dim 0) or columns (dim 1, ...) of `full`, whose `dim` is the segments one after another:
    each segment's shard, concatenated in order."""
    parts, offset = [], 0
    for shard, unit in segments:
        parts.append(full.narrow(dim, offset + shard.start * unit, shard.size * unit))
        offset += shard.full * unit
    if offset != full.shape[dim]:
        raise ValueError(f"segments cover {offset} of dimension {dim} of a {tuple(full.shape)} tensor")
    return torch.cat(parts, dim=dim)


def take_padded_rows(full: torch.Tensor, shard: Shard) -> torch.Tensor:
    """Rows [shard.start, shard.stop) of `full`, zero rows past its end (the last vocab shard's padding)."""
    out = full.new_zeros((shard.size, *full.shape[1:]))
    rows = max(0, min(shard.stop, full.shape[0]) - shard.start)
    out[:rows] = full[shard.start : shard.start + rows]
    return out


def mark_sharded(p: torch.Tensor, full_shape: Sequence[int], take: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Tag parameter `p` as the shard `take(full)` of a tensor of `full_shape`."""
    p.tp_full_shape = tuple(full_shape)
    p.tp_take = take


def mark_segments(p: torch.Tensor, segments: Sequence[Segment], dim: int) -> None:
    """Tag `p` as sharded along `dim` by `segments` (its other dimensions whole); nothing where every segment is
    whole (TP = 1)."""
    if all(s.size == s.full for s, _ in segments):
        return
    shape = list(p.shape)
    shape[dim] = sum(s.full * unit for s, unit in segments)
    mark_sharded(p, shape, lambda full: take_segments(full, segments, dim))


def full_shape(p: torch.Tensor) -> tuple[int, ...]:
    """The shape of the tensor `p` is a shard of (its own where it is not sharded)."""
    return getattr(p, "tp_full_shape", tuple(p.shape))


@torch.no_grad()
def assign(p: torch.Tensor, full: torch.Tensor) -> None:
    """p <- its shard of `full` (a tensor of full_shape(p), on the host), in p's dtype and device."""
    take = getattr(p, "tp_take", None)
    p.copy_((full if take is None else take(full)).to(p.dtype))


def vocab_embed(weight: torch.Tensor, ids: torch.Tensor, shard: Shard, tp: TPComm) -> torch.Tensor:
    """Vocab-parallel embedding lookup: each rank looks up the ids of its rows, zeros for the others, then the sum
    over the TP ranks. weight: (shard.size, hidden); ids: (n,) -> (n, hidden)."""
    if tp.size == 1:
        return torch.nn.functional.embedding(ids, weight)
    mine = (ids >= shard.start) & (ids < shard.stop)  # (n,)
    local = torch.where(mine, ids - shard.start, torch.zeros_like(ids))
    out = torch.nn.functional.embedding(local, weight) * mine[:, None].to(weight.dtype)  # (n, hidden)
    return tp.all_reduce(out)

"""A forward on the meta device, measured: the bytes of the tensors it creates that are alive at once (their peak),
the answers to the few ops whose result depends on values (which a memory bound takes at their worst), and the
collectives of the stage's TP group and pipe as a recorder that implements their protocol (ppprof.model.tp.TPComm)
and moves no data. The dry run (ppprof.run.dry_run) is its one user."""

from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

ALL_REDUCE = "all_reduce"
ALL_GATHER = "all_gather"
SEND = "send"
"""The kinds of collective a dry run records: the TP group's two and the send to the next stage."""


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective of a forward: its kind and the bytes of its result on one rank (an all-reduce's tensor, an
    all-gather's gathered tensor, a send's message)."""

    kind: str
    nbytes: int


class RecordingTP:
    """The TP group of a stage (ppprof.model.tp.TPComm) for a forward on meta tensors: each collective is recorded
    with its bytes and returns a result of the shape the real one has (the all-reduce its input, in place; the
    all-gather the TP ranks' inputs concatenated along dim 0)."""

    def __init__(self, size: int, rank: int) -> None:
        self.size, self.rank = size, rank
        self.calls: list[Collective] = []

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        if self.size > 1:
            self.calls.append(Collective(ALL_REDUCE, x.nbytes))
        return x

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        if self.size == 1:
            return x
        out = x.new_empty((self.size * x.shape[0], *x.shape[1:]))
        self.calls.append(Collective(ALL_GATHER, out.nbytes))
        return out


def sliced(num_values: int, tp_size: int) -> bool:
    """Whether a stage boundary carries a tensor of `num_values` values in 1/tp slices, as servers send it (vLLM's
    and SGLang's send_tensor_dict with an all-gather group): TP > 1 and tp divides it; else whole."""
    return tp_size > 1 and num_values % tp_size == 0


def record_send(calls: list[Collective], hidden: torch.Tensor, residual: torch.Tensor, tp_size: int) -> None:
    """What a TP rank sends the next stage for one chunk: its header (status, chunk size: two int64), then its 1/tp
    slice of the hidden state and of the residual stream (each whole where tp does not divide it)."""
    header_bytes = 2 * torch.empty((), dtype=torch.int64).element_size()
    parts = tp_size if sliced(hidden.numel(), tp_size) else 1
    calls.append(Collective(SEND, header_bytes + (hidden.nbytes + residual.nbytes) // parts))


def record_receive(calls: list[Collective], x: torch.Tensor, tp_size: int) -> None:
    """What a stage's TP ranks do with the slices they receive: all-gather the hidden state and the residual
    stream, each of x's shape (the chunk's (n, hidden))."""
    if sliced(x.numel(), tp_size):
        calls += [Collective(ALL_GATHER, x.nbytes)] * 2


def summarize(calls: list[Collective]) -> dict[str, dict[str, int]]:
    """{kind: {"count": n, "bytes": total}} in the order the kinds first occur."""
    counts, totals = Counter(), Counter()
    for c in calls:
        counts[c.kind] += 1
        totals[c.kind] += c.nbytes
    return {kind: {"count": counts[kind], "bytes": totals[kind]} for kind in counts}


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of every tensor storage created under it while the storage lives, and their peak: a forward's
    activations (what existed before, the weights and pools, is not counted). On meta tensors nothing is allocated;
    the counts are what the same ops would allocate on a device that frees a tensor when it dies.

    bincount (the MoE's tokens per expert: ppprof.model.mlp.MoE) is answered at the worst case a memory bound takes,
    as ppprof.specs.activation counts it: each of the first top_k experts on every token. The answer is a host
    tensor, so the caller's .tolist() reads it."""

    def __init__(self, top_k: int = 1) -> None:
        super().__init__()
        self.top_k = max(1, top_k)
        self.live = 0
        self.peak = 0
        self._seen: weakref.WeakSet = weakref.WeakSet()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.ops.aten.bincount.default:
            minlength = kwargs.get("minlength", args[2] if len(args) > 2 else 0)  # (self, weights, minlength)
            return worst_bincount(args[0], minlength, self.top_k)
        for t in tree_leaves((args, kwargs)):  # what an op reads or writes in place (a pool, a weight) is not new
            if isinstance(t, torch.Tensor):
                self._seen.add(t.untyped_storage())
        out = func(*args, **kwargs)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._track(t.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        if storage in self._seen:
            return
        self._seen.add(storage)
        nbytes = storage.nbytes()
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, nbytes)

    def _free(self, nbytes: int) -> None:
        self.live -= nbytes


def worst_bincount(experts: torch.Tensor, minlength: int, top_k: int) -> torch.Tensor:
    """experts: (n * top_k,) each token's top_k choices -> counts (max(minlength, top_k),) int64 on the host: n for
    each of the first top_k experts, 0 for the rest."""
    counts = torch.zeros(max(minlength, top_k), dtype=torch.int64)
    counts[:top_k] = experts.numel() // top_k
    return counts

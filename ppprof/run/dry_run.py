"""`ppprof profile --dry-run`: every rank's stage of the (pp, tp) mesh built at its real size on the meta device (no
values, no memory), its pools sized as the profile sizes them, and the largest probe request run at the deepest prefix
through every layer: per rank its parameters, weight and pool bytes, the forward's activation peak and collectives,
beside the analytic counts of ppprof.specs (what `ppprof model --memory` prints). No rank is started."""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import torch

from ppprof.config import ProfileConfig
from ppprof.mem.cache import Request
from ppprof.model.stage import Stage, build_stage_cache
from ppprof.model.tp import full_shape
from ppprof.run.meta_forward import LiveBytes, RecordingTP, record_receive, record_send, summarize
from ppprof.specs import ModelSpec, load_spec, split_layers
from ppprof.specs.accounting import stage_params
from ppprof.specs.dtypes import AUTO_DTYPE_CPU, AUTO_DTYPE_GPU, normalize_dtype
from ppprof.specs.memory import PeakRequest, StageMemory, stage_memory
from ppprof.specs.tp import Shard, check_tp, rank_shapes, rank_spec

TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
META = "meta"


@dataclass(frozen=True, slots=True, kw_only=True)
class RankRun:
    """What one rank of the mesh holds and does in one forward of the largest probe request, measured on meta
    tensors, and the analytic counts of the same (`estimate`, `estimate_params`)."""

    rank: int
    stage_idx: int
    tp_rank: int
    layers: range
    built_as: int
    """The rank whose build this rank's figures are (itself, or a TP rank of its stage with the same shapes)."""
    num_params: int
    num_full_params: int
    """The parameters of the tensors this rank's are shards of, each whole (ppprof.model.tp.full_shape): the stage
    at TP = 1 (the last vocab shard's padding included)."""
    weights: int
    kv_pool: int
    kv_kind: str
    """"KV" (attention's K and V), "latent" (MLA's) or "-" (no such layer on the stage)."""
    mamba_pool: int
    request_table: int
    activation_peak: int
    """The peak of the bytes the forward's tensors hold at once (its input and output included)."""
    collectives: dict
    """{kind: {"count", "bytes"}} of the forward: the all-gathers of what the previous stage sent, the TP group's
    all-reduces and all-gathers, and the send down."""
    estimate: StageMemory
    estimate_params: int
    tp_size: int
    """The TP ranks of its stage."""

    @property
    def own_params(self) -> float:
        """The rank's share of the model as the layout divides it: its stage's parameters over its TP ranks. Summed
        over the ranks: the model's parameters, each once. num_params less this is what TP replicates (norms, routers,
        MLA's latent projections, KV heads where there are fewer than TP ranks)."""
        return self.num_full_params / self.tp_size

    @property
    def prefix_noise(self) -> int:
        """The probe's synthetic prefix block, which a probe holds beside its forward (ppprof.specs.activation)."""
        return self.estimate.activation_terms.get("prefix_noise", 0)

    @property
    def total(self) -> int:
        """What the rank holds during its largest probe: weights, pools, request table, the forward's peak and the
        synthetic prefix."""
        return (
            self.weights
            + self.kv_pool
            + self.mamba_pool
            + self.request_table
            + self.activation_peak
            + self.prefix_noise
        )

    def to_dict(self) -> dict:
        return {
            "rank": self.rank,
            "stage_idx": self.stage_idx,
            "tp_rank": self.tp_rank,
            "layer_start": self.layers.start,
            "layer_stop": self.layers.stop,
            "built_as": self.built_as,
            "num_params": self.num_params,
            "num_full_params": self.num_full_params,
            "weights": self.weights,
            "kv_pool": self.kv_pool,
            "kv_kind": self.kv_kind,
            "mamba_pool": self.mamba_pool,
            "request_table": self.request_table,
            "activation_peak": self.activation_peak,
            "prefix_noise": self.prefix_noise,
            "total": self.total,
            "collectives": self.collectives,
            "estimate": {"num_params": self.estimate_params, **self.estimate.to_dict()},
        }


@dataclass(frozen=True, slots=True)
class DryRun:
    """The dry run of one layout: the model, its ranks in rank order, and its wall time."""

    spec: ModelSpec
    pp_size: int
    tp_size: int
    ranks: list[RankRun]
    seconds: float


def dry_run_dtype(cfg: ProfileConfig, spec: ModelSpec) -> str:
    """The dtype the profile would run in (as ppprof.run.rank resolves it): --dtype, the spec's, else bf16 on CUDA
    and fp32 on CPU."""
    return (
        normalize_dtype(cfg.model.dtype)
        or spec.dtype
        or (AUTO_DTYPE_GPU if cfg.job.device == "cuda" else AUTO_DTYPE_CPU)
    )


def dry_run(cfg: ProfileConfig, spec: ModelSpec | None = None, nnodes: int = 1) -> DryRun:
    """Every rank of cfg's mesh built on meta tensors and run once at the largest probe request (see the module).
    TP ranks of a stage whose shards have the same sizes share one build (their shapes are the same). `nnodes`:
    torchrun's, for a mesh over several nodes without --pp-size."""
    start = time.perf_counter()
    spec = spec or load_spec(cfg.model.model, num_layers=cfg.model.num_layers, dtype=cfg.model.dtype)
    tp_size = cfg.parallelism.tp_size
    check_tp(spec, tp_size)
    pp_size = cfg.parallelism.pp_size or cfg.parallelism.nproc_per_node * nnodes // tp_size
    ranks = []
    for stage_idx, layers in enumerate(split_layers(spec.num_layers, pp_size, cfg.parallelism.layer_partition)):
        estimate = stage_estimate(cfg, rank_spec(spec, tp_size), layers, stage_idx)
        built: dict[tuple, RankRun] = {}
        for tp_rank in range(tp_size):
            rank = stage_idx * tp_size + tp_rank
            key = shard_sizes(spec, tp_size, tp_rank)
            if key not in built:
                built[key] = run_rank(cfg, spec, layers, stage_idx, tp_rank, rank, estimate)
            ranks.append(_as_rank(built[key], rank, tp_rank))
    return DryRun(spec, pp_size, tp_size, ranks, time.perf_counter() - start)


def shard_sizes(spec: ModelSpec, tp_size: int, tp_rank: int) -> tuple:
    """The sizes of every shard TP rank `tp_rank` holds: ranks with the same sizes have the same shapes."""
    s = rank_shapes(spec, tp_size, tp_rank)
    return tuple(getattr(s, f.name).size for f in dataclasses.fields(s) if isinstance(getattr(s, f.name), Shard))


def _as_rank(run: RankRun, rank: int, tp_rank: int) -> RankRun:
    if run.rank == rank:
        return run
    fields = {f: getattr(run, f) for f in RankRun.__slots__}
    return RankRun(**{**fields, "rank": rank, "tp_rank": tp_rank})


def stage_estimate(cfg: ProfileConfig, spec: ModelSpec, layers: range, stage_idx: int) -> StageMemory:
    """The analytic counts of the stage as one TP rank holds it (`spec` its rank_spec), with the kernels the meta
    forward runs (the host's: torch picks the kernels by the tensors' device, and meta is not CUDA)."""
    request = PeakRequest(
        chunk_size=cfg.max_probe_chunk_size,
        prefix_len=max(cfg.resolved_prefix_lens(), default=0),
        dtype=dry_run_dtype(cfg, spec),
        attention_backend=meta_backend(cfg),
        device="cpu",
    )
    return stage_memory(spec, layers, cfg.cache_sizes, request, stage_idx)


def meta_backend(cfg: ProfileConfig) -> str:
    """The attention backend the meta forward runs: `reference` where asked, else sdpa (flashinfer reads CUDA
    pages, which meta tensors are not)."""
    return "reference" if cfg.job.attention_backend == "reference" else "sdpa"


def run_rank(
    cfg: ProfileConfig, spec: ModelSpec, layers: range, stage_idx: int, tp_rank: int, rank: int, estimate: StageMemory
) -> RankRun:
    """Build the rank's stage and cache on meta tensors, admit one request, extend it by the deepest prefix and the
    largest chunk, run the chunk through every layer under LiveBytes. (The cache is dropped after: its slot table
    holds no values to release the slots by.)"""
    dtype = TORCH_DTYPES[dry_run_dtype(cfg, spec)]
    tp = RecordingTP(cfg.parallelism.tp_size, tp_rank)
    stage = Stage(spec, layers, dtype=dtype, device=META, attention_backend=meta_backend(cfg), tp=tp)
    cache = build_stage_cache(spec, layers, cfg.cache_sizes, dtype=dtype, device=META, tp_size=tp.size, tp_rank=tp_rank)
    n, prefix_len = estimate.chunk_size, estimate.prefix_len
    req = Request(rid=0)
    if not cache.admit(req) or cache.extend(req, prefix_len + n) is None:
        raise ValueError(f"stage {stage_idx}: the pools cannot hold one request of {prefix_len + n} tokens")
    with LiveBytes(spec.num_experts_per_tok) as live:
        if stage.is_first:
            x, residual = torch.zeros(n, dtype=torch.int64, device=META), None
        else:
            x = torch.empty((n, spec.hidden_size), dtype=dtype, device=META)
            residual = torch.empty_like(x)
            record_receive(tp.calls, x, tp.size)
        out = stage.forward(cache, req, x, residual, prefix_len)
    if not stage.is_last:
        record_send(tp.calls, *out, tp.size)
    kv_kind = "-" if cache.kv_pool is None else "latent" if hasattr(cache.kv_pool, "latent") else "KV"
    return RankRun(
        rank=rank,
        stage_idx=stage_idx,
        tp_rank=tp_rank,
        layers=layers,
        built_as=rank,
        num_params=sum(p.numel() for p in stage.parameters()),
        num_full_params=sum(math.prod(full_shape(p)) for p in stage.parameters()),
        weights=sum(p.numel() * p.element_size() for p in stage.parameters()),
        kv_pool=cache.kv_pool.nbytes() if cache.kv_pool is not None else 0,
        kv_kind=kv_kind,
        mamba_pool=cache.mamba_pool.nbytes() if cache.mamba_pool is not None else 0,
        request_table=cache.req_pool.req_to_token.numel() * cache.req_pool.req_to_token.element_size(),
        activation_peak=live.peak,
        collectives=summarize(tp.calls),
        estimate=estimate,
        estimate_params=stage_params(rank_spec(spec, tp.size, tp_rank), layers)["total"],
        tp_size=tp.size,
    )

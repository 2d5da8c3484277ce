"""The memory check before launch: what each stage of a profile needs (ppprof.specs.memory) against this node's
memory (each GPU's total on CUDA, the host's MemAvailable on CPU), with the fix named when it does not fit; and the same
figures for `ppprof model --memory`."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from ppprof.config import ProfileConfig
from ppprof.specs import ModelSpec, load_spec, split_layers
from ppprof.specs.memory import PeakRequest, StageMemory, format_bytes, stage_memory
from ppprof.specs.tp import rank_spec

MEMINFO = Path("/proc/meminfo")


MEMORY_PARTS = (
    ("weights", "weights"),
    ("kv_pool", "KV"),
    ("mamba_pool", "Mamba"),
    ("request_table", "requests"),
    ("activation_peak", "activations"),
)
"""StageMemory's parts, in the order and the words of the messages."""


MORE_STAGES = "use more stages (--nproc-per-node)"


def profile_memory(cfg: ProfileConfig, pp_size: int, spec: ModelSpec | None = None) -> list[StageMemory]:
    """What each stage of the profile needs (ppprof.specs.memory): pools as configured, activations of its largest
    probe request, the largest probe chunk after the longest prefix."""
    spec = spec or load_spec(cfg.model.model, num_layers=cfg.model.num_layers, dtype=cfg.model.dtype)
    request = PeakRequest(
        chunk_size=cfg.max_probe_chunk_size,
        prefix_len=max(cfg.resolved_prefix_lens(), default=0),
        dtype=cfg.model.dtype,
        attention_backend=cfg.job.attention_backend,
        device=cfg.job.device,
    )
    return [
        stage_memory(spec, layers, cfg.cache_sizes, request, i)
        for i, layers in enumerate(split_layers(spec.num_layers, pp_size, cfg.parallelism.layer_partition))
    ]


def rank_memory(cfg: ProfileConfig, world_size: int, spec: ModelSpec | None = None) -> list[StageMemory]:
    """What each rank of the profile's (pp, tp) mesh needs, by global rank: its stage as one TP rank holds it
    (ppprof.specs.tp.rank_spec), the same for every TP rank of a stage (profile_memory at TP = 1)."""
    spec = spec or load_spec(cfg.model.model, num_layers=cfg.model.num_layers, dtype=cfg.model.dtype)
    tp = cfg.parallelism.tp_size
    return [m for m in profile_memory(cfg, world_size // tp, rank_spec(spec, tp)) for _ in range(tp)]


def host_available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable of this host in bytes; None where /proc/meminfo cannot be read (not Linux)."""
    try:
        for line in meminfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "MemAvailable":
                return int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def gpu_total_bytes(count: int) -> list[int] | None:
    """total_memory of local GPUs 0..count-1 (local rank i runs on cuda:i); None where CUDA is not available."""
    import torch  # only here: a CPU run should not wait for CUDA

    if not torch.cuda.is_available():
        return None
    return [torch.cuda.get_device_properties(i).total_memory for i in range(min(count, torch.cuda.device_count()))]


def node_stages(world_size: int, local_ranks: int, torchrun: dict | None) -> range | None:
    """The stages (global ranks) of this node: from the rank's environment under torchrun, else from --node-rank
    with static rendezvous (ranks follow node ranks); None where it cannot be told (a c10d rendezvous orders
    nodes as they arrive)."""
    torchrun = torchrun or {}
    if "LOCAL_RANK" in os.environ and "RANK" in os.environ:
        start = int(os.environ["RANK"]) - int(os.environ["LOCAL_RANK"])
    elif world_size == local_ranks:
        start = 0
    elif torchrun.get("rdzv_backend") in (None, "static"):
        start = int(torchrun.get("node_rank") or 0) * local_ranks
    else:
        return None
    return range(start, min(start + local_ranks, world_size))


def stage_summary(m: StageMemory) -> str:
    """'weights 12.1 GiB, KV 40.0 GiB, ..., activations 38.2 GiB at chunk 10240 after 65536 tokens' (no zero parts),
    and the init draws where they make the peak."""
    parts = [f"{word} {format_bytes(getattr(m, key))}" for key, word in MEMORY_PARTS if getattr(m, key)]
    out = ", ".join(parts) + f" at chunk {m.chunk_size} after {m.prefix_len} tokens"
    if m.weights + m.weights_init > m.running:
        out += f"; drawing the weights takes {format_bytes(m.weights_init)} more at start"
    return out


def memory_fixes(cfg: ProfileConfig, m: StageMemory) -> str:
    """What lowers the parts that weigh most (each of at least a tenth of the total), as one phrase. Where the
    stages share a host (CPU), more stages do not shrink the weights and pools they hold together: fewer layers,
    a smaller dtype or more hosts do."""
    if cfg.job.device == "cuda":
        smaller_stages = [MORE_STAGES]
    else:
        smaller_stages = (
            ["keep fewer layers (--num-layers)"]
            + (["use --dtype bfloat16"] if m.dtype == "float32" else [])
            + ["spread the stages over more hosts"]
        )
    fixes = []
    for key, _ in sorted(MEMORY_PARTS, key=lambda kw: -getattr(m, kw[0])):
        if getattr(m, key) < m.total / 10:
            continue
        if key == "activation_peak":
            fixes.append("lower --base-chunk-size")
            if "attention" in m.activation_terms:
                fixes += (["use --attention-backend sdpa"] if m.attention_backend == "reference" else []) + [
                    "fewer/shorter --prefix-lens"
                ]
        elif key == "kv_pool":
            if cfg.pools.max_total_tokens > cfg.needed_total_tokens():
                fixes.append(f"lower --max-total-tokens (the probes need {cfg.needed_total_tokens()})")
            fixes += ["fewer/shorter --prefix-lens", *smaller_stages]
        elif key == "request_table":
            fixes.append("lower --max-running-requests or --context-len")
        else:
            fixes += (["lower --max-mamba-cache-size"] if key == "mamba_pool" else []) + smaller_stages
    if m.weights + m.weights_init > m.running:  # the draws of the largest tensor (embedding, LM head, experts)
        fixes.append("spread the stages over more hosts")
    fixes = list(dict.fromkeys(fixes))
    return fixes[0] if len(fixes) == 1 else ", ".join(fixes[:-1]) + ", or " + fixes[-1]


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryVerdict:
    """Whether this node's stages fit in its memory, and against what."""

    limit: str
    """The limit this node's stages are checked against, in words."""
    checked: bool
    """False where it cannot be told here (no GPU visible, no /proc/meminfo)."""
    problem: str | None = None
    """One line when they do not fit: the stage, the estimate, the limit and the fix."""


def memory_verdict(
    cfg: ProfileConfig, stages: list[StageMemory], local_ranks: int, local: range | None
) -> MemoryVerdict:
    """Whether the stages of this node (`local`; None where unknown) fit: on CUDA each against its GPU's total
    memory, on CPU together against the host's MemAvailable."""
    mine = [stages[i] for i in local] if local is not None else []
    if cfg.job.device == "cuda":
        return gpu_verdict(cfg, mine or [max(stages, key=lambda s: s.total)] * local_ranks, local_ranks)
    return host_verdict(cfg, mine, max(mine or stages, key=lambda s: s.total), local_ranks)


def gpu_verdict(cfg: ProfileConfig, mine: list[StageMemory], local_ranks: int) -> MemoryVerdict:
    """Local stage j against the total memory of cuda:j (the largest stage against each where the node's stages are
    unknown; against GPUs alike where this machine has fewer than stages, as `ppprof model --memory` may)."""
    limits = gpu_total_bytes(local_ranks)
    if not limits:
        return MemoryVerdict("no CUDA device visible here: each stage must fit in its GPU's memory", checked=False)
    limit_text = f"GPU memory {', '.join(format_bytes(b) for b in limits)} (cuda:0..{len(limits) - 1})"
    for j, m in enumerate(mine):
        limit = limits[min(j, len(limits) - 1)]
        if m.total > limit:
            return MemoryVerdict(
                limit_text,
                checked=True,
                problem=(
                    f"stage {m.stage_idx} needs ~{format_bytes(m.total)} ({stage_summary(m)}) but its GPU (cuda:{j}) "
                    f"has {format_bytes(limit)}: {memory_fixes(cfg, m)}"
                ),
            )
    return MemoryVerdict(limit_text, checked=True)


def host_verdict(cfg: ProfileConfig, mine: list[StageMemory], largest: StageMemory, local_ranks: int) -> MemoryVerdict:
    """This node's stages together (the largest x local ranks where they are unknown) against MemAvailable."""
    available = host_available_bytes()
    if available is None:
        return MemoryVerdict("host memory unknown here (no /proc/meminfo)", checked=False)
    limit_text = (
        f"{format_bytes(available)} available on this host (MemAvailable), shared by its {local_ranks} "
        f"stage{'s' * (local_ranks != 1)}"
    )
    if len(mine) == 1:
        need, who, detail = mine[0].total, f"stage {mine[0].stage_idx} needs", stage_summary(largest)
    else:
        need = sum(m.total for m in mine) if mine else largest.total * local_ranks
        who = (
            f"stages {mine[0].stage_idx}-{mine[-1].stage_idx} of this host need"
            if mine
            else f"the {local_ranks} stages of this host need up to"
        )
        detail = f"the largest, stage {largest.stage_idx}: {stage_summary(largest)}"
    if need <= available:
        return MemoryVerdict(limit_text, checked=True)
    return MemoryVerdict(
        limit_text,
        checked=True,
        problem=(
            f"{who} ~{format_bytes(need)} ({detail}) but this host has {format_bytes(available)} available "
            f"(MemAvailable): {memory_fixes(cfg, largest)}"
        ),
    )


def check_memory(
    cfg: ProfileConfig, world_size: int, local_ranks: int, torchrun: dict | None = None, spec: ModelSpec | None = None
) -> None:
    """ValueError, one line, when this node's stages do not fit in its memory (memory_verdict); nothing where it
    cannot be told (no GPU visible, no /proc/meminfo)."""
    ranks = rank_memory(cfg, world_size, spec)
    verdict = memory_verdict(cfg, ranks, local_ranks, node_stages(world_size, local_ranks, torchrun))
    if verdict.problem:
        raise ValueError(verdict.problem)


def memory_report(cfg: ProfileConfig) -> tuple[ModelSpec, list[StageMemory], MemoryVerdict]:
    """What `ppprof model --memory` shows: the model, what each of the profile's stages (all on this machine's limit,
    as if it were every node) needs on each of its TP ranks, and the verdict `ppprof profile` would reach."""
    spec = load_spec(cfg.model.model, num_layers=cfg.model.num_layers, dtype=cfg.model.dtype)
    world_size = (
        cfg.parallelism.nproc_per_node
    )  # flashinfer need not be installed here to estimate it (ppprof.specs.memory)
    stages = profile_memory(cfg, world_size // cfg.parallelism.tp_size, rank_spec(spec, cfg.parallelism.tp_size))
    return spec, stages, memory_verdict(cfg, rank_memory(cfg, world_size, spec), world_size, range(world_size))

"""What `ppprof profile --dry-run` prints and decides: the ranks' table (text or JSON), the analytic counts against
the meta build, and with --device-memory whether every rank fits, and if not the smallest (pp, tp) layout that does."""

from __future__ import annotations

import re

from ppprof.config import ProfileConfig
from ppprof.run.dry_run import DryRun, RankRun, dry_run_dtype, meta_backend, stage_estimate
from ppprof.run.memory_check import gpu_total_bytes
from ppprof.specs import ModelSpec, split_layers
from ppprof.specs.memory import format_bytes
from ppprof.specs.tp import rank_spec, tp_problem

UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})
SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
THIS_GPU = "cuda"
"""--device-memory cuda: the total memory of this machine's GPU 0, the device the profile would run on."""
SEARCHED_TP_SIZES = (1, 2, 4, 8, 16)
"""TP degrees the layout search tries (a node's GPUs, and SGLang's TP16 over two nodes)."""
COMPARED = (("num_params", "params"), ("weights", "weights"), ("kv_pool", "KV pool"), ("mamba_pool", "Mamba pool"))


def parse_device_memory(text: str) -> int:
    """'80GiB', '141 GB', '85899345920' (bytes) or 'cuda' (this machine's GPU) -> bytes; ValueError naming the flag."""
    if text.strip().lower() == THIS_GPU:
        totals = gpu_total_bytes(1)
        if not totals:
            raise ValueError("--device-memory cuda: no CUDA device visible here; give the device's memory, e.g. 80GiB")
        return totals[0]
    m = SIZE.match(text)
    unit = m and UNITS.get(m.group(2).lower())
    if not unit or float(m.group(1)) * unit < 1:
        raise ValueError(
            f"--device-memory {text!r} is not a memory size: give a number with a unit (B, KB, MB, GB, TB, KiB, "
            "MiB, GiB, TiB), e.g. 80GiB, or cuda for this machine's GPU"
        )
    return int(float(m.group(1)) * unit)


def deviation(run: RankRun, key: str) -> float:
    """The analytic count of `key` over the meta build's, less 1 (0 where both are 0)."""
    measured = getattr(run, key)
    counted = run.estimate_params if key == "num_params" else getattr(run.estimate, key)
    return counted / measured - 1 if measured else float(counted != 0)


def activation_deviation(run: RankRun) -> float:
    """The analytic activation peak (less the synthetic prefix, which the forward does not hold) over the meta
    forward's, less 1."""
    return (run.estimate.activation_peak - run.prefix_noise) / run.activation_peak - 1


def layout_need(cfg: ProfileConfig, spec: ModelSpec, pp_size: int, tp_size: int) -> int | None:
    """The largest rank's need at (pp_size, tp_size) by the analytic counts (as the dry run's estimate counts it);
    None where the layout cannot run the model (TP does not divide it, more stages than layers)."""
    if pp_size > spec.num_layers or tp_problem(spec, tp_size):
        return None
    per_rank = rank_spec(spec, tp_size)
    need = 0
    for i, layers in enumerate(split_layers(spec.num_layers, pp_size)):
        m = stage_estimate(cfg, per_rank, layers, i)
        need = max(need, m.weights + m.kv_pool + m.mamba_pool + m.request_table + m.activation_peak)
    return need


def smallest_layout(cfg: ProfileConfig, spec: ModelSpec, limit: int) -> tuple[int, int, int] | None:
    """(pp_size, tp_size, need) of the layout with the fewest GPUs (then the least TP) whose every rank fits in
    `limit`, over TP degrees SEARCHED_TP_SIZES and up to a stage a layer; None where none does."""
    layouts = sorted(
        ((pp, tp) for tp in SEARCHED_TP_SIZES for pp in range(1, spec.num_layers + 1)),
        key=lambda l: (l[0] * l[1], l[1]),
    )
    for pp, tp in layouts:
        need = layout_need(cfg, spec, pp, tp)
        if need is not None and need <= limit:
            return pp, tp, need
    return None


def refusal(run: DryRun, cfg: ProfileConfig, text: str, limit: int) -> str | None:
    """One line where a rank does not fit in `limit` (--device-memory `text`): the rank, its need, and the smallest
    layout that fits; None where every rank fits."""
    worst = max(run.ranks, key=lambda r: r.total)
    if worst.total <= limit:
        return None
    parts = ", ".join(
        f"{word} {format_bytes(n)}"
        for word, n in (
            ("weights", worst.weights),
            ("KV pool" if worst.kv_kind != "latent" else "latent pool", worst.kv_pool),
            ("Mamba pool", worst.mamba_pool),
            ("activations", worst.activation_peak),
        )
        if n
    )
    found = smallest_layout(cfg, run.spec, limit)
    fix = (
        f"the smallest layout that fits is --pp-size {found[0]} --tp-size {found[1]} ({found[0] * found[1]} GPUs, "
        f"largest rank ~{format_bytes(found[2])})"
        if found
        else f"no layout up to --pp-size {run.spec.num_layers} --tp-size {SEARCHED_TP_SIZES[-1]} fits: lower "
        "--max-total-tokens, --context-len or --base-chunk-size, or give a larger device"
    )
    return (
        f"--device-memory {text}: rank {worst.rank} (stage {worst.stage_idx}, TP rank {worst.tp_rank}) of "
        f"--pp-size {run.pp_size} --tp-size {run.tp_size} needs ~{format_bytes(worst.total)} ({parts}) but a device "
        f"has {format_bytes(limit)}; {fix}"
    )


def to_dict(run: DryRun, cfg: ProfileConfig, limit: int | None, problem: str | None) -> dict:
    """The dry run as one JSON object."""
    return {
        "model": cfg.model.model,
        "pp_size": run.pp_size,
        "tp_size": run.tp_size,
        "dtype": dry_run_dtype(cfg, run.spec),
        "attention_backend": meta_backend(cfg),
        "seconds": round(run.seconds, 3),
        "settings": cfg.to_dict(),
        "ranks": [r.to_dict() for r in run.ranks],
        "device_memory": limit,
        "fits": None if limit is None else problem is None,
        "problem": problem,
    }


def _collectives(r: RankRun) -> str:
    return ", ".join(f"{kind} {c['count']} x, {format_bytes(c['bytes'])}" for kind, c in r.collectives.items()) or "-"


def _row_key(r: RankRun) -> tuple:
    return (r.stage_idx, r.num_params, r.weights, r.kv_pool, r.mamba_pool, r.activation_peak, _collectives(r))


def format_dry_run(run: DryRun, cfg: ProfileConfig, limit: int | None, problem: str | None) -> str:
    """The text: a header, one row a stage's TP ranks alike (every rank checked), the analytic counts against the
    build, and the verdict against --device-memory."""
    first = run.ranks[0]
    lines = [
        f"dry run     {cfg.model.model} at PP{run.pp_size} x TP{run.tp_size}: {len(run.ranks)} ranks built on meta "
        f"tensors in {run.seconds:.1f} s, {dry_run_dtype(cfg, run.spec)}, attention {meta_backend(cfg)}",
        f"            one forward a rank: the largest probe request, chunk {first.estimate.chunk_size} after "
        f"{first.estimate.prefix_len} cached tokens, through all its layers",
        f"            pools: KV {cfg.pools.max_total_tokens} slots (page {cfg.pools.page_size}), "
        f"{cfg.pools.max_mamba_cache_size} Mamba slots, {cfg.pools.max_running_requests} requests x context "
        f"{cfg.probes.context_len}",
        "",
    ]
    header = ("ranks", "stage", "layers", "params", "weights", "KV pool", "Mamba pool", "requests", "activations")
    rows, groups = [], []
    for r in run.ranks:
        if groups and _row_key(groups[-1][-1]) == _row_key(r):
            groups[-1].append(r)
        else:
            groups.append([r])
    for g in groups:
        r = g[0]
        kv = format_bytes(r.kv_pool) + (" latent" if r.kv_kind == "latent" else "")
        ranks = str(r.rank) if len(g) == 1 else f"{r.rank}-{g[-1].rank}"
        rows.append(
            (ranks, str(r.stage_idx), f"{r.layers.start}-{r.layers.stop - 1}", f"{r.num_params / 1e9:.2f}G")
            + tuple(format_bytes(n) for n in (r.weights,))
            + (kv,)
            + tuple(format_bytes(n) for n in (r.mamba_pool, r.request_table, r.activation_peak))
            + (format_bytes(r.total), _collectives(r))
        )
    header += ("total", "collectives of one forward (count, bytes)")
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    for row in (header, *rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    lines.append("(a row: the TP ranks of a stage with the same figures; total adds the probe's synthetic prefix)")
    worst = {word: max((deviation(r, key) for r in run.ranks), key=abs) for key, word in COMPARED}
    worst["activations"] = max((activation_deviation(r) for r in run.ranks), key=abs)
    lines += [
        "",
        "estimate    ppprof's analytic counts (`ppprof model --memory`) against the build, the largest difference "
        "over the ranks: " + ", ".join(f"{word} {d:+.2%}" for word, d in worst.items()),
    ]
    if limit is not None:
        verdict = (
            "does not fit (the error line says which rank, and what fits)"
            if problem
            else f"fits (largest rank ~{format_bytes(max(r.total for r in run.ranks))})"
        )
        lines.append(f"limit       --device-memory {format_bytes(limit)}: {verdict}")
    return "\n".join(lines)

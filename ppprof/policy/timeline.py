"""The predicted pipeline timeline of chunk plans: per-stage start times and the PNG that draws them
(matplotlib, Agg, imported only when drawing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ppprof.plotting import pyplot, save_figure
from ppprof.policy.planners import Plan

MAX_DRAWN_STAGES = 16  # stage rows in a timeline PNG; beyond, the first 15 and the last are drawn


def start_times(latencies_ms, pp_size: int) -> np.ndarray:
    """Start times (num_chunks, pp_size): chunk i enters stage s when it left stage s-1 and chunk i-1 left s.

    Every stage takes the bottleneck latency t_i, so the last end is sum t + (P - 1) max t (the TTFT formula).
    One stage at a time: with T_i = t_0 + ... + t_{i-1}, start[i, s] = T_i + max over k <= i of
    (start[k, s-1] + t_k - T_k), a running maximum (stage 0: start[i, 0] = T_i).
    """
    t = np.asarray(latencies_ms, dtype=float)
    before = np.concatenate([[0.0], np.cumsum(t)[:-1]])  # T_i
    start = np.zeros((len(t), pp_size))
    start[:, 0] = before
    for s in range(1, pp_size):
        start[:, s] = before + np.maximum.accumulate(start[:, s - 1] + t - before)
    return start


def drawn_stages(pp_size: int) -> list[int]:
    """At most MAX_DRAWN_STAGES rows: all stages, or the first ones and the last."""
    if pp_size <= MAX_DRAWN_STAGES:
        return list(range(pp_size))
    return list(range(MAX_DRAWN_STAGES - 1)) + [pp_size - 1]


def draw_plan(ax, plan: Plan, pp_size: int, stages: list[int], cmap) -> None:
    """One plan's chunks as bars, one row per drawn stage."""
    start = start_times(plan.latencies_ms, pp_size)
    for row, s in enumerate(stages):
        bars = [(start[i, s], plan.latencies_ms[i]) for i in range(len(plan.latencies_ms))]
        ax.broken_barh(
            bars,
            (row - 0.4, 0.8),
            facecolors=[cmap(i % 20) for i in range(len(bars))],
            edgecolor="black",
            linewidth=0.2,
        )
    ax.set_yticks(range(len(stages)), [f"stage {s}" for s in stages])
    ax.invert_yaxis()
    ax.set_title(f"{plan.strategy}: {len(plan.chunk_sizes)} chunks, predicted TTFT {plan.ttft_ms:.1f} ms", fontsize=9)


def write_timeline(plans: list[Plan], pp_size: int, path: str | Path, title: str = "") -> Path:
    """Draw each plan's pipeline timeline (one panel a plan) into the PNG `path`, atomically."""
    plt = pyplot()
    stages = drawn_stages(pp_size)
    if len(stages) < pp_size:
        title += f"{'; ' if title else ''}stages {stages[-2] + 1}..{pp_size - 2} of {pp_size} not drawn"
    rows = len(stages)
    fig, axes = plt.subplots(
        len(plans), 1, figsize=(10, 1.0 + 0.9 * len(plans) + 0.25 * rows * len(plans)), squeeze=False, sharex=True
    )
    cmap = plt.get_cmap("tab20")
    for ax, plan in zip(axes[:, 0], plans):
        draw_plan(ax, plan, pp_size, stages, cmap)
    axes[-1, 0].set_xlabel("time (ms)")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return save_figure(fig, path, dpi=100)


def replay(stage_ms, transfer_ms=0.0) -> tuple[np.ndarray, np.ndarray]:
    """Measured per-stage chunk latencies composed through the pipeline recurrence.

    stage_ms: (P, n), stage s's latency for chunk k; transfer_ms: a scalar or (n,), the time to move chunk k's
    activations from one stage to the next. Stage s starts chunk k when it has finished chunk k-1 and chunk k has
    arrived from stage s-1:
        start[s][k] = max(finish[s][k-1], finish[s-1][k] + transfer[k]),  finish[s][k] = start[s][k] + t[s][k]
    (stage 0 starts chunk 0 at 0). Returns start and finish, both (P, n); the TTFT is finish[-1, -1].
    """
    t = np.asarray(stage_ms, dtype=float)
    pp_size, n = t.shape
    transfer = np.broadcast_to(np.asarray(transfer_ms, dtype=float), (n,))
    start, finish = np.zeros_like(t), np.zeros_like(t)
    for s in range(pp_size):
        for k in range(n):
            ready = finish[s, k - 1] if k else 0.0
            arrived = finish[s - 1, k] + transfer[k] if s else 0.0
            start[s, k] = max(ready, arrived)
            finish[s, k] = start[s, k] + t[s, k]
    return start, finish

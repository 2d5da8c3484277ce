"""serve-bench's plots: throughput and mean TTFT against the load level, one line an arm (`serving.png`), and the TTFT
distribution of every arm at the heaviest level (`serving-ttft.png`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ppprof.plotting import pyplot, save_figure

LOAD_PLOT, TTFT_PLOT = "serving.png", "serving-ttft.png"


def write_plots(result: dict, out_dir: str | Path, title: str) -> list[Path]:
    """Both plots of serving.json's `result` into `out_dir`; returns their paths."""
    plt = pyplot()
    levels = list(result["levels"])
    arms = list(result["levels"][levels[0]])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for arm in arms:
        rows = [result["levels"][level][arm] for level in levels]
        left.plot(levels, [r["throughput_tokens_per_s"] for r in rows], marker="o", label=arm)
        right.plot(levels, [r["ttft_ms"]["mean"] for r in rows], marker="o", label=arm)
    left.set(ylabel="input throughput (tokens/s)", xlabel="load level")
    right.set(ylabel="mean TTFT (ms)", xlabel="load level")
    right.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    paths = [save_figure(fig, Path(out_dir) / LOAD_PLOT, bbox_inches="tight")]
    heaviest = levels[-1]
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm in arms:
        ttft = np.sort(result["levels"][heaviest][arm]["ttft_ms_by_request"])
        ax.step(ttft, np.arange(1, len(ttft) + 1) / len(ttft), where="post", label=arm)
    ax.set(xlabel="TTFT (ms)", ylabel="fraction of requests", title=f"{title}: {heaviest}")
    ax.legend(fontsize=8)
    paths.append(save_figure(fig, Path(out_dir) / TTFT_PLOT, bbox_inches="tight"))
    return paths

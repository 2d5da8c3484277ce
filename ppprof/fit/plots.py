"""The fit's plots: measured latency vs chunk_size with the fitted curves (fit.png), and the policy's chunk size vs
prefix_len (chunks.png); matplotlib is imported only when drawing."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ppprof.fit.samples import Samples
from ppprof.plotting import pyplot, save_figure
from ppprof.policy.rule import LatencyModel

FIT_PLOT = "fit.png"
CHUNKS_PLOT = "chunks.png"
MAX_PREFIX_CURVES = 8


def plot_fit(samples: Samples, model: LatencyModel | None, title: str):
    """Latency vs chunk_size, coloured by prefix_len (at most MAX_PREFIX_CURVES prefixes), with the model's curves."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    prefixes = np.unique(samples.prefix_len)
    shown = (
        prefixes
        if len(prefixes) <= MAX_PREFIX_CURVES
        else prefixes[np.unique(np.linspace(0, len(prefixes) - 1, MAX_PREFIX_CURVES).astype(int))]
    )
    colors = plt.cm.viridis(np.linspace(0, 0.9, len(shown)))
    ax.scatter(samples.chunk_size, samples.chunk_latency_ms, s=6, color="0.7", label="all samples")
    for prefix, color in zip(shown, colors):
        sel = samples.prefix_len == prefix
        ax.scatter(samples.chunk_size[sel], samples.chunk_latency_ms[sel], s=8, color=color, label=f"prefix {prefix}")
        if model is not None:
            x = np.linspace(max(1, samples.chunk_size.min()), samples.chunk_size.max(), 100)
            ax.plot(x, model.chunk_latency_ms(np.full_like(x, prefix), x), color=color, lw=1.2)
    ax.set_xlabel("chunk_size (tokens)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return fig


def plot_chunks(policy: dict):
    """The policy table as a step function: next chunk size vs prefix_len, up to the context length."""
    plt = pyplot()
    starts = policy["table"]["prefix_len"]
    sizes = policy["table"]["chunk_size"]
    context_len = policy["settings"]["context_len"]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.step(list(starts) + [context_len], list(sizes) + [sizes[-1]], where="post")
    ax.set_xlabel("prefix_len (tokens)")
    ax.set_ylabel("next chunk size (tokens)")
    ax.set_title(f"{policy['status']}: {policy['reason']}"[:110], fontsize=9)
    ax.set_ylim(bottom=0)
    return fig


def write_plots(samples: Samples, policy: dict, out_dir: Path) -> list[Path]:
    """Write FIT_PLOT and CHUNKS_PLOT into `out_dir` (each atomically)."""
    model = LatencyModel.from_dict(policy["latency_model"]) if policy["latency_model"] else None
    title = model.name if model else "no model"
    if samples.bottleneck_stage is not None:
        title += f"; stage {samples.bottleneck_stage}"
    paths = [save_figure(plot_fit(samples, model, title), Path(out_dir) / FIT_PLOT, bbox_inches="tight")]
    paths.append(save_figure(plot_chunks(policy), Path(out_dir) / CHUNKS_PLOT, bbox_inches="tight"))
    return paths

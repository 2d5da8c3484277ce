"""The picture of a comparison (`ppprof compare --plot`): both chunk-size tables, and both latency models with the
samples of each side where there are samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ppprof.compare.policies import table_end
from ppprof.fit.samples import Samples
from ppprof.plotting import pyplot, save_figure
from ppprof.policy.runtime import Policy

NUM_FIT_PREFIXES = 3  # latency curves drawn per policy: prefix 0, the middle and the largest profiled prefix


def fit_prefixes(base: Policy, cand: Policy) -> list[int]:
    """Prefix lengths whose latency curves are drawn: the smallest, a middle and the largest of the profiled prefix
    lengths (the policies' domains), else 0, the middle and the end of the compared range."""
    profiled = sorted(
        {
            int(L)
            for p in (base, cand)
            if isinstance(p.report.domain, dict)
            for L in p.report.domain.get("prefix_lens") or ()
        }
    )
    if len(profiled) < NUM_FIT_PREFIXES:
        end = table_end(base, cand)
        profiled = sorted({0, end // 2, end})
    return sorted({profiled[0], profiled[len(profiled) // 2], profiled[-1]})


def write_compare_plot(base: Policy, cand: Policy, samples: tuple[Samples, Samples] | None, path) -> Path:
    """Left: both chunk-size tables (next chunk size vs prefix_len). Right: both latency models against chunk_size
    at a few prefix lengths, with the samples of the nearest measured prefix where there are samples."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    end = table_end(base, cand)
    styles = (("baseline", base, "-", "tab:blue"), ("candidate", cand, "--", "tab:orange"))
    for label, pol, ls, color in styles:
        starts = [s for s in pol.data["table"]["prefix_len"] if s <= end]
        sizes = pol.data["table"]["chunk_size"][: len(starts)]
        left.step(
            starts + [end],
            sizes + [sizes[-1]],
            where="post",
            ls=ls,
            color=color,
            label=f"{label}: {pol.status}, B {pol.base_chunk_size}",
        )
    left.set_xlabel("prefix_len (tokens)")
    left.set_ylabel("next chunk size (tokens)")
    left.set_ylim(bottom=0)
    left.legend(fontsize=8)
    left.set_title("chunk-size tables", fontsize=9)
    prefixes = fit_prefixes(base, cand)
    shades = plt.cm.viridis(np.linspace(0, 0.85, len(prefixes)))
    largest = max(
        base.settings.max_chunk_size, base.base_chunk_size, cand.base_chunk_size, cand.settings.max_chunk_size
    )
    x = np.linspace(1, 1.25 * largest, 100)
    for (label, pol, ls, _), marker, sam in zip(styles, ("o", "x"), samples or (None, None)):
        for prefix, shade in zip(prefixes, shades):
            if pol.latency_model is not None:
                right.plot(
                    x,
                    pol.latency_model.chunk_latency_ms(np.full_like(x, prefix), x),
                    ls=ls,
                    color=shade,
                    lw=1.2,
                    label=f"{label} ({pol.latency_model.name}), prefix {prefix}",
                )
            if sam is not None:
                measured = np.unique(sam.prefix_len)
                near = measured[np.argmin(np.abs(measured - prefix))]
                sel = sam.prefix_len == near
                right.scatter(
                    sam.chunk_size[sel], sam.chunk_latency_ms[sel], s=8, marker=marker, color=shade, alpha=0.6
                )
    right.set_xlabel("chunk_size (tokens)")
    right.set_ylabel("chunk latency (ms)")
    right.set_title("latency models (lines) and samples (o baseline, x candidate)", fontsize=9)
    right.legend(fontsize=7)
    fig.tight_layout()
    return save_figure(fig, path, bbox_inches="tight")

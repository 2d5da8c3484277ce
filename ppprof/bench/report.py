"""What a bench measured, and what it is worth: per prompt, the measured TTFT (real pipeline), the replayed one (every
stage's measured chunk latencies composed through the pipeline recurrence) and the predicted one; per strategy and
prompt length, medians, spreads and prediction errors; paired ratios between strategies; bench.csv, bench.json and a
timeline PNG per prompt length."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ppprof.bench.executor import WARMUP_REPEAT
from ppprof.bench.plans import Arm
from ppprof.io import atomic_write, atomic_write_json
from ppprof.plotting import pyplot, save_figure
from ppprof.policy.timeline import replay, start_times

BENCH_CSV = "bench.csv"
BENCH_JSON = "bench.json"
BENCH_SCHEMA_VERSION = 1
RATIOS = (
    ("policy", "fixed-best"),
    ("policy", "optimal"),
    ("policy-history", "fixed-best"),
    ("greedy", "fixed"),
    ("optimal", "fixed"),
    ("optimal", "fixed-best"),
    ("greedy", "fixed-best"),
    ("greedy", "sglang"),
    ("optimal", "sglang"),
)


def per_prompt(frame: pd.DataFrame, ttft: dict, transfer: dict, pp_size: int, real: bool) -> pd.DataFrame:
    """One row per timed prompt: measured (real) and replayed TTFT, the bottleneck stage and its chunk-latency CV, and
    each stage's idle time (TTFT less its compute)."""
    out = []
    for prompt, g in frame.groupby("prompt", sort=True):
        t = g.pivot(index="stage", columns="chunk", values="compute_ms").to_numpy()  # (P, n)
        sizes = g[g.stage == g.stage.min()].sort_values("chunk").chunk_size.to_numpy()
        moved = transfer["a_ms"] + transfer["b_ms_per_token"] * sizes
        replay_ms = float(replay(t, moved)[1][-1, -1])
        measured = float(ttft.get(prompt, np.nan)) if real else np.nan
        bottleneck = int(np.argmax(t.sum(axis=1)))
        lat = t[bottleneck]
        reference = measured if real else replay_ms
        out.append(
            {
                "prompt": prompt,
                "arm": g.arm.iloc[0],
                "repeat": int(g.repeat.iloc[0]),
                "prompt_len": int(g.prompt_len.iloc[0]),
                "num_chunks": t.shape[1],
                "ttft_ms": measured,
                "replay_ttft_ms": replay_ms,
                "bottleneck_stage": bottleneck,
                "bottleneck_cv": float(lat.std() / lat.mean()) if lat.mean() > 0 else np.nan,
                "idle_ms": [float(reference - t[s].sum()) for s in range(pp_size)],
            }
        )
    return pd.DataFrame(out)


def spread(values: np.ndarray) -> dict:
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if not v.size:
        return {"median": None, "min": None, "max": None, "p10": None, "p90": None}
    return {
        "median": float(np.median(v)),
        "min": float(v.min()),
        "max": float(v.max()),
        "p10": float(np.percentile(v, 10)),
        "p90": float(np.percentile(v, 90)),
    }


def strategy_names(arms_here: list[Arm], base_chunk_size: int, prompts: pd.DataFrame, key: str) -> dict[str, str]:
    """Strategy -> arm: fixed is fixed-B; fixed-best the fixed arm of least median TTFT; the rest are themselves."""
    names = {a.name: a.name for a in arms_here if not a.name.startswith("fixed-")}
    fixed = [a.name for a in arms_here if a.name.startswith("fixed-")]
    if f"fixed-{base_chunk_size}" in fixed:
        names["fixed"] = f"fixed-{base_chunk_size}"
    if len(fixed) > 1:
        medians = {a: prompts[prompts.arm == a][key].median() for a in fixed}
        names["fixed-best"] = min(medians, key=medians.get)
    return names


def summarize(prompts: pd.DataFrame, arms_here: list[Arm], names: dict[str, str], key: str) -> dict:
    """Per strategy: TTFT spreads (measured, replay), predicted TTFT and its error, chunks, CV, idle time."""
    predicted = {a.name: a.predicted_ttft_ms for a in arms_here}
    out = {}
    for strategy, arm in names.items():
        p = prompts[prompts.arm == arm]
        measured = spread(p[key])
        pred = predicted[arm]
        out[strategy] = {
            "arm": arm,
            "num_chunks": int(p.num_chunks.iloc[0]),
            "ttft_ms": spread(p.ttft_ms),
            "replay_ttft_ms": spread(p.replay_ttft_ms),
            "predicted_ttft_ms": pred,
            "prediction_error": None if measured["median"] is None else pred / measured["median"] - 1.0,
            "replay_vs_real": None if p.ttft_ms.isna().all() else float(np.median(p.replay_ttft_ms / p.ttft_ms) - 1),
            "bottleneck_cv": float(p.bottleneck_cv.median()),
            "idle_ms_per_stage": [
                float(np.median([row[s] for row in p.idle_ms])) for s in range(len(p.idle_ms.iloc[0]))
            ],
        }
    return out


def paired_ratios(prompts: pd.DataFrame, names: dict[str, str], key: str) -> dict:
    """Median over repeats of the per-repeat ratio A / B of the TTFT (prompts of one repeat ran back to back)."""
    by_repeat = prompts.pivot_table(index="repeat", columns="arm", values=key)
    out = {}
    for a, b in RATIOS:
        if a in names and b in names:
            ratio = by_repeat[names[a]] / by_repeat[names[b]]
            out[f"{a}/{b}"] = spread(ratio.to_numpy())
    return out


@dataclass(frozen=True, slots=True)
class Measured:
    """What a bench measured (write_report): every strategy's plans, every stage's timed chunks, the TTFTs, the
    transfers between ranks, on `world_size` ranks that ran `pp_size` stages."""

    plans: list[Arm]
    rows: list[dict]
    """Every strategy's chunks for every prompt length, and every stage's timed chunks of every prompt."""
    ttft: dict
    transfer: dict
    """TTFT (ms) of each prompt by its index, and the fitted transfer time (a_ms, b_ms_per_token, the points)."""
    world_size: int
    """The ranks it ran on (pp_size x tp_size)."""
    pp_size: int
    """The stages those ranks ran: the bench's stages are real where as many, else replayed."""


def write_report(run_dir: Path, bench, measured: Measured, profile_run: dict, notes: dict[int, str | None]) -> str:
    """Write bench.csv, bench.json and the timelines of `bench` (its BenchConfig) into `run_dir`; return the summary
    table."""
    plans, rows, ttft, transfer = measured.plans, measured.rows, measured.ttft, measured.transfer
    world_size = measured.world_size
    pp_size = bench.pp_size
    real = pp_size == measured.pp_size
    key = "ttft_ms" if real else "replay_ttft_ms"
    frame = pd.DataFrame(rows)
    frame = frame[frame.repeat != WARMUP_REPEAT].sort_values(["prompt", "stage", "chunk"]).reset_index(drop=True)
    atomic_write(run_dir / BENCH_CSV, lambda p: frame.to_csv(p, index=False))
    prompts = per_prompt(frame, ttft, transfer, pp_size, real)
    doc = {
        "schema_version": BENCH_SCHEMA_VERSION,
        "policy": str(bench.policy),
        "num_stages": pp_size,
        "world_size": world_size,
        "composition": "real and replay" if real else "replay",
        "measured_by": key,
        "transfer": {k: v for k, v in transfer.items() if k != "points"},
        "config": bench.to_dict(),
        "profile": {k: profile_run.get(k) for k in ("hardware", "attention_kernel", "mamba_kernel", "torch_threads")},
        "prompt_lens": {},
    }
    base = bench.profile.probes.base_chunk_size
    lines = [
        f"bench: {pp_size} stages on {world_size} ranks ({doc['composition']}); TTFT ms, median of "
        f"{bench.repeats} (min-max); predicted by the policy; error = predicted / measured - 1"
    ]
    for prompt_len in bench.prompt_lens:
        here = [a for a in plans if a.prompt_len == prompt_len]
        p = prompts[prompts.prompt_len == prompt_len]
        names = strategy_names(here, base, p, key)
        entry = {
            "strategies": summarize(p, here, names, key),
            "fixed_sweep": summarize(p, here, {a.name: a.name for a in here if a.name.startswith("fixed-")}, key),
            "ratios": paired_ratios(p, names, key),
            "extrapolation": notes.get(prompt_len),
        }
        doc["prompt_lens"][str(prompt_len)] = entry
        lines += table(prompt_len, entry)
        lines += [f"  note: {notes[prompt_len]}"] if notes.get(prompt_len) else []
        draw(run_dir / f"timeline-{prompt_len}.png", frame, p, here, names, pp_size, key)
    atomic_write_json(run_dir / BENCH_JSON, json.loads(json.dumps(doc, default=float)))
    return "\n".join(lines)


def table(prompt_len: int, entry: dict) -> list[str]:
    def f(x, spec=".1f"):
        return "n/a" if x is None or (isinstance(x, float) and not np.isfinite(x)) else format(x, spec)

    lines = [
        f"prompt {prompt_len}: {'strategy':<11} {'arm':<11} {'chunks':>6} {'measured':>24} {'replay':>9} "
        f"{'predicted':>9} {'error':>7} {'cv':>5}"
    ]
    for name, s in entry["strategies"].items():
        m = s["ttft_ms"] if s["ttft_ms"]["median"] is not None else s["replay_ttft_ms"]
        lines.append(
            f"{'':>{len(str(prompt_len)) + 8}}{name:<11} {s['arm']:<11} {s['num_chunks']:>6} "
            f"{f(m['median']):>9} ({f(m['min'])}-{f(m['max'])}) {f(s['replay_ttft_ms']['median']):>9} "
            f"{f(s['predicted_ttft_ms']):>9} {f(s['prediction_error'], '+.1%'):>7} "
            f"{f(s['bottleneck_cv'], '.0%'):>5}"
        )
    lines.append(
        "  ratios (median of paired repeats): "
        + ", ".join(f"{k} {f(v['median'], '.3f')}" for k, v in entry["ratios"].items())
    )
    return lines


def draw(
    path: Path,
    frame: pd.DataFrame,
    prompts: pd.DataFrame,
    arms_here: list[Arm],
    names: dict[str, str],
    pp_size: int,
    key: str,
) -> Path:
    """Per strategy, the measured timeline of its median repeat (stages x time, bars per chunk) beside the predicted."""
    plt = pyplot()
    shown = list(names.items())
    fig, axes = plt.subplots(
        len(shown), 2, figsize=(14, 0.6 + (0.35 * pp_size + 0.6) * len(shown)), squeeze=False, sharex=True
    )
    cmap = plt.get_cmap("tab20")
    for row, (strategy, arm) in enumerate(shown):
        p = prompts[prompts.arm == arm].sort_values(key)
        prompt = int(p.prompt.iloc[len(p) // 2])
        g = frame[frame.prompt == prompt]
        left, right = axes[row]
        for s, rows in g.groupby("stage"):
            left.broken_barh(
                list(zip(rows.start_ms - g.start_ms.min(), rows.compute_ms)),
                (s - 0.4, 0.8),
                facecolors=[cmap(int(c) % 20) for c in rows.chunk],
                edgecolor="black",
                linewidth=0.2,
            )
        plan = next(a for a in arms_here if a.name == arm)
        start = start_times(plan.predicted_ms, pp_size)
        for s in range(pp_size):
            right.broken_barh(
                [(start[i, s], t) for i, t in enumerate(plan.predicted_ms)],
                (s - 0.4, 0.8),
                facecolors=[cmap(i % 20) for i in range(len(plan.predicted_ms))],
                edgecolor="black",
                linewidth=0.2,
            )
        left.set_title(f"{strategy} ({arm}) measured: {p[key].iloc[len(p) // 2]:.1f} ms", fontsize=8)
        right.set_title(f"{strategy} predicted: {plan.predicted_ttft_ms:.1f} ms", fontsize=8)
        for ax in (left, right):
            ax.set_yticks(range(pp_size), [f"stage {s}" for s in range(pp_size)], fontsize=7)
            ax.invert_yaxis()
    for ax in axes[-1]:
        ax.set_xlabel("time (ms)")
    fig.tight_layout()
    return save_figure(fig, path, dpi=90)

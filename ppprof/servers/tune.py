"""`ppprof tune`: the server settings with the least predicted TTFT over a workload's prompt lengths.

For each candidate setting of one server (base chunk B on an aligned grid, smoothing factor s in [0.5, 1], the floor
or the cap, and fixed chunks: the server's `dynamic_candidates` and `fixed_candidate`), every prompt is chunked the
way that server would chunk it (its own rule with the model it would have), and its TTFT is predicted with the
policy's latency model (the best ppprof fitted): TTFT = sum t + (P - 1) max t. The setting with the least weighted
mean TTFT is recommended; the current setting (or the server's defaults) and the best fixed chunk are scored the same
way, and the DP-optimal plan of each prompt (seeded with all of them) is the bound no setting can beat. Pure numpy;
no torch.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from ppprof.config.workload import Workload
from ppprof.policy.rule import LatencyModel
from ppprof.policy.summary import extrapolation
from ppprof.servers.base import PP_SIZE, TP_SIZE
from ppprof.servers.flags import command_line, split_command
from ppprof.servers.tuner import SMOOTH_FACTORS, Scored, Tuner, weighted_p90


def tune(tuner: Tuner, current: str | None = None) -> dict:
    """The recommendation and its comparison (what `ppprof tune --json` prints, less the plot path): the settings of
    `tuner`'s server scored on its workload (Tuner: the policy, the stages, the profile's samples a server that fits
    at boot fits its model to, the figures under load that join what is minimised), against `current` (the user's
    flags; None: the server's defaults)."""
    policy, workload = tuner.policy, tuner.workload
    scored_current, current_calibration, ignored = score_current(tuner, current)
    own = tuner.server.setting_of(policy)
    if tuner.model is None:
        own = replace(own, dynamic=False)
    scored_policy = tuner.score(own, "policy")
    inside = [
        st
        for st in (own, scored_current.setting)
        if tuner.max_chunk is None or max(st.base_chunk_size, tuner.server.fixed_chunk_size(st)) <= tuner.max_chunk
    ]
    best, best_fixed = tuner.search(inside)
    current_wins = (
        scored_current.objective < best.objective
    )  # the user's own calibration (ATOM) can beat ppprof's model
    if current_wins:
        best = scored_current
    best = replace(best, label="recommended")
    best_fixed.label = "best fixed"
    optimal = tuner.optimal([best, best_fixed, scored_current, scored_policy])
    calibration = None
    if best.setting.dynamic:  # the calibration the winner was scored with: the user's where their flags won
        calibration = (current_wins and current_calibration) or tuner.server.calibration(policy)
    return result(tuner, workload, (scored_current, scored_policy, best, best_fixed), optimal, calibration, ignored)


def result(
    tuner: Tuner,
    workload: Workload,
    scored: tuple[Scored, Scored, Scored, Scored],
    optimal: list,
    calibration: LatencyModel | None,
    ignored: list[str],
) -> dict:
    """`ppprof tune --json`'s object: the recommended flags, each row scored (current, policy, recommended, best
    fixed), the DP bound, the gains, each prompt's plans, notes and the surface."""
    scored_current, scored_policy, best, best_fixed = scored
    policy, pp_size = tuner.policy, tuner.pp_size
    opt_ttft = np.array([t for _, t in optimal])
    env, args = tuner.server.format_flags(best.setting, calibration)
    args = tuner.server.format_parallel(pp_size, policy.tp_size) + args
    rows = list(scored)
    mean_opt = float(opt_ttft @ tuner.weights)
    return {
        "server": tuner.server.name,
        "num_stages": pp_size,
        "latency_model": policy.latency_model.name,
        "boot_fit": "samples" if tuner.booted else "model",
        "workload": {"prompt_lens": list(workload.prompt_lens), "weights": list(workload.weights)},
        "recommended": {
            "env": env,
            "args": args,
            "command": command_line(env, args),
            "setting": best.setting.to_dict(),
        },
        "settings": {r.label: r.to_dict(workload) for r in rows},
        "optimal": {
            "mean_ttft_ms": mean_opt,
            "p90_ttft_ms": weighted_p90(opt_ttft, tuner.weights),
            "per_prompt": [
                {"prompt_len": int(n), "ttft_ms": float(t), "num_chunks": len(c)}
                for n, (c, t) in zip(workload.prompt_lens, optimal)
            ],
        },
        "gain": {
            "vs_" + key: 1.0 - best.mean_ms / r.mean_ms
            for key, r in (("current", scored_current), ("policy", scored_policy), ("best_fixed", best_fixed))
        },
        "gap_to_optimal": best.mean_ms / mean_opt - 1.0,
        **under_load(best, rows),
        "plans": {
            str(n): {
                "current": scored_current.plans[i],
                "policy": scored_policy.plans[i],
                "recommended": best.plans[i],
                "best-fixed": best_fixed.plans[i],
                "optimal": optimal[i][0],
            }
            for i, n in enumerate(workload.prompt_lens)
        },
        "notes": notes(tuner, workload, (best, scored_current), ignored),
        "surface": surface(tuner),
    }


def under_load(best: Scored, rows: list[Scored]) -> dict:
    """With --concurrency: what was minimised and the recommendation's gain on it over each row."""
    if not best.load:
        return {}
    return {
        "objective": "geometric mean of the mean TTFT alone and at each concurrency in the serving simulation",
        "objective_gain": {"vs_" + r.label.replace(" ", "_"): 1.0 - best.objective / r.objective for r in rows},
    }


def score_current(tuner: Tuner, current: str | None) -> tuple[Scored, LatencyModel | None, list[str]]:
    """(the user's current flags, or the server's defaults, scored; the calibration they carry (ATOM), None without;
    the tokens of `current` ignored), limited to the policy's context."""
    page = tuner.policy.settings.page_size
    if current is not None:
        check_layout(tuner, current)
        setting, calibration, ignored = tuner.server.parse_flags(current, page)
        label = "current"
    else:
        setting, calibration, ignored = tuner.server.default_setting(page), None, []
        label = "server default"
    setting = tuner.server.with_context(setting, tuner.policy.settings.context_len)
    return tuner.score(setting, label, calibration), calibration, ignored


def check_layout(tuner: Tuner, current: str) -> None:
    """ValueError (one line) where the --current flags set a TP degree other than the policy's (its latencies hold for
    the TP degree it was profiled at) or pipeline stages other than those tuned for."""
    layout, _ = tuner.server.parse_parallel(split_command(current))
    tp, pp = layout.get(TP_SIZE), layout.get(PP_SIZE)
    if tp is not None and tp != tuner.policy.tp_size:
        raise ValueError(
            f"--current sets TP degree {tp} but the policy was profiled at --tp-size "
            f"{tuner.policy.tp_size}: profile with --tp-size {tp}, or tune the flags of a TP "
            f"{tuner.policy.tp_size} server"
        )
    if pp is not None and pp != tuner.pp_size:
        raise ValueError(f"--current sets {pp} pipeline stages but tune plans for {tuner.pp_size}: give --pp-size {pp}")


def notes(tuner: Tuner, workload: Workload, scored: tuple[Scored, ...], ignored: list[str]) -> list[str]:
    """What the recommendation stands on: the policy's status, the server's boot fit, the search's bounds, where
    the `scored` plans extrapolate, and the flags of --current ignored."""
    policy, label = tuner.policy, tuner.server.label
    out = [workload.note] if workload.note else []
    if policy.status != "dynamic":
        out.append(
            f"the policy is {policy.status} ({policy.reason}): its model failed ppprof's quality gates, so "
            f"these predictions are less reliable; profile again on a quiet machine"
        )
    if tuner.booted:
        m = tuner.model
        out.append(
            f"{label}'s boot fit of the profile's prefix-free samples: "
            + (
                f"a={m.a:.4g}, b={m.b:.4g}, c={m.c:.4g}"
                if m is not None
                else "none it would use (a <= 0 or too few points): it keeps fixed chunks"
            )
        )
    if tuner.max_chunk is not None:
        out.append(
            f"candidates keep chunks within the profiled chunk sizes (up to {tuner.max_chunk} tokens); "
            f"profile with a larger --base-chunk-size, or pass --extrapolate, to search beyond"
        )
    longest = int(np.argmax(workload.prompt_lens))
    for r in scored:
        note = extrapolation(policy, workload.prompt_lens[longest], r.plans[longest])
        if note:
            out.append(f"{r.label}: {note}")
    if ignored:
        out.append(f"--current: ignored {' '.join(ignored)} (not a chunking flag of {label})")
    return out


def surface(tuner: Tuner) -> dict:
    """Weighted mean TTFT of every scored setting, by base chunk: per smoothing factor (the best floor/cap at each),
    and for fixed chunks; for the plot."""
    dyn: dict[float, dict[int, float]] = {}
    fixed: dict[int, float] = {}
    for st, r in tuner.cache.items():
        if st.dynamic:
            row = dyn.setdefault(st.smooth_factor, {})
            row[st.base_chunk_size] = min(row.get(st.base_chunk_size, math.inf), r.mean_ms)
        else:
            fixed[st.base_chunk_size] = r.mean_ms
    return {
        "fixed": sorted(fixed.items()),
        "dynamic": {f"{s:g}": sorted(v.items()) for s, v in sorted(dyn.items()) if s in SMOOTH_FACTORS},
    }


def draw(result: dict, path: str | Path, title: str) -> Path:
    """TTFT (weighted mean over the workload) versus base chunk: a line per smoothing factor, fixed chunks, the DP
    bound, and the current, policy and recommended settings marked."""
    from ppprof.plotting import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5.5))
    cmap = plt.get_cmap("viridis")
    dyn = result["surface"]["dynamic"]
    for i, (s, points) in enumerate(dyn.items()):
        if not points:
            continue
        xs, ys = zip(*points)
        ax.plot(xs, ys, color=cmap(i / max(1, len(dyn) - 1)), lw=1.2, label=f"dynamic, s = {s}")
    if result["surface"]["fixed"]:
        xs, ys = zip(*result["surface"]["fixed"])
        ax.plot(xs, ys, color="black", ls="--", lw=1.5, label="fixed chunks")
    ax.axhline(result["optimal"]["mean_ttft_ms"], color="grey", ls=":", label="DP-optimal bound")
    marks = {
        "server default": ("x", "tab:red"),
        "current": ("x", "tab:red"),
        "policy": ("o", "tab:blue"),
        "recommended": ("*", "tab:green"),
        "best fixed": ("s", "black"),
    }
    for label, r in result["settings"].items():
        marker, color = marks.get(label, ("o", "grey"))
        ax.scatter(
            [r["setting"]["base_chunk_size"]],
            [r["mean_ttft_ms"]],
            marker=marker,
            color=color,
            s=90,
            zorder=5,
            label=f"{label}: {r['mean_ttft_ms']:.1f} ms",
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("base chunk size B (tokens)")
    ax.set_ylabel("predicted TTFT, weighted mean over the prompts (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)

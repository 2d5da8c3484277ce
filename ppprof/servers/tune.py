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
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ppprof.bounds import MAX_STAGES
from ppprof.checks import is_int
from ppprof.chunks import align_down, align_up
from ppprof.config import CONTEXT_MARGIN
from ppprof.policy.planners import chunk_latencies_ms, optimal_chunks, ttft_ms
from ppprof.policy.rule import LatencyModel
from ppprof.policy.runtime import Policy
from ppprof.policy.summary import extrapolation
from ppprof.servers.base import PP_SIZE, TP_SIZE, ServerSetting, command_line, split_command
from ppprof.servers.boot import Forwards
from ppprof.servers.registry import DEFAULT_SERVER, get
from ppprof.servers.workload import Workload

SMOOTH_FACTORS = tuple(round(0.5 + 0.05 * i, 2) for i in range(11))
B_STEPS_PER_OCTAVE = 4


@dataclass(slots=True)
class Scored:
    """One setting and what it predicts for every prompt length of the workload."""

    setting: ServerSetting
    label: str
    ttft_ms: np.ndarray
    mean_ms: float
    p90_ms: float
    plans: list[list[int]]

    def to_dict(self, workload: Workload) -> dict:
        return {
            "label": self.label,
            "setting": self.setting.to_dict(),
            "mean_ttft_ms": self.mean_ms,
            "p90_ttft_ms": self.p90_ms,
            "per_prompt": [
                {"prompt_len": n, "ttft_ms": float(t), "num_chunks": len(p)}
                for n, t, p in zip(workload.prompt_lens, self.ttft_ms, self.plans)
            ],
        }


def weighted_p90(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][min(int(np.searchsorted(cum, 0.9 - 1e-12)), len(values) - 1)])


def cut(chunks: np.ndarray, prompt_len: int) -> np.ndarray:
    """The plan of a `prompt_len` prompt from the chunks of a longer one (the last chunk takes the rest): a rule's
    next chunk does not depend on the prompt's length, so a shorter prompt's chunks are the longer one's, cut."""
    ends = np.cumsum(chunks)
    k = int(np.searchsorted(ends, prompt_len, side="left"))
    out = chunks[: k + 1].copy()
    out[-1] = prompt_len - (int(ends[k - 1]) if k else 0)
    return out


class Tuner:
    """Scores settings of one server on one workload with the policy's model."""

    def __init__(
        self,
        policy: Policy,
        workload: Workload,
        num_stages: int,
        server: str,
        extrapolate: bool = False,
        forwards: Forwards | None = None,
    ):
        self.server = get(server)
        if not is_int(num_stages) or not 1 <= num_stages <= MAX_STAGES:
            raise ValueError(f"--pp {num_stages!r} is invalid: use a number of pipeline stages in 1..{MAX_STAGES}")
        if policy.model is None:
            raise ValueError(f"policy has no latency model ({policy.status}: {policy.reason}): refit with more samples")
        self.policy, self.num_stages = policy, num_stages
        self.truth = policy.model
        self.context = policy.settings.context_len
        self.lengths = np.asarray(workload.prompt_lens, dtype=np.int64)
        self.weights = np.asarray(workload.weights, dtype=float)
        self.longest = int(self.lengths.max())
        # The model the server sizes chunks with: its boot fit of the profile's samples where given and it fits at
        # boot, else derived from the policy's model.
        self.booted = forwards is not None and self.server.fits_at_boot
        self.model = self.server.model_for(policy, forwards)
        self.cache: dict[ServerSetting, Scored] = {}
        # Candidates keep their chunks within the profiled chunk sizes unless asked to extrapolate.
        dom = policy.data.get("domain") or {}
        self.max_chunk = None if extrapolate or not dom.get("chunk_size") else int(dom["chunk_size"][1])

    def model_for(self, calibration: LatencyModel | None = None) -> LatencyModel | None:
        """The model the server sizes chunks with; the calibration its flags carry where given (ATOM)."""
        return self.server.boot_model(calibration) if calibration is not None else self.model

    def score(self, setting: ServerSetting, label: str = "", calibration: LatencyModel | None = None) -> Scored:
        if calibration is None and setting in self.cache:
            hit = self.cache[setting]
            return Scored(hit.setting, label or hit.label, hit.ttft_ms, hit.mean_ms, hit.p90_ms, hit.plans)
        chunks = np.asarray(
            self.server.chunks(setting, self.model_for(calibration), self.context, self.longest), dtype=np.int64
        )
        plans = [cut(chunks, int(n)) for n in self.lengths]
        ttft = np.array([ttft_ms(chunk_latencies_ms(self.truth, p), self.num_stages) for p in plans])
        scored = Scored(
            setting,
            label,
            ttft,
            float(ttft @ self.weights),
            weighted_p90(ttft, self.weights),
            [[int(c) for c in p] for p in plans],
        )
        if calibration is None:
            self.cache[setting] = scored
        return scored

    def base_grid(self, extra: list[int]) -> list[int]:
        """Aligned base chunk sizes, about B_STEPS_PER_OCTAVE an octave, from 2 alignment units to the longest
        prompt (or the context), with `extra` sizes added."""
        align = self.policy.settings.alignment
        hi = max(2 * align, min(self.context - CONTEXT_MARGIN - align, align_up(self.longest, align)))
        if self.max_chunk is not None:
            hi = min(hi, self.max_chunk)
        hi -= hi % align
        lo = 2 * align
        sizes = set()
        if hi >= lo:
            steps = int(math.ceil(math.log2(hi / lo) * B_STEPS_PER_OCTAVE))
            for v in np.geomspace(lo, hi, steps + 1):
                sizes.add(align_down(int(v), align))
        sizes.update(e for e in extra if align <= e <= hi)
        return sorted(sizes)

    def dynamic_settings(self, B: int, smooth_factors) -> list[ServerSetting]:
        return self.server.dynamic_candidates(
            B, smooth_factors, self.policy.settings.alignment, self.policy.settings.page_size
        )

    def fixed_setting(self, size: int) -> ServerSetting:
        return self.server.fixed_candidate(size, self.policy.settings.page_size)

    def search(self, extra: list[ServerSetting]) -> tuple[Scored, Scored]:
        """(best setting, best fixed setting): a coarse grid, then a finer one around the best of each."""
        grid = self.base_grid([s.base_chunk_size for s in extra])
        fixed = [self.score(self.fixed_setting(B)) for B in grid]
        # With no model (SGLang's boot fit has a <= 0) dynamic chunking stays off: its candidates would be fixed ones.
        dynamic = (
            []
            if self.model is None
            else [self.score(st) for B in grid for st in self.dynamic_settings(B, SMOOTH_FACTORS)]
        )
        extras = [self.score(st) for st in extra if st.dynamic is False or self.model is not None]
        best_fixed = min(fixed, key=lambda r: r.mean_ms)
        best = min(fixed + dynamic + extras, key=lambda r: r.mean_ms)  # fixed first: a tie goes to fixed chunks
        best_fixed = self.refine(grid, best_fixed, True)
        best = self.refine(grid, best, not best.setting.dynamic)
        best = min([best, best_fixed], key=lambda r: r.mean_ms)
        return best, best_fixed

    def refine(self, grid: list[int], pick: Scored, is_fixed: bool) -> Scored:
        """The best of `pick` and the settings near it: every aligned B between the grid neighbours of its B,
        smoothing factors 0.01 apart, the same floor or cap in proportion to B."""
        align = self.policy.settings.alignment
        B = pick.setting.base_chunk_size
        i = grid.index(B) if B in grid else int(np.searchsorted(grid, B))
        lo = grid[max(0, i - 1)]
        hi = grid[min(len(grid) - 1, i + 1)]
        step = align * max(1, (hi - lo) // (align * 48))
        near = range(lo, hi + 1, step)
        if is_fixed:
            found = [self.score(self.fixed_setting(b)) for b in near]
        else:
            s0 = pick.setting.smooth_factor
            smooth = sorted({round(min(1.0, max(0.5, s0 + 0.01 * k)), 2) for k in range(-5, 6)})
            found = [
                self.score(st)
                for b in near
                for st in self.dynamic_settings(b, smooth)
                if self.server.same_knob(st, pick.setting, b)
            ]
        return min(found + [pick], key=lambda r: r.mean_ms)

    def optimal(self, seeds: list[Scored]) -> list[tuple[list[int], float]]:
        """The DP-optimal plan of each prompt (chunks up to the largest any candidate uses), seeded with `seeds`' plans
        so it is never worse than any of them."""
        largest = max([self.policy.settings.base_chunk_size] + [max(p) for s in seeds for p in s.plans])
        out = []
        for i, n in enumerate(self.lengths):
            plans = [s.plans[i] for s in seeds]
            chunks, _ = optimal_chunks(
                self.truth, int(n), self.num_stages, self.policy.settings.alignment, largest, plans
            )
            out.append((chunks, ttft_ms(chunk_latencies_ms(self.truth, chunks), self.num_stages)))
        return out


def tune(
    policy: Policy,
    workload: Workload,
    num_stages: int,
    server: str = DEFAULT_SERVER,
    current: str | None = None,
    extrapolate: bool = False,
    forwards: Forwards | None = None,
) -> dict:
    """The recommendation and its comparison (what `ppprof tune --json` prints, less the plot path). `forwards`: the
    profile's samples, which a server that fits at boot fits its model to (else its model comes from the policy's)."""
    tuner = Tuner(policy, workload, num_stages, server, extrapolate=extrapolate, forwards=forwards)
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
    current_wins = scored_current.mean_ms < best.mean_ms  # the user's own calibration (ATOM) can beat ppprof's model
    if current_wins:
        best = scored_current
    best = Scored(best.setting, "recommended", best.ttft_ms, best.mean_ms, best.p90_ms, best.plans)
    best_fixed.label = "best fixed"
    optimal = tuner.optimal([best, best_fixed, scored_current, scored_policy])
    opt_ttft = np.array([t for _, t in optimal])
    calibration = None
    if best.setting.dynamic:  # the calibration the winner was scored with: the user's where their flags won
        calibration = (current_wins and current_calibration) or tuner.server.calibration(policy)
    env, args = tuner.server.format_flags(best.setting, calibration)
    args = tuner.server.format_parallel(num_stages, policy.tp_size) + args
    rows = [scored_current, scored_policy, best, best_fixed]
    mean_opt = float(opt_ttft @ tuner.weights)
    return {
        "server": tuner.server.name,
        "num_stages": num_stages,
        "latency_model": policy.model.name,
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
    if pp is not None and pp != tuner.num_stages:
        raise ValueError(
            f"--current sets {pp} pipeline stages but tune plans for {tuner.num_stages}: give --pp-size {pp}"
        )


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

"""`ppprof tune`: the server settings with the least predicted TTFT over a workload's prompt lengths.

For each candidate setting of one server (base chunk B on an aligned grid, smoothing factor s in [0.5, 1], the floor
or the cap, and fixed chunks), every prompt is chunked the way that server would chunk it (its own rule with the model
it would have: ppprof.policy.servers), and its TTFT is predicted with the policy's latency model (the best ppprof
fitted): TTFT = sum t + (P - 1) max t. The setting with the least weighted mean TTFT is recommended; the current
setting (or the server's defaults) and the best fixed chunk are scored the same way, and the DP-optimal plan of each
prompt (seeded with all of them) is the bound no setting can beat. Pure numpy; no torch.
"""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ppprof.checks import is_int
from ppprof.chunks import align_down, align_up
from ppprof.policy.export import server_model, server_setting
from ppprof.bounds import MAX_STAGES
from ppprof.policy.planners import chunk_latencies_ms, optimal_chunks, ttft_ms
from ppprof.policy.rule import LatencyModel
from ppprof.policy.schema import Policy, extrapolation
from ppprof.policy.servers import (CONTEXT_MARGIN, LABELS, SERVERS, ServerRule, ServerSetting, boot_model,
                                   chunk_sequence, command_line, cut, default_setting, format_flags, parse_flags,
                                   prefix_form, with_context)

MAX_LENGTHS = 32  # distinct prompt lengths planned; a trace with more is grouped into this many weighted quantiles
SMOOTH_FACTORS = tuple(round(0.5 + 0.05 * i, 2) for i in range(11))
B_STEPS_PER_OCTAVE = 4
PROMPT_COLUMNS = ("prompt_len", "prompt_lens", "prompt_length", "prompt_tokens", "num_prompt_tokens", "input_len",
                  "input_length", "input_tokens", "isl")
WEIGHT_COLUMNS = ("weight", "count", "frequency")
LIST_SPEC = re.compile(r"^\s*\d+(\s*:\s*[^,:\s]+)?(\s*,\s*\d+(\s*:\s*[^,:\s]+)?)*\s*,?\s*$")


@dataclass(frozen=True, slots=True)
class Workload:
    """Distinct prompt lengths with their weights (summing to 1) and a note when a trace was grouped."""

    prompt_lens: tuple[int, ...]
    weights: tuple[float, ...]
    note: str | None = None


def parse_prompt_spec(spec: str, context_len: int | None = None) -> Workload:
    """A list ("8192,32768,131072", weights as "8192:3,32768:1") or a file: one length a line (optionally
    "length,weight"), or a CSV whose header names a prompt-length column (PROMPT_COLUMNS) and optionally a weight
    column (WEIGHT_COLUMNS); a trace's rows count once each. ValueError (one line) naming what is wrong."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("--prompt-lens is empty: give lengths like 8192,32768 or a file of them")
    path = Path(spec)
    if path.is_file():
        pairs = read_prompt_file(path)
    elif LIST_SPEC.match(spec):
        pairs = []
        for item in spec.split(","):
            if not item.strip():
                continue
            length, _, weight = item.partition(":")
            pairs.append((length.strip(), weight.strip() or "1", f"--prompt-lens item {item.strip()!r}"))
    else:
        raise ValueError(f"--prompt-lens {spec!r} is neither a list of token counts (8192,32768) nor an existing file: "
                         f"give one")
    lengths, weights = [], []
    for length, weight, where in pairs:
        n, w = to_length(length, where), to_weight(weight, where)
        if context_len is not None and n > context_len:
            raise ValueError(f"{where}: prompt length {n} is beyond the policy's context length {context_len}: "
                             f"profile with a larger --context-len or drop it")
        lengths.append(n)
        weights.append(w)
    if not lengths:
        raise ValueError(f"--prompt-lens {spec!r} holds no prompt length: give at least one")
    return group(np.asarray(lengths, dtype=np.int64), np.asarray(weights, dtype=float))


def read_prompt_file(path: Path) -> list[tuple[str, str, str]]:
    """(length, weight, where) of each row of a prompt-length file (see parse_prompt_spec)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--prompt-lens file {path} is not readable text ({e.__class__.__name__}): give a text "
                         f"or CSV file") from None
    numbered = [(i, line) for i, line in enumerate(text.splitlines(), start=1)
                if line.strip() and not line.lstrip().startswith("#")]
    rows = [(i, [c.strip() for c in next(csv.reader([line]))]) for i, line in numbered]
    if not rows:
        raise ValueError(f"--prompt-lens file {path} holds no prompt length: one a line, or a CSV with a "
                         f"{PROMPT_COLUMNS[0]} column")
    header = [c.lower() for c in rows[0][1]]
    length_col, weight_col = 0, (1 if any(len(r) > 1 for _, r in rows) else None)
    if not all(re.fullmatch(r"[0-9.eE+-]+", c) for c in header):
        found = [i for i, c in enumerate(header) if c in PROMPT_COLUMNS]
        if not found:
            raise ValueError(f"--prompt-lens file {path} has columns {', '.join(rows[0][1])} but no prompt-length "
                             f"column: name one {' or '.join(PROMPT_COLUMNS[:3])}")
        length_col = found[0]
        weights = [i for i, c in enumerate(header) if c in WEIGHT_COLUMNS]
        weight_col = weights[0] if weights else None
        rows = rows[1:]
    out = []
    for line, row in rows:
        where = f"--prompt-lens file {path} line {line}"
        if length_col >= len(row) or not row[length_col]:
            raise ValueError(f"{where} has no prompt length: give one in every row")
        weight = row[weight_col] if weight_col is not None and weight_col < len(row) and row[weight_col] else "1"
        out.append((row[length_col], weight, where))
    return out


def to_length(text: str, where: str) -> int:
    if not re.fullmatch(r"\d+", text):
        raise ValueError(f"{where}: prompt length {text!r} is not a whole number of tokens: give one like 8192")
    n = int(text)
    if n < 1:
        raise ValueError(f"{where}: prompt length {n} must be at least 1 token")
    return n


def to_weight(text: str, where: str) -> float:
    try:
        w = float(text)
    except ValueError:
        raise ValueError(f"{where}: weight {text!r} is not a number: give a positive number") from None
    if not math.isfinite(w) or w <= 0:
        raise ValueError(f"{where}: weight {text} must be a positive finite number")
    return w


def group(lengths: np.ndarray, weights: np.ndarray) -> Workload:
    """Distinct lengths with summed weights; more than MAX_LENGTHS are grouped into weighted quantiles, each
    represented by its weighted mean length."""
    uniq, inverse = np.unique(lengths, return_inverse=True)
    summed = np.bincount(inverse, weights=weights)
    note = None
    if len(uniq) > MAX_LENGTHS:
        cum = np.cumsum(summed) / summed.sum()
        bins = np.minimum((cum * MAX_LENGTHS - 1e-12).astype(int), MAX_LENGTHS - 1)
        reps, ws = [], []
        for b in np.unique(bins):
            sel = bins == b
            reps.append(int(round(float(np.average(uniq[sel], weights=summed[sel])))))
            ws.append(float(summed[sel].sum()))
        note = f"{len(uniq)} distinct prompt lengths grouped into {len(reps)} weighted quantiles"
        uniq, summed = np.asarray(reps), np.asarray(ws)
    total = summed.sum()
    return Workload(tuple(int(v) for v in uniq), tuple(float(w / total) for w in summed), note)


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
        return {"label": self.label, "setting": self.setting.to_dict(), "mean_ttft_ms": self.mean_ms,
                "p90_ttft_ms": self.p90_ms,
                "per_prompt": [{"prompt_len": n, "ttft_ms": float(t), "num_chunks": len(p)}
                               for n, t, p in zip(workload.prompt_lens, self.ttft_ms, self.plans)]}


def weighted_p90(values: np.ndarray, weights: np.ndarray) -> float:
    order = np.argsort(values)
    cum = np.cumsum(weights[order])
    return float(values[order][min(int(np.searchsorted(cum, 0.9 - 1e-12)), len(values) - 1)])


class Tuner:
    """Scores settings of one server on one workload with the policy's model."""

    def __init__(self, policy: Policy, workload: Workload, num_stages: int, server: str, extrapolate: bool = False,
                 boot: dict | None = None):
        if server not in SERVERS:
            raise ValueError(f"--server {server!r} is unknown: use one of {', '.join(SERVERS)}")
        if not is_int(num_stages) or not 1 <= num_stages <= MAX_STAGES:
            raise ValueError(f"--pp {num_stages!r} is invalid: use a number of pipeline stages in 1..{MAX_STAGES}")
        if policy.model is None:
            raise ValueError(f"policy has no latency model ({policy.status}: {policy.reason}): refit with more samples")
        self.policy, self.num_stages, self.server = policy, num_stages, server
        self.truth = policy.model
        self.context = policy.settings.context_len
        self.lengths = np.asarray(workload.prompt_lens, dtype=np.int64)
        self.weights = np.asarray(workload.weights, dtype=float)
        self.longest = int(self.lengths.max())
        # The model the server sizes chunks with: its boot fit of the profile's samples where given, else derived
        # from the policy's model (servers.boot_model).
        self.model = boot[server] if boot and server in boot else server_model(policy, server)
        self.cache: dict[ServerSetting, Scored] = {}
        # Candidates keep their chunks within the profiled chunk sizes unless asked to extrapolate.
        dom = policy.data.get("domain") or {}
        self.max_chunk = None if extrapolate or not dom.get("chunk_size") else int(dom["chunk_size"][1])

    def model_for(self, calibration: LatencyModel | None = None) -> LatencyModel | None:
        """The model the server sizes chunks with; for ATOM, the calibration its flags carry where given."""
        if self.server == "atom" and calibration is not None:
            return boot_model("atom", calibration)
        return self.model

    def score(self, setting: ServerSetting, label: str = "", calibration: LatencyModel | None = None) -> Scored:
        if calibration is None and setting in self.cache:
            hit = self.cache[setting]
            return Scored(hit.setting, label or hit.label, hit.ttft_ms, hit.mean_ms, hit.p90_ms, hit.plans)
        rule = ServerRule(setting, self.model_for(calibration), self.context)
        chunks = chunk_sequence(rule.next if setting.dynamic else (lambda L: setting.fixed_chunk_size), self.longest)
        plans = [cut(chunks, int(n)) for n in self.lengths]
        ttft = np.array([ttft_ms(chunk_latencies_ms(self.truth, p), self.num_stages) for p in plans])
        scored = Scored(setting, label, ttft, float(ttft @ self.weights), weighted_p90(ttft, self.weights),
                        [[int(c) for c in p] for p in plans])
        if calibration is None:
            self.cache[setting] = scored
        return scored

    def base_grid(self, extra: list[int]) -> list[int]:
        """Aligned base chunk sizes, about B_STEPS_PER_OCTAVE an octave, from 2 alignment units to the longest
        prompt (or the context), with `extra` sizes added."""
        align = self.policy.settings.alignment
        hi = max(2 * align, min(self.context - CONTEXT_MARGIN["sglang"] - align, align_up(self.longest, align)))
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
        """Candidate dynamic settings at base chunk B: each smoothing factor with each floor (vllm-ascend, ATOM) or
        cap (SGLang)."""
        align, page = self.policy.settings.alignment, self.policy.settings.page_size
        out = []
        if self.server == "sglang":
            default_cap = default_setting("sglang").max_chunk_size
            caps = sorted({max(B, default_cap)} | {align_down(v, align) for v in (B // 2, 3 * B // 4) if v >= align})
            for s in smooth_factors:
                for cap in caps:
                    out.append(ServerSetting("sglang", B, True, s, max(B // 4, 1), cap, page))
        else:
            floors = sorted({align_down(B // k, align) for k in (8, 4, 2)} |
                            ({default_setting(self.server).min_chunk_size} if
                             default_setting(self.server).min_chunk_size <= B else set()))
            for s in smooth_factors:
                for floor in floors:
                    out.append(ServerSetting(self.server, B, True, s, floor, B, page))
        return out

    def fixed_setting(self, size: int) -> ServerSetting:
        page, d = self.policy.settings.page_size, default_setting(self.server)
        if self.server == "sglang":
            return ServerSetting("sglang", size, False, d.smooth_factor, max(size // 4, 1), max(size, d.max_chunk_size),
                                 page)
        return ServerSetting(self.server, size, False, d.smooth_factor, min(d.min_chunk_size, size), size, page)

    def search(self, extra: list[ServerSetting]) -> tuple[Scored, Scored]:
        """(best setting, best fixed setting): a coarse grid, then a finer one around the best of each."""
        align = self.policy.settings.alignment
        grid = self.base_grid([s.base_chunk_size for s in extra])
        fixed = [self.score(self.fixed_setting(B)) for B in grid]
        # With no model (SGLang's boot fit has a <= 0) dynamic chunking stays off: its candidates would be fixed ones.
        dynamic = [] if self.model is None else \
            [self.score(st) for B in grid for st in self.dynamic_settings(B, SMOOTH_FACTORS)]
        extras = [self.score(st) for st in extra if st.dynamic is False or self.model is not None]
        best_fixed = min(fixed, key=lambda r: r.mean_ms)
        best = min(fixed + dynamic + extras, key=lambda r: r.mean_ms)  # fixed first: a tie goes to fixed chunks
        # Refine: every aligned B between the grid neighbours of the best, smoothing factors 0.01 apart.
        for pick, is_fixed in ((best_fixed, True), (best, not best.setting.dynamic)):
            B = pick.setting.base_chunk_size
            i = grid.index(B) if B in grid else int(np.searchsorted(grid, B))
            lo = grid[max(0, i - 1)]
            hi = grid[min(len(grid) - 1, i + 1)]
            step = align * max(1, (hi - lo) // (align * 48))
            near = range(lo, hi + 1, step)
            if is_fixed:
                found = [self.score(self.fixed_setting(b)) for b in near]
                if pick is best_fixed:
                    best_fixed = min(found + [best_fixed], key=lambda r: r.mean_ms)
                else:
                    best = min(found + [best], key=lambda r: r.mean_ms)
            else:
                s0 = pick.setting.smooth_factor
                smooth = sorted({round(min(1.0, max(0.5, s0 + 0.01 * k)), 2) for k in range(-5, 6)})
                found = [self.score(st) for b in near for st in self.dynamic_settings(b, smooth)
                         if self.same_knob(st, pick.setting, b)]
                best = min(found + [best], key=lambda r: r.mean_ms)
        best = min([best, best_fixed], key=lambda r: r.mean_ms)
        return best, best_fixed

    def same_knob(self, st: ServerSetting, pick: ServerSetting, B: int) -> bool:
        """Refinement keeps the floor (or the cap) in the same proportion to B as the best setting's."""
        if self.server == "sglang":
            return (st.max_chunk_size >= B) == (pick.max_chunk_size >= pick.base_chunk_size) and \
                (st.max_chunk_size >= B or abs(st.max_chunk_size / B - pick.max_chunk_size / pick.base_chunk_size)
                 < 0.13)
        return abs(st.min_chunk_size / B - pick.min_chunk_size / pick.base_chunk_size) < 0.13

    def optimal(self, seeds: list[Scored]) -> list[tuple[list[int], float]]:
        """The DP-optimal plan of each prompt (chunks up to the largest any candidate uses), seeded with `seeds`' plans
        so it is never worse than any of them."""
        largest = max([self.policy.settings.base_chunk_size] + [max(p) for s in seeds for p in s.plans])
        out = []
        for i, n in enumerate(self.lengths):
            plans = [s.plans[i] for s in seeds]
            chunks, _ = optimal_chunks(self.truth, int(n), self.num_stages, self.policy.settings.alignment,
                                       largest, plans)
            out.append((chunks, ttft_ms(chunk_latencies_ms(self.truth, chunks), self.num_stages)))
        return out


def tune(policy: Policy, workload: Workload, num_stages: int, server: str = "sglang",
         current: str | None = None, extrapolate: bool = False, boot: dict | None = None) -> dict:
    """The recommendation and its comparison (what `ppprof tune --json` prints, less the plot path). `boot`: the
    model the server fits at boot ({server: model or None}), where known from the profile's samples."""
    tuner = Tuner(policy, workload, num_stages, server, extrapolate=extrapolate, boot=boot)
    page = policy.settings.page_size
    if current is not None:
        current_setting, calibration, ignored = parse_flags(server, current, page)
        current_label = "current"
    else:
        current_setting, calibration, ignored = default_setting(server, page), None, []
        current_label = "server default"
    current_setting = with_context(current_setting, policy.settings.context_len)
    scored_current = tuner.score(current_setting, current_label, calibration)
    own = server_setting(policy, server)
    if tuner.model is None:
        own = replace(own, dynamic=False)
    scored_policy = tuner.score(own, "policy")
    inside = [st for st in (own, current_setting)
              if tuner.max_chunk is None or max(st.base_chunk_size, st.fixed_chunk_size) <= tuner.max_chunk]
    best, best_fixed = tuner.search(inside)
    if scored_current.mean_ms < best.mean_ms:  # the user's own calibration (ATOM) can beat ppprof's model
        best = scored_current
    best = Scored(best.setting, "recommended", best.ttft_ms, best.mean_ms, best.p90_ms, best.plans)
    best_fixed.label = "best fixed"
    optimal = tuner.optimal([best, best_fixed, scored_current, scored_policy])
    opt_ttft = np.array([t for _, t in optimal])
    calibration_out = None
    if server == "atom" and best.setting.dynamic:
        calibration_out = calibration if best is scored_current and calibration is not None else \
            prefix_form(policy.model, policy.data.get("domain"))
    env, args = format_flags(best.setting, calibration_out)
    rows = [scored_current, scored_policy, best, best_fixed]
    notes = []
    if policy.status != "dynamic":
        notes.append(f"the policy is {policy.status} ({policy.reason}): its model failed ppprof's quality gates, so "
                     f"these predictions are less reliable; profile again on a quiet machine")
    if boot and server in boot:
        m = boot[server]
        notes.append(f"{LABELS[server]}'s boot fit of the profile's prefix-free samples: " +
                     (f"a={m.a:.4g}, b={m.b:.4g}, c={m.c:.4g}" if m is not None else
                      "none it would use (a <= 0 or too few points): it keeps fixed chunks"))
    if tuner.max_chunk is not None:
        notes.append(f"candidates keep chunks within the profiled chunk sizes (up to {tuner.max_chunk} tokens); "
                     f"profile with a larger --base-chunk-size, or pass --extrapolate, to search beyond")
    for r in (best, scored_current):
        longest = int(np.argmax(workload.prompt_lens))
        note = extrapolation(policy, workload.prompt_lens[longest], r.plans[longest])
        if note:
            notes.append(f"{r.label}: {note}")
    if workload.note:
        notes.insert(0, workload.note)
    if ignored:
        notes.append(f"--current: ignored {' '.join(ignored)} (not a chunking flag of {LABELS[server]})")
    mean_opt = float(opt_ttft @ tuner.weights)
    return {
        "server": server, "num_stages": num_stages, "latency_model": policy.model.name,
        "boot_fit": "samples" if boot and server in boot else "model",
        "workload": {"prompt_lens": list(workload.prompt_lens), "weights": list(workload.weights)},
        "recommended": {"env": env, "args": args, "command": command_line(env, args),
                        "setting": best.setting.to_dict()},
        "settings": {r.label: r.to_dict(workload) for r in rows},
        "optimal": {"mean_ttft_ms": mean_opt, "p90_ttft_ms": weighted_p90(opt_ttft, tuner.weights),
                    "per_prompt": [{"prompt_len": int(n), "ttft_ms": float(t), "num_chunks": len(c)}
                                   for n, (c, t) in zip(workload.prompt_lens, optimal)]},
        "gain": {"vs_" + key: 1.0 - best.mean_ms / r.mean_ms for key, r in
                 (("current", scored_current), ("policy", scored_policy), ("best_fixed", best_fixed))},
        "gap_to_optimal": best.mean_ms / mean_opt - 1.0,
        "plans": {str(n): {"current": scored_current.plans[i], "policy": scored_policy.plans[i],
                           "recommended": best.plans[i], "best-fixed": best_fixed.plans[i],
                           "optimal": optimal[i][0]} for i, n in enumerate(workload.prompt_lens)},
        "notes": notes,
        "surface": surface(tuner),
    }


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
    return {"fixed": sorted(fixed.items()),
            "dynamic": {f"{s:g}": sorted(v.items()) for s, v in sorted(dyn.items()) if s in SMOOTH_FACTORS}}


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
    marks = {"server default": ("x", "tab:red"), "current": ("x", "tab:red"), "policy": ("o", "tab:blue"),
             "recommended": ("*", "tab:green"), "best fixed": ("s", "black")}
    for label, r in result["settings"].items():
        marker, color = marks.get(label, ("o", "grey"))
        ax.scatter([r["setting"]["base_chunk_size"]], [r["mean_ttft_ms"]], marker=marker, color=color, s=90, zorder=5,
                   label=f"{label}: {r['mean_ttft_ms']:.1f} ms")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("base chunk size B (tokens)")
    ax.set_ylabel("predicted TTFT, weighted mean over the prompts (ms)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save_figure(fig, path)

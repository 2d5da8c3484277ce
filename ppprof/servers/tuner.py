"""What `ppprof tune` scores with (the Tuner): one server's settings on one workload, every prompt chunked the way that
server would chunk it and its TTFT predicted with the policy's latency model; the candidate grid, the search and the
DP-optimal bound. Pure numpy; no torch."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from ppprof.bounds import MAX_STAGES
from ppprof.checks import is_int
from ppprof.chunks import align_down, align_up
from ppprof.config import CONTEXT_MARGIN
from ppprof.config.workload import Workload
from ppprof.policy.planners import chunk_latencies_ms, optimal_chunks, ttft_ms
from ppprof.policy.rule import LatencyModel
from ppprof.policy.runtime import Policy
from ppprof.servers.base import ServerSetting
from ppprof.servers.boot import Forwards
from ppprof.servers.registry import DEFAULT_SERVER, get

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
    load: dict | None = None
    """Under load (`tune --concurrency`): each level's throughput and TTFT in the serving simulation."""

    @property
    def objective(self) -> float:
        """What the search minimises: the weighted mean TTFT of the prompts alone; under load, the geometric mean of
        it and each level's mean TTFT (so that each level weighs the same whatever its scale)."""
        if not self.load:
            return self.mean_ms
        means = [self.mean_ms, *(level["ttft_mean_ms"] for level in self.load.values())]
        return float(np.exp(np.mean(np.log(means))))

    def to_dict(self, workload: Workload) -> dict:
        out = {
            "label": self.label,
            "setting": self.setting.to_dict(),
            "mean_ttft_ms": self.mean_ms,
            "p90_ttft_ms": self.p90_ms,
            "per_prompt": [
                {"prompt_len": n, "ttft_ms": float(t), "num_chunks": len(p)}
                for n, t, p in zip(workload.prompt_lens, self.ttft_ms, self.plans)
            ],
        }
        return out | ({"load": self.load, "objective_ms": self.objective} if self.load else {})


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
        pp_size: int,
        server: str = DEFAULT_SERVER,
        extrapolate: bool = False,
        forwards: Forwards | None = None,
        load_score: Callable[[np.ndarray], dict] | None = None,
    ):
        """`load_score`: the figures under load of the chunks of the longest prompt (ppprof.serving.tuning), which
        then join the objective the search minimises (Scored.objective); None: alone only."""
        self.server = get(server)
        self.load_score = load_score
        if not is_int(pp_size) or not 1 <= pp_size <= MAX_STAGES:
            raise ValueError(f"--pp {pp_size!r} is invalid: use a number of pipeline stages in 1..{MAX_STAGES}")
        if policy.latency_model is None:
            raise ValueError(f"policy has no latency model ({policy.status}: {policy.reason}): refit with more samples")
        self.policy, self.pp_size, self.workload = policy, pp_size, workload
        self.truth = policy.latency_model
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
        dom = policy.report.domain or {}
        self.max_chunk = None if extrapolate or not dom.get("chunk_size") else int(dom["chunk_size"][1])

    def model_for(self, calibration: LatencyModel | None = None) -> LatencyModel | None:
        """The model the server sizes chunks with; the calibration its flags carry where given (ATOM)."""
        return self.server.boot_model(calibration) if calibration is not None else self.model

    def score(self, setting: ServerSetting, label: str = "", calibration: LatencyModel | None = None) -> Scored:
        if calibration is None and setting in self.cache:
            hit = self.cache[setting]
            return replace(hit, label=label or hit.label)
        chunks = np.asarray(
            self.server.chunks(setting, self.model_for(calibration), self.context, self.longest), dtype=np.int64
        )
        plans = [cut(chunks, int(n)) for n in self.lengths]
        ttft = np.array([ttft_ms(chunk_latencies_ms(self.truth, p), self.pp_size) for p in plans])
        scored = Scored(
            setting,
            label,
            ttft,
            float(ttft @ self.weights),
            weighted_p90(ttft, self.weights),
            [[int(c) for c in p] for p in plans],
            None if self.load_score is None else self.load_score(chunks),
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
        best_fixed = min(fixed, key=lambda r: r.objective)
        best = min(fixed + dynamic + extras, key=lambda r: r.objective)  # fixed first: a tie goes to fixed chunks
        best_fixed = self.refine(grid, best_fixed, is_fixed=True)
        best = self.refine(grid, best, not best.setting.dynamic)
        best = min([best, best_fixed], key=lambda r: r.objective)
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
        return min(found + [pick], key=lambda r: r.objective)

    def optimal(self, seeds: list[Scored]) -> list[tuple[list[int], float]]:
        """The DP-optimal plan of each prompt (chunks up to the largest any candidate uses), seeded with `seeds`' plans
        so it is never worse than any of them."""
        largest = max([self.policy.settings.base_chunk_size] + [max(p) for s in seeds for p in s.plans])
        out = []
        for i, n in enumerate(self.lengths):
            plans = [s.plans[i] for s in seeds]
            chunks, _ = optimal_chunks(self.truth, int(n), self.pp_size, self.policy.settings.alignment, largest, plans)
            out.append((chunks, ttft_ms(chunk_latencies_ms(self.truth, chunks), self.pp_size)))
        return out

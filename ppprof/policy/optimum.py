"""The optimum the policy carries: TeraPipe's DP for every prompt length at once, the bounded-latency rules whose plans
come within a tolerance of it, and the tables that store them.

A bounded rule with bound M (ms) and cap X (tokens) gives, after L cached tokens, the largest aligned chunk x <= X whose
latency t(L, x) (the planning model: the fitted chunk latency plus the per-chunk pipeline overhead) is at most M, and
at least one alignment unit. Its chunks shrink as the prefix grows, every chunk about M; the DP's optimal plan with
largest chunk latency M* is such a plan with M = M* (the fewest chunks within M*), up to the placement of its last
chunk. So:

- the prompt-aware rule (the server knows the prompt's length): per band of prompt lengths, one bound M and a merge
  length m: the next chunk is the rule's x, or the whole rest when the rest is at most x + m (a tiny tail joins the
  chunk before it). Bands are built so that every aligned prompt length of the domain plans within the tolerance of
  the DP's lower bound.
- the history-only rule (the server passes only the prefix length): one (M, X) for a workload of prompt lengths,
  the least weighted mean TTFT over a grid of bounds and caps; the caps alone (M infinite) are the fixed chunks, so
  it is never above the best fixed chunk on that workload.

Predicted TTFT on P stages: sum t + (P - 1) max t (ppprof.policy.planners). Pure numpy; no torch.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from ppprof.chunks import walk
from ppprof.policy.rule import LatencyModel

BOUND_STEP = 1.004
"""Ratio between neighbouring bounds of the all-lengths DP: its lower and upper bounds on the optimum differ by about
(P - 1) x 0.4% of the largest chunk latency (the rules are built and checked against the lower one)."""
RULE_BOUNDS = 240
"""Bounds M tried for the prompt-aware rule's bands (log-spaced over the chunk latencies of the domain)."""
HISTORY_BOUNDS = 96
"""Bounds M tried for the history-only rule (with every cap)."""
MERGE_UNITS = (0, 1, 2, 4, 8)
"""Merge lengths tried, in units."""
PROMPT_TOLERANCE = 0.008
"""Build tolerance of the prompt-aware rule against the DP's lower bound at every aligned prompt length (the promise
is 1%; the margin covers lengths between the aligned ones)."""


EXTRAPOLATED_CHUNKS = 4
"""With --extrapolate a plan's largest chunk is this many base chunks (or the largest profiled, if larger)."""
MAX_WINDOW_UNITS = 128
"""The most units in one chunk of the DP (the largest chunk / the unit)."""
MAX_POSITIONS = 2048
"""The most positions of the DP (the longest prompt / the unit)."""
WALK_BATCH = 1024
"""The history rule's candidates walked at a time: their walks stay a few MB (all at once: ~1 GB, 3x slower)."""


@dataclass(frozen=True, slots=True)
class Domain:
    """Where plans may go: chunks are multiples of `unit` up to `largest_chunk`; prompts up to `max_prompt_len`."""

    unit: int
    largest_chunk: int
    max_prompt_len: int

    def sizes(self) -> np.ndarray:
        """The chunk sizes a rule may give: unit .. largest_chunk."""
        return np.arange(self.unit, self.largest_chunk + 1, self.unit, dtype=np.int64)


def make_domain(alignment: int, largest_chunk: int, max_prompt_len: int) -> Domain:
    """The domain of the rules and the DP: the unit is the alignment, coarsened (by a whole factor) to at most
    MAX_WINDOW_UNITS units a chunk and MAX_POSITIONS positions a prompt; the largest chunk a whole number of units."""
    factor = max(
        1,
        math.ceil(largest_chunk / (alignment * MAX_WINDOW_UNITS)),
        math.ceil(max_prompt_len / (alignment * MAX_POSITIONS)),
    )
    unit = alignment * factor
    return Domain(unit, max(unit, largest_chunk // unit * unit), max_prompt_len)


def ttft(sums, maxes, num_stages: int):
    return sums + (num_stages - 1) * maxes


# -- the DP for every prompt length --------------------------------------------------------------------------------


def latency_range(model: LatencyModel, dom: Domain) -> tuple[float, float]:
    """The cheapest chunk of the domain (one unit, no prefix) and the dearest (the largest after the longest prompt)."""
    return (
        float(model.chunk_latency_ms(0, dom.unit)),
        float(model.chunk_latency_ms(dom.max_prompt_len, dom.largest_chunk)),
    )


def bound_grid(model: LatencyModel, dom: Domain, step: float = BOUND_STEP) -> np.ndarray:
    """Log-spaced bounds over latency_range, ratio `step` apart."""
    lo, hi = latency_range(model, dom)
    n = max(2, int(math.ceil(math.log(hi / lo) / math.log(step))) + 1)
    return lo * step ** np.arange(n)


def all_min_sums(model: LatencyModel, dom: Domain, bounds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """S[j, m]: the least sum of chunk latencies of a prompt of pos[j] tokens with every chunk aligned (but the last,
    where the prompt is not), at most largest_chunk and of latency <= bounds[m]; inf where no plan fits. Every prefix
    of a plan is a plan of a shorter prompt, so one pass over positions gives every aligned length."""
    align = dom.unit
    pos = np.arange(0, dom.max_prompt_len + 1, align, dtype=np.int64)
    window = dom.largest_chunk // align
    total = np.full((len(pos), len(bounds)), np.inf)
    total[0] = 0.0
    for j in range(1, len(pos)):
        lo = max(0, j - window)
        start = pos[lo:j].astype(float)
        cost = model.chunk_latency_ms(start, pos[j] - start)[:, None]
        cand = np.where(cost <= bounds[None, :], total[lo:j] + cost, np.inf)
        total[j] = cand.min(axis=0)
    return pos, total


def optimum_bounds(sums: np.ndarray, bounds: np.ndarray, num_stages: int) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) bounds of the least TTFT from S(M) on the bound grid: an optimal plan with largest latency
    M* in (M_i, M_i+1] has sum >= S(M_i+1), so TTFT* >= S(M_i+1) + (P - 1) M_i; and S(M_i) + (P - 1) M_i is met by a
    plan. The lowest bound is the cheapest chunk, below every plan's largest."""
    P1 = num_stages - 1
    upper = (sums + P1 * bounds[None, :]).min(axis=1)
    lower = np.minimum((sums[:, 1:] + P1 * bounds[None, :-1]).min(axis=1), sums[:, 0] + P1 * bounds[0])
    return lower, upper


def optimum_table(model: LatencyModel, dom: Domain, num_stages: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(prompt lengths, lower, upper): the DP optimum's bounds at every aligned prompt length of the domain."""
    bounds = bound_grid(model, dom)
    pos, sums = all_min_sums(model, dom, bounds)
    lower, upper = optimum_bounds(sums[1:], bounds, num_stages)
    return pos[1:], lower, upper


# -- bounded rules ---------------------------------------------------------------------------------------------------


def bounded_sizes(
    model: LatencyModel, bounds: np.ndarray, caps: np.ndarray, prefix_len: np.ndarray, unit: int
) -> np.ndarray:
    """The bounded rule's chunk after prefix_len[k] for each (bounds[k], caps[k]): the largest multiple of the
    unit <= cap whose latency is <= the bound, at least one unit. The root of
    (a + h L) x^2 + (2 a L + b) x + (c + g L - M) = 0, aligned down, then checked against the model itself."""
    L = prefix_len.astype(float)
    qa = model.a + model.h * L
    qb = 2.0 * model.a * L + model.b
    qc = model.c + model.g * L - bounds
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        disc = qb * qb - 4.0 * qa * qc
        # qa > 0: the larger root; qa < 0 (a pairs model's h < 0 at a long prefix: concave in x): the smaller, the
        # first crossing of the bound, none (no cap from the bound) where the latency never reaches it; qa == 0: linear.
        root = np.where(
            qa != 0,
            (-qb + np.sqrt(np.maximum(disc, 0.0))) / (2.0 * np.where(qa != 0, qa, 1.0)),
            np.where(qb > 0, -qc / np.where(qb > 0, qb, 1.0), np.inf),
        )
        root = np.where((qa < 0) & (disc < 0), np.inf, root)
    root = np.where(np.isfinite(bounds), root, np.inf)
    x = np.floor(np.minimum(root, caps) / unit) * unit
    x = np.clip(x, unit, caps).astype(np.int64)
    # Float rounding at the boundary: one unit down where the aligned root still costs more than the bound.
    over = (x > unit) & (model.chunk_latency_ms(L, x) > bounds)
    return np.where(over, x - unit, x)


@dataclass(slots=True)
class Walks:
    """The chunk boundaries of many bounded rules walked from prefix 0 to `end`: starts[k, r] is rule r's k-th chunk
    start (end once past it); sums[k, r] and maxes[k, r] the sum and largest latency of its first k chunks."""

    starts: np.ndarray
    sums: np.ndarray
    maxes: np.ndarray
    sizes: np.ndarray


def walk_rules(model: LatencyModel, bounds: np.ndarray, caps: np.ndarray, unit: int, end: int) -> Walks:
    """Every rule (bounds[r], caps[r]) walked at once, chunk by chunk, until each has passed `end`."""
    # Every chunk is at least one unit: at most ceil(end / unit) chunks, rows written in place. Only the rules not
    # yet past `end` are walked on: a rule of large chunks ends in a few steps, so with every cap (the history rule's
    # thousands of rules) that is a twentieth of walking all of them every step.
    steps, n = -(-end // unit), len(bounds)
    starts, sums, maxes = (np.zeros((steps + 1, n), dtype=np.int64), np.zeros((steps + 1, n)), np.zeros((steps + 1, n)))
    sizes = np.zeros((steps, n), dtype=np.int64)
    L, s, m = np.zeros(n, dtype=np.int64), np.zeros(n), np.zeros(n)
    live, k = np.flatnonzero(L < end), 0
    while live.size:
        at = L[live]
        x = bounded_sizes(model, bounds[live], caps[live], at, unit)
        t = model.chunk_latency_ms(at, x)
        s[live] += t
        m[live] = np.maximum(m[live], t)
        L[live] = at + x
        k += 1
        starts[k], sums[k], maxes[k] = L, s, m
        sizes[k - 1, live] = x
        live = live[L[live] < end]
    return Walks(starts[: k + 1], sums[: k + 1], maxes[: k + 1], sizes[:k])


def rule_ttft(
    model: LatencyModel,
    walks: Walks,
    r: int,
    lengths: np.ndarray,
    merge: int,
    num_stages: int,
    largest: int | None = None,
) -> np.ndarray:
    """TTFT of rule r's plan of each prompt length (sorted): chunks up to the last start below the length, then the
    rest; with `merge` > 0, a rest of at most `merge` tokens joins the chunk before it where that stays within
    `largest`."""
    starts = walks.starts[:, r]
    j = np.searchsorted(starts, lengths, side="left") - 1  # the last chunk starts at starts[j] < length
    if merge:
        joined = (j >= 1) & (lengths - starts[j] <= merge) & (lengths - starts[np.maximum(j - 1, 0)] <= largest)
        j = np.where(joined, j - 1, j)
    L = starts[j]
    t = model.chunk_latency_ms(L, lengths - L)
    return ttft(walks.sums[j, r] + t, np.maximum(walks.maxes[j, r], t), num_stages)


def rule_bounds(model: LatencyModel, dom: Domain, count: int) -> np.ndarray:
    """`count` bounds log-spaced over the domain's chunk latencies, the latency of every first chunk size (the bound
    that lets the first chunk be that size and every later one as large as it may), and no bound (inf) last."""
    lo, hi = latency_range(model, dom)
    first = model.chunk_latency_ms(0, dom.sizes()) * (1.0 + 1e-12)
    return np.concatenate([np.unique(np.concatenate([np.geomspace(lo, hi, count), first])), [np.inf]])


def rule_table(model: LatencyModel, bound: float, cap: int, unit: int, end: int) -> tuple[list[int], list[int]]:
    """Breakpoints (prefix_len starts, chunk sizes) of the bounded rule (bound, cap), exact on prefixes 0 .. end - 1
    (evaluated at every one): size(L) = sizes[i] for the last i with starts[i] <= L."""
    L = np.arange(end, dtype=np.int64)
    size = bounded_sizes(model, np.full(end, bound), np.full(end, cap), L, unit)
    change = np.flatnonzero(np.diff(size)) + 1
    starts = np.concatenate([[0], change])
    return [int(v) for v in starts], [int(v) for v in size[starts]]


def optimum_at(
    model: LatencyModel,
    dom: Domain,
    pos: np.ndarray,
    sums: np.ndarray,
    bounds: np.ndarray,
    lengths: np.ndarray,
    num_stages: int,
    block: int = 256,
) -> tuple[np.ndarray, np.ndarray]:
    """(lower, upper) bounds of the least TTFT at any prompt lengths (aligned or not) from all_min_sums: the last
    chunk runs from an aligned position below the length, at most largest_chunk before it. `block` lengths at a
    time keep the arrays small."""
    window = dom.largest_chunk // dom.unit
    lower, upper = np.empty(len(lengths)), np.empty(len(lengths))
    sums32, columns = sums.astype(np.float32), np.arange(len(bounds))
    for b in range(0, len(lengths), block):
        n = lengths[b : b + block]
        hi = np.searchsorted(pos, n, side="left")  # the last chunk starts at pos[hi - 1 - k], k = 0 .. window - 1
        best = np.full((len(n), len(bounds)), np.inf, dtype=np.float32)
        cand = np.empty_like(best)
        for k in range(window):
            i = np.maximum(hi - 1 - k, 0)
            valid = (hi - 1 - k >= 0) & (n - pos[i] <= dom.largest_chunk)
            start = pos[i].astype(float)
            cost = np.where(valid, model.chunk_latency_ms(start, n - start), np.inf)
            # bounds are sorted: the chunk fits the bounds from the first one >= its cost on
            fits = np.searchsorted(bounds, cost, side="left")
            np.add(sums32[i], cost[:, None].astype(np.float32), out=cand)
            cand[columns[None, :] < fits[:, None]] = np.inf
            np.minimum(best, cand, out=best)
        lower[b : b + block], upper[b : b + block] = optimum_bounds(best.astype(float), bounds, num_stages)
    return lower, upper


# -- the prompt-aware rule ------------------------------------------------------------------------------------------


@dataclass(slots=True)
class PromptRule:
    """The prompt-aware rule as it is stored: band i holds the prompts of prompt_len[i] .. prompt_len[i+1] - 1
    tokens; after L cached tokens of such a prompt of N tokens, the next chunk is x = chunk_size[i][j] for the last j
    with prefix_len[i][j] <= L, or the whole rest N - L where that is at most x + merge_len[i] and largest_chunk."""

    prompt_len: list[int]
    bound_ms: list[float]
    merge_len: list[int]
    prefix_len: list[list[int]]
    chunk_size: list[list[int]]
    largest_chunk: int

    def next_chunk_size(self, prefix_len: int, prompt_len: int) -> int:
        i = bisect_right(self.prompt_len, prompt_len) - 1
        x = self.chunk_size[i][bisect_right(self.prefix_len[i], prefix_len) - 1]
        rest = prompt_len - prefix_len
        return rest if rest <= min(x + self.merge_len[i], self.largest_chunk) else x

    def plan(self, prompt_len: int) -> list[int]:
        return walk(lambda done: self.next_chunk_size(done, prompt_len), prompt_len)

    def to_dict(self, dom: Domain) -> dict:
        """The policy's prompt_table (a bound of None: no bound), with the domain's unit, largest chunk and longest
        prompt."""
        return {
            "prompt_len": self.prompt_len,
            "bound_ms": [b if math.isfinite(b) else None for b in self.bound_ms],
            "merge_len": self.merge_len,
            "prefix_len": self.prefix_len,
            "chunk_size": self.chunk_size,
            "unit": dom.unit,
            "largest_chunk": self.largest_chunk,
            "max_prompt_len": dom.max_prompt_len,
        }

    @classmethod
    def from_dict(cls, d: dict) -> PromptRule:
        bounds = [math.inf if b is None else float(b) for b in d["bound_ms"]]
        return cls(
            list(d["prompt_len"]),
            bounds,
            list(d["merge_len"]),
            [list(v) for v in d["prefix_len"]],
            [list(v) for v in d["chunk_size"]],
            int(d["largest_chunk"]),
        )

    @classmethod
    def fixed(cls, chunk_size: int) -> PromptRule:
        """One band of one entry: every chunk `chunk_size` (a static policy)."""
        return cls([1], [math.inf], [0], [[0]], [[chunk_size]], chunk_size)


def pieces(dom: Domain, per_unit: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """(first, last) prompt length of each piece [k s + 1, (k + 1) s], s = unit / `per_unit`, over the domain.
    A bounded rule's plan gains a chunk (or stops merging its tail) one token past a multiple of the unit, so
    within a piece only its last chunk grows, and its TTFT with it: a piece is checked at its two ends."""
    step = max(1, dom.unit // per_unit)
    first = np.arange(1, dom.max_prompt_len + 1, step, dtype=np.int64)
    return first, np.minimum(first + step - 1, dom.max_prompt_len)


def longest_runs(ok: np.ndarray) -> np.ndarray:
    """run[..., k]: how many consecutive True from index k on along the last axis."""
    run = np.zeros(ok.shape, dtype=np.int64)
    acc = np.zeros(ok.shape[:-1], dtype=np.int64)
    for k in range(ok.shape[-1] - 1, -1, -1):
        acc = np.where(ok[..., k], acc + 1, 0)
        run[..., k] = acc
    return run


@dataclass(slots=True)
class Candidates:
    """The bounded rules (with merge lengths) a prompt-aware rule chooses from, scored on the pieces of the domain:
    ratio[g, r, k] is the worst of rule r with merges[g] at the two ends of piece k against the DP's lower bound."""

    bounds: np.ndarray
    merges: list[int]
    walks: Walks
    ratio: np.ndarray


def score_candidates(model: LatencyModel, dom: Domain, num_stages: int) -> tuple[Candidates, np.ndarray]:
    """Every candidate's ratio on every piece, and the pieces' first lengths."""
    first, last = pieces(dom)
    lengths = np.concatenate([first, last])
    grid = bound_grid(model, dom)
    pos, sums = all_min_sums(model, dom, grid)
    lower, _ = optimum_at(model, dom, pos, sums, grid, lengths, num_stages)
    bounds = rule_bounds(model, dom, RULE_BOUNDS)
    walks = walk_rules(
        model, bounds, np.full(len(bounds), dom.largest_chunk, dtype=np.int64), dom.unit, dom.max_prompt_len
    )
    merges = [u * dom.unit for u in MERGE_UNITS]
    ratio = np.full((len(merges), len(bounds), len(first)), np.inf)
    for r in range(len(bounds)):
        for g, merge in enumerate(merges):
            both = rule_ttft(model, walks, r, lengths, merge, num_stages, dom.largest_chunk) / lower
            ratio[g, r] = np.maximum(both[: len(first)], both[len(first) :])
    return Candidates(bounds, merges, walks, ratio), first


def cover(ratio: np.ndarray, tolerance: float) -> list[tuple[int, int, int]]:
    """Bands (first piece, merge index, rule index): from each band's first piece, the candidate within the tolerance
    over the most pieces (where none is, the best candidate for that piece alone)."""
    runs = longest_runs(ratio <= 1.0 + tolerance)
    bands, k = [], 0
    while k < ratio.shape[-1]:
        run = runs[:, :, k]
        g, r = np.unravel_index(int(run.argmax()), run.shape)
        if run[g, r] == 0:
            g, r = np.unravel_index(int(ratio[:, :, k].argmin()), run.shape)
        bands.append((k, int(g), int(r)))
        k += max(1, int(run[g, r]))
    return bands


def build_prompt_rule(
    model: LatencyModel, dom: Domain, num_stages: int, tolerance: float = PROMPT_TOLERANCE
) -> tuple[PromptRule, dict]:
    """The prompt-aware rule: bands of prompt lengths, each the bounded rule (and merge length) whose plans stay
    within `tolerance` of the DP's lower bound over the most pieces of the domain from the band's start. Returns the
    rule and how close it came: {"max_ratio": the worst ratio on the pieces' ends, "bands": how many}."""
    cand, first = score_candidates(model, dom, num_stages)
    bands = cover(cand.ratio, tolerance)
    rule = PromptRule([], [], [], [], [], dom.largest_chunk)
    worst = 0.0
    for n, (k, g, r) in enumerate(bands):
        end = bands[n + 1][0] if n + 1 < len(bands) else len(first)
        worst = max(worst, float(cand.ratio[g, r, k:end].max()))
        starts, sizes = rule_table(model, float(cand.bounds[r]), dom.largest_chunk, dom.unit, dom.max_prompt_len)
        rule.prompt_len.append(int(first[k]))
        rule.bound_ms.append(float(cand.bounds[r]))
        rule.merge_len.append(cand.merges[g])
        rule.prefix_len.append(starts)
        rule.chunk_size.append(sizes)
    return rule, {"max_ratio": worst, "bands": len(bands)}


# -- the history-only rule and the fixed chunks ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HistoryRule:
    """The history-only rule (bound_ms, chunk_cap; bound_ms inf: fixed chunks of chunk_cap) with its weighted mean
    predicted TTFT on the workload it was chosen for, and the best fixed chunk's on the same workload."""

    bound_ms: float
    chunk_cap: int
    mean_ttft_ms: float
    fixed_chunk: int
    fixed_mean_ttft_ms: float


def workload_ttft(
    model: LatencyModel, walks: Walks, lengths: np.ndarray, weights: np.ndarray, num_stages: int
) -> np.ndarray:
    """Weighted mean TTFT of every walked rule's plans of the workload's prompt lengths."""
    order = np.argsort(lengths)
    lengths, weights = lengths[order], weights[order]
    return np.array(
        [rule_ttft(model, walks, r, lengths, 0, num_stages) @ weights for r in range(walks.starts.shape[1])]
    )


def build_history_rule(model: LatencyModel, dom: Domain, num_stages: int, lengths, weights) -> HistoryRule:
    """The bounded rule, over HISTORY_BOUNDS bounds (and none) and every cap, with the least weighted mean TTFT on
    the workload; with no bound the rule is fixed chunks of its cap, so the choice is never above the best fixed
    chunk's."""
    lengths = np.asarray(lengths, dtype=np.int64)
    weights = np.asarray(weights, dtype=float)
    caps = dom.sizes()
    levels = rule_bounds(model, dom, HISTORY_BOUNDS)
    bounds = np.repeat(levels, len(caps))
    cap_of = np.tile(caps, len(levels))
    # The rules in batches: every rule's walk at once would hold 4 arrays of (steps x rules), ~1 GB at a long context
    mean = np.concatenate(
        [
            workload_ttft(
                model,
                walk_rules(model, bounds[i : i + WALK_BATCH], cap_of[i : i + WALK_BATCH], dom.unit, int(lengths.max())),
                lengths,
                weights,
                num_stages,
            )
            for i in range(0, len(bounds), WALK_BATCH)
        ]
    )
    fixed = np.flatnonzero(~np.isfinite(bounds))
    f = int(fixed[np.argmin(mean[fixed])])
    r = int(np.argmin(mean))
    if mean[r] >= mean[f]:
        r = f
    return HistoryRule(float(bounds[r]), int(cap_of[r]), float(mean[r]), int(cap_of[f]), float(mean[f]))

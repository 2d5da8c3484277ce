"""Live forwards: those a refit or a drift check takes (`live_forwards`: each (stage, TP rank)'s first forward dropped,
as it ran cold; those past the policy's context and the absurd ones skipped, all counted by reason), and against a
policy's predictions per stage and prefix band: the drift report `ppprof calibrate` prints, and the rows the check
`ppprof compare POLICY TRACE` judges (ppprof.compare.forwards).

A forward's prediction is the policy's latency model under its calibration (no per-chunk overhead:
a trace times the stage's forward alone), scaled to the forward's stage by the profile's stage totals (the model is
the bottleneck stage's); a packed batch's is the additive form with the policy's per-piece term (ppprof.fit.packed).
A forward's band is that of its longest prefix: 0, then [0, B), [B, 2B), [2B, 4B), ... Pure numpy: no torch."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ppprof.fit.samples import ABSURD_RATIO
from ppprof.forwards import Forwards
from ppprof.policy.rule import LatencyModel


@dataclass(slots=True)
class LiveForwards:
    """The forwards a refit or a drift check takes, and those it skipped, by reason."""

    stage: np.ndarray
    pieces: list[tuple[tuple[int, int], ...]]
    latency_ms: np.ndarray
    time_s: np.ndarray
    skipped: dict[str, int] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.latency_ms)

    def of_stage(self, stage: int) -> np.ndarray:
        return np.flatnonzero(self.stage == stage)


def band(values: np.ndarray) -> np.ndarray:
    """Power-of-two band of a token count: 0 for 0, else floor(log2(v)) + 1."""
    v = np.asarray(values, dtype=float)
    return np.where(v > 0, np.floor(np.log2(np.maximum(v, 1))) + 1, 0).astype(np.int64)


def live_forwards(forwards: Forwards, context_len: int) -> LiveForwards:
    """Step 1 of the module doc: the forwards a refit takes, the rest counted by reason."""
    n = len(forwards)
    keep = np.ones(n, dtype=bool)
    skipped = {"first of its stage (cold)": 0, "beyond the policy's context": 0, "absurd time": 0}
    seen: set[tuple[int, int]] = set()
    for i, (s, r) in enumerate(zip(forwards.stage, forwards.tp_rank)):
        if (s, r) not in seen:
            seen.add((s, r))
            keep[i] = False
            skipped["first of its stage (cold)"] += 1
    tokens = np.array([sum(x for _, x in p) for p in forwards.pieces])
    reach = np.array([max(p + x for p, x in ps) for ps in forwards.pieces])
    beyond = keep & (reach > context_len)
    keep &= ~beyond
    skipped["beyond the policy's context"] = int(beyond.sum())
    stage, ms = np.array(forwards.stage), np.array(forwards.latency_ms)
    for s in np.unique(stage):
        for b in np.unique(band(tokens)):
            near = keep & (stage == s) & (np.abs(band(tokens) - b) <= 1)
            if near.sum() < 3:
                continue
            median = float(np.median(ms[near]))
            bad = near & (band(tokens) == b) & ((ms > ABSURD_RATIO * median) | (ms * ABSURD_RATIO < median))
            keep &= ~bad
            skipped["absurd time"] += int(bad.sum())
    idx = np.flatnonzero(keep)
    return LiveForwards(
        stage[idx],
        [forwards.pieces[i] for i in idx],
        ms[idx],
        np.array(forwards.time_s)[idx],
        {k: v for k, v in skipped.items() if v},
    )


def stage_scales(policy: dict, pp_size: int) -> np.ndarray:
    """Each stage's profiled total over the bottleneck stage's (diagnostics.stage_totals_ms); 1 where the policy
    does not say."""
    totals = (policy["report"].get("diagnostics") or {}).get("stage_totals_ms")
    if not isinstance(totals, list) or len(totals) < pp_size or not all(t and t > 0 for t in totals):
        return np.ones(pp_size)
    totals = np.array(totals[:pp_size], dtype=float)
    return totals / totals.max()


def predicted_ms(policy: dict, live: LiveForwards) -> np.ndarray:
    """Each live forward's prediction under `policy` (module doc)."""
    model = LatencyModel.from_dict(policy["latency_model"]).planning(policy.get("calibration"), 0.0)
    d = float((policy["report"].get("packed_forwards") or {}).get("extra_piece_ms") or 0.0)
    scales = stage_scales(policy, int(live.stage.max()) + 1)
    out = np.empty(len(live))
    for i, pieces in enumerate(live.pieces):
        p = np.array([L for L, _ in pieces], dtype=float)
        x = np.array([x for _, x in pieces], dtype=float)
        t = np.asarray(model.chunk_latency_ms(p, x), dtype=float)
        out[i] = (model.c + float(np.sum(t - model.c)) + d * (len(pieces) - 1)) * scales[live.stage[i]]
    return out


def band_edges(base_chunk_size: int, longest: int) -> list[int]:
    """0, 1, B, 2B, 4B, ... past `longest`: the bands' lower edges (band 0 is prefix 0 alone)."""
    edges, b = [0, 1], base_chunk_size
    while b <= longest:
        edges.append(b)
        b *= 2
    return edges


def band_name(edges: list[int], k: int) -> str:
    if k == 0:
        return "0"
    hi = edges[k + 1] if k + 1 < len(edges) else None
    return f"{edges[k]}-{hi - 1}" if hi is not None else f">={edges[k]}"


def bands(live: LiveForwards, base_chunk_size: int) -> tuple[np.ndarray, np.ndarray]:
    """The prefix bands (band_edges up to the longest prefix a forward reaches) and each forward's band."""
    longest = np.array([max(L for L, _ in p) for p in live.pieces])
    edges = band_edges(base_chunk_size, int(longest.max()))
    return edges, np.searchsorted(edges, longest, side="right") - 1


def drift_rows(preds: dict[str, np.ndarray], live: LiveForwards, base_chunk_size: int) -> list[dict]:
    """Per stage and prefix band: forwards, the live median (ms), each policy's median prediction (`preds`: its
    name -> predicted_ms of the live forwards) and the median of live / predicted."""
    edges, of = bands(live, base_chunk_size)
    rows = []
    for s in np.unique(live.stage):
        for k in np.unique(of[live.stage == s]):
            m = (live.stage == s) & (of == k)
            row = {"stage": int(s), "band": band_name(edges, int(k)), "forwards": int(m.sum())}
            row["live_ms"] = float(np.median(live.latency_ms[m]))
            for name, pred in preds.items():
                row[f"{name}_ms"] = float(np.median(pred[m]))
                row[f"{name}_ratio"] = float(np.median(live.latency_ms[m] / pred[m]))
            rows.append(row)
    return rows


def drift_text(rows: list[dict], names: dict[str, str]) -> list[str]:
    """The drift report's lines: per stage and prefix band the live median and each policy's median prediction
    (`names`: its key in the rows -> its column title) with the median of live / predicted."""
    head = f"{'stage':>5} {'prefix band':>13} {'forwards':>8} {'live ms':>9}" + "".join(
        f" {title + ' ms':>15} {'live/pred':>9}" for title in names.values()
    )
    lines = [head]
    for r in rows:
        line = f"{r['stage']:>5} {r['band']:>13} {r['forwards']:>8} {r['live_ms']:>9.3f}"
        line += "".join(f" {r[f'{k}_ms']:>15.3f} {r[f'{k}_ratio']:>9.3f}" for k in names)
        lines.append(line)
    return lines

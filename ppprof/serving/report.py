"""serving.json of a run through the ranks: each (level, arm) measured `repeats` times, interleaved, summarised by
the median of its repeats with their range, beside what the simulation of the same prompts on the policy's planning
model predicts, and the measured over the simulated, less 1. Pure: no torch."""

from __future__ import annotations

import numpy as np

from ppprof.serving.simulate import Served

COMPARED = (("throughput_tokens_per_s", "throughput"), ("ttft_mean_ms", "ttft_mean"))
"""(the figure, its name in vs_simulated) of each cell compared with the simulation."""


def cell_summary(served: Served, rows: list[dict], pp_size: int) -> dict:
    """One level and arm, once: the served summary, the stages' busy time from their rows."""
    busy = [0.0] * pp_size
    for row in rows:
        busy[row["stage"]] += row["compute_ms"]
    return Served(served.requests, served.batches, busy).summary()


def _median(values: list[float]) -> float:
    return float(np.median(values))


def measured_cell(repeats: list[dict]) -> dict:
    """The median of each figure over the repeats (TTFT by request: the median repeat's), with the range of the
    throughput and the mean TTFT."""
    thr = [s["throughput_tokens_per_s"] for s in repeats]
    mean = [s["ttft_ms"]["mean"] for s in repeats]
    mid = repeats[int(np.argsort(mean)[len(mean) // 2])]
    return {
        "num_requests": repeats[0]["num_requests"],
        "throughput_tokens_per_s": _median(thr),
        "ttft_ms": {q: _median([s["ttft_ms"][q] for s in repeats]) for q in ("mean", "p50", "p90", "p99")},
        "idle_fraction": _median([s["idle_fraction"] for s in repeats]),
        "ttft_ms_by_request": mid["ttft_ms_by_request"],
        "chunks_per_request": _median([s["chunks_per_request"] for s in repeats]),
        "requests_per_batch": _median([s["requests_per_batch"] for s in repeats]),
        "repeats": len(repeats),
        "range": {"throughput_tokens_per_s": [min(thr), max(thr)], "ttft_mean_ms": [min(mean), max(mean)]},
    }


def beside(measured: dict, simulated: dict) -> dict:
    """A measured cell with its simulation and the measured over the simulated, less 1."""
    figures = {
        "throughput_tokens_per_s": (measured["throughput_tokens_per_s"], simulated["throughput_tokens_per_s"]),
        "ttft_mean_ms": (measured["ttft_ms"]["mean"], simulated["ttft_ms"]["mean"]),
    }
    vs = {name: (m / s - 1.0 if s else None) for (key, name) in COMPARED for m, s in [figures[key]]}
    sim = {k: v for k, v in simulated.items() if k != "ttft_ms_by_request"}
    return {**measured, "simulated": sim, "vs_simulated": vs}


def measured_levels(cells: dict[tuple[str, str], list[dict]], simulated: dict) -> dict:
    """serving.json's `levels` of a measured run: {level: {arm: measured cell beside its simulation}}, from
    {(level, arm): [each repeat's summary]} and the simulation's `levels`."""
    out: dict[str, dict] = {}
    for (level, arm), repeats in cells.items():
        out.setdefault(level, {})[arm] = beside(measured_cell(repeats), simulated[level][arm])
    return out


def paired_ratios(cells: dict[tuple[str, str], list[dict]], arm: str = "policy-load") -> dict:
    """serving.json's `paired`: at each level, `arm` against every other arm, repeat by repeat (the repeats are
    interleaved, so repeat r of two arms ran side by side and share the host's state then): the median over the
    repeats of the throughput ratio and of the mean-TTFT ratio, with their ranges. Empty where `arm` did not run."""
    out: dict[str, dict] = {}
    for (level, other), repeats in cells.items():
        mine = cells.get((level, arm))
        if mine is None or other == arm:
            continue
        thr = [a["throughput_tokens_per_s"] / b["throughput_tokens_per_s"] for a, b in zip(mine, repeats)]
        ttft = [a["ttft_ms"]["mean"] / b["ttft_ms"]["mean"] for a, b in zip(mine, repeats)]
        out.setdefault(level, {})[f"{arm}/{other}"] = {
            "throughput": _median(thr),
            "ttft_mean": _median(ttft),
            "range": {"throughput": [min(thr), max(thr)], "ttft_mean": [min(ttft), max(ttft)]},
        }
    return out


def largest_miss(levels: dict) -> tuple[float, str] | None:
    """The largest |measured / simulated - 1| over every cell and figure, and where."""
    misses = [
        (abs(v), f"{level} {arm} {name}")
        for level, arms in levels.items()
        for arm, cell in arms.items()
        for name, v in cell.get("vs_simulated", {}).items()
        if v is not None
    ]
    return max(misses) if misses else None


def levels_text(result: dict) -> str:
    """serving.json's table, a line a level and arm; a measured run's also with its simulation's misses."""
    measured = result.get("mode") == "measured"
    head = (
        f"{result.get('mode', 'simulated')}, {result['pp_size']} stages, async depth {result['async_depth']}, "
        f"{result['num_prompts']} prompts a level" + (f", median of {result['repeats']} repeats" if measured else "")
    )
    lines = [
        head,
        f"{'level':<18} {'arm':<15} {'tok/s':>9} {'mean ms':>10} {'p50':>10} {'p90':>10} {'p99':>10} {'idle':>6} "
        f"{'chunks':>7} {'req/batch':>9}" + (f" {'tok/s vs sim':>12} {'mean vs sim':>11}" if measured else ""),
    ]
    for name, arms in result["levels"].items():
        for arm, s in arms.items():
            t = s["ttft_ms"]
            line = (
                f"{name:<18} {arm:<15} {s['throughput_tokens_per_s']:>9.0f} {t['mean']:>10.1f} {t['p50']:>10.1f} "
                f"{t['p90']:>10.1f} {t['p99']:>10.1f} {s['idle_fraction']:>6.1%} {s['chunks_per_request']:>7.1f} "
                f"{s['requests_per_batch']:>9.2f}"
            )
            if measured:
                vs = s["vs_simulated"]
                line += f" {vs['throughput']:>+12.1%} {vs['ttft_mean']:>+11.1%}"
            lines.append(line)
    for name, pairs in (result.get("paired") or {}).items():
        cells = "; ".join(f"{k} {v['throughput']:.3f} / {v['ttft_mean']:.3f}" for k, v in pairs.items())
        lines.append(f"paired, {name} (throughput / mean TTFT ratio, median of repeats): {cells}")
    return "\n".join(lines)


def trace_text(result: dict) -> str:
    """A trace replay's table (serving.json of `serve-bench --simulate --trace`), a line an arm, in bench_serving's
    metrics: request and input token throughput, TTFT mean / median / p90 / p99 (ms), with the prefix-hit share and the
    chunks a request took."""
    t = result["trace"]
    lines = [
        f"simulated trace {t['path']}: {t['requests']} requests over {t['span_s']:.0f} s, {t['input_tokens']} input "
        f"tokens ({t['shared_prefix_tokens'] / t['input_tokens']:.1%} an earlier request's prefix), lengths x "
        f"{t['length_scale']:g}, time x {t['time_scale']:g}; {result['pp_size']} stages, async depth "
        f"{result['async_depth']}",
        f"{'arm':<15} {'req/s':>7} {'input tok/s':>11} {'mean ms':>10} {'median':>10} {'p90':>10} {'p99':>10} "
        f"{'hit':>6} {'chunks':>7}",
    ]
    for run in result["runs"]:
        lines.append(
            f"{run['arm']:<15} {run['request_throughput']:>7.3f} {run['input_throughput']:>11.0f} "
            f"{run['mean_ttft_ms']:>10.1f} {run['median_ttft_ms']:>10.1f} {run['p90_ttft_ms']:>10.1f} "
            f"{run['p99_ttft_ms']:>10.1f} {run['prefix_hit_share']:>6.1%} {run['chunks_per_request']:>7.2f}"
        )
    return "\n".join(lines)


TRACE_FIGURES = (
    "request_throughput",
    "input_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p90_ttft_ms",
    "p99_ttft_ms",
)
"""The figures of a replayed trace's run compared with its simulation (bench_serving's names)."""


def trace_cell(repeats: list[dict], simulated: dict) -> dict:
    """One arm of a trace replayed through the ranks: the median of each figure over its repeats (each a metrics()
    of ppprof.serving.replay, without details), the simulation's, and the measured over the simulated, less 1."""
    measured = {k: _median([r[k] for r in repeats]) for k in TRACE_FIGURES}
    measured |= {k: _median([r[k] for r in repeats]) for k in ("prefix_hit_share", "chunks_per_request", "duration")}
    vs = {k: (measured[k] / simulated[k] - 1.0 if simulated[k] else None) for k in TRACE_FIGURES}
    sim = {k: v for k, v in simulated.items() if k != "details"}
    return {"arm": repeats[0]["arm"], "measured": measured, "simulated": sim, "vs_simulated": vs, "repeats": repeats}


def trace_measured_text(result: dict) -> str:
    """A trace replayed through the ranks, an arm three lines: measured (the median of the repeats), simulated, and
    the measured over the simulated, less 1, in bench_serving's figures with the prefix-hit share and chunks."""
    t = result["trace"]
    lines = [
        f"measured trace {t['path']}: {t['requests']} requests over {t['span_s']:.1f} s, {t['input_tokens']} input "
        f"tokens, lengths x {t['length_scale']:g}, time x {t['time_scale']:g}; {result['pp_size']} stages, async "
        f"depth {result['async_depth']}, median of {result['repeats']} repeats",
        f"{'arm':<15} {'run':<9} {'req/s':>7} {'input tok/s':>11} {'mean ms':>10} {'median':>10} {'p90':>10} "
        f"{'p99':>10} {'hit':>6} {'chunks':>7}",
    ]
    for cell in result["runs"]:
        for name, figures in (("measured", cell["measured"]), ("simulated", cell["simulated"])):
            lines.append(
                f"{cell['arm'] if name == 'measured' else '':<15} {name:<9} {figures['request_throughput']:>7.3f} "
                f"{figures['input_throughput']:>11.0f} {figures['mean_ttft_ms']:>10.1f} "
                f"{figures['median_ttft_ms']:>10.1f} {figures['p90_ttft_ms']:>10.1f} {figures['p99_ttft_ms']:>10.1f} "
                f"{figures['prefix_hit_share']:>6.1%} {figures['chunks_per_request']:>7.2f}"
            )
        vs = [cell["vs_simulated"][k] for k in TRACE_FIGURES]
        widths = (7, 11, 10, 10, 10, 10)
        lines.append(
            f"{'':<15} {'vs sim':<9} "
            + " ".join("-".rjust(w) if v is None else f"{v:+.1%}".rjust(w) for v, w in zip(vs, widths))
        )
    miss = result.get("largest_miss")
    if miss:
        lines.append(f"largest miss: {miss['fraction']:.1%} ({miss['where']})")
    return "\n".join(lines)


def trace_largest_miss(runs: list[dict]) -> dict | None:
    """The largest |measured / simulated - 1| over every arm and figure of a replayed trace, and where."""
    misses = [(abs(v), f"{c['arm']} {k}") for c in runs for k, v in c["vs_simulated"].items() if v is not None]
    if not misses:
        return None
    fraction, where = max(misses)
    return {"where": where, "fraction": fraction}

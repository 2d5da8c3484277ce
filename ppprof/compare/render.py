"""A comparison of two policies in words (`ppprof compare` without --json): what changed, the history-only tables
side by side, predicted TTFT, the samples, then one line per check and the verdict."""

from __future__ import annotations

from ppprof.compare.verdict import pct
from ppprof.policy.rule import LatencyModel


def render(report: dict) -> str:
    """The report for people: what changed, then one line per check and the verdict."""
    return "\n".join(
        [
            *header_lines(report),
            *table_lines(report["table"]),
            *ttft_lines(report),
            *samples_lines(report.get("samples")),
            *verdict_lines(report["checks"]),
        ]
    )


def header_lines(report: dict) -> list[str]:
    """Both sides, their coefficients, target, overhead and calibration."""
    b, c = report["baseline"], report["candidate"]
    lines = [
        f"baseline  {b['label']}: {b['status']} ({b['latency_model']}, B {b['base_chunk_size']}): {b['reason']}",
        f"candidate {c['label']}: {c['status']} ({c['latency_model']}, B {c['base_chunk_size']}): {c['reason']}",
    ]
    coefs = report["coefficients"]
    if coefs:
        lines.append(
            "coefficients: "
            + ", ".join(
                f"{r['name']} {fmt(r['baseline'])} -> {fmt(r['candidate'])} ({pct(r['change'])})" for r in coefs
            )
            + "  ["
            + ", ".join(f"{r['name']} {r['unit']}" for r in coefs)
            + "]"
        )
    t = report["target_latency_ms"]
    lines.append(
        f"target latency (SGLang's rule): {fmt(t['baseline'])} -> {fmt(t['candidate'])} ms ({pct(t['change'])})"
    )
    lines.append(
        f"overhead: {fmt(b['overhead']['ms_per_chunk'])} ({b['overhead']['source']}) -> "
        f"{fmt(c['overhead']['ms_per_chunk'])} ({c['overhead']['source']}) ms a chunk"
    )
    lines.append(
        f"calibration: {LatencyModel.calibration_words(b['calibration'])} ({b['calibration']['source']}) -> "
        f"{LatencyModel.calibration_words(c['calibration'])} ({c['calibration']['source']})"
    )
    return lines


def table_lines(table: dict) -> list[str]:
    """The history-only tables side by side over the prefix lengths compared."""
    lo, hi = table["prefix_len_range"]
    lines = [
        f"chunk-size table on prefix_len {lo}..{hi}: {table['num_changed']} of {table['num_prefix_lens']} "
        f"prefix lengths changed, {table['num_beyond']} beyond the allowance",
        "  prefix_len         baseline  candidate",
    ]
    for r in table["rows"]:
        span = f"{r['prefix_len'][0]}-{r['prefix_len'][1]}"
        mark = "" if r["baseline"] == r["candidate"] else f"  ({r['candidate'] - r['baseline']:+d})"
        lines.append(f"  {span:<17} {r['baseline']:>9}  {r['candidate']:>9}{mark}")
    return lines


def ttft_lines(report: dict) -> list[str]:
    """Predicted TTFT of each planner at each prompt length, with the change (and at the pace)."""
    ttft = report["ttft"]
    if not ttft["rows"]:
        return [f"predicted TTFT: not compared ({ttft['note']})"]
    paced = report["pace"]["ratio"] is not None
    lines = [f"predicted TTFT, {ttft['num_stages']} stages (ms):"]
    lines.append("  prompt_len  strategy         baseline  candidate  change" + ("  at pace" if paced else ""))
    for r in ttft["rows"]:
        lines.append(
            f"  {r['prompt_len']:>10}  {r['strategy']:<14} {r['baseline_ms']:>9.1f}  "
            f"{r['candidate_ms']:>9.1f}  {pct(r['change'])}" + (f"  {pct(r['change_at_pace']):>8}" if paced else "")
        )
    return lines


def samples_lines(drift: dict | None) -> list[str]:
    """The samples' drift: the common cells' median latency ratio, the largest, and by prefix length."""
    if not drift:
        return []
    if drift.get("median_ratio") is None:
        return [f"samples: {drift['note']}"]
    w = drift["worst_cell"]
    return [
        f"samples: {drift['num_cells']} common (prefix_len, chunk_size) cells, median latency ratio "
        f"{drift['median_ratio']:.3f} (candidate / baseline, bottleneck stages "
        f"{drift['bottleneck_stage'][0]} / {drift['bottleneck_stage'][1]}); largest at prefix_len "
        f"{w['prefix_len']} chunk_size {w['chunk_size']}: {w['ratio']:.3f}",
        "  median ratio by prefix_len: "
        + ", ".join(f"{r['prefix_len']}: {r['median_ratio']:.3f}" for r in drift["by_prefix"]),
    ]


def verdict_lines(checks: list[dict]) -> list[str]:
    """One line per check, then the verdict."""
    lines = []
    for ch in checks:
        limit = "" if ch["limit"] is None or ch["figure"] == "overhead" else f" (limit {ch['limit']:.0%})"
        lines.append(
            f"{('split' if ch.get('split') else 'ok   ') if ch['passed'] else 'DRIFT'} {ch['figure']}: {ch['detail']}{limit}"
        )
    failed = [ch["figure"] for ch in checks if not ch["passed"]]
    lines.append(f"drift beyond tolerance: {', '.join(failed)}" if failed else "within tolerance")
    return lines


def fmt(value) -> str:
    return "n/a" if value is None else f"{value:.4g}"

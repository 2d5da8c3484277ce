"""Paired ratios of a measured serve-bench run, rebuilt from its serving.csv: each (level, arm, repeat)'s input
throughput and mean TTFT recomputed from the batches (a closed loop's request arrives when one finishes; its TTFT runs
to the end of its last piece on the last stage), checked against serving.json's medians, then policy-load against
every other arm repeat by repeat (ppprof.serving.report.paired_ratios). For runs made before serve-bench wrote
`paired` itself (results/serving-real).

Usage: python scripts/experiments/serving_paired.py RUN_FOLDER [-o OUT.json]
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ppprof.manifest import script_parser, write_result
from ppprof.serving.report import paired_ratios


def repeat_figures(rows: pd.DataFrame, prompt_lens: list[int], concurrency: int) -> dict:
    """One repeat of one (level, arm) as serving.json summarises it: throughput and mean TTFT."""
    last = rows.stage.max()
    finish: dict[int, float] = {}
    for batch in rows[rows.stage == last].itertuples():
        for piece in batch.requests.split():
            rid, rest = piece.split(":")
            prefix, size = (int(v) for v in rest.split("+"))
            if prefix + size == prompt_lens[int(rid)]:
                finish[int(rid)] = batch.end_ms
    start = rows[rows.stage == 0].start_ms.min()
    arrival = {rid: start for rid in range(min(concurrency, len(prompt_lens)))}
    for k, t in enumerate(sorted(finish.values())):  # the k-th finish lets request concurrency + k in
        if concurrency + k < len(prompt_lens):
            arrival[concurrency + k] = t
    ttft = [finish[rid] - arrival[rid] for rid in range(len(prompt_lens))]
    span = max(finish.values()) - start
    return {"throughput_tokens_per_s": sum(prompt_lens) / span * 1e3, "ttft_ms": {"mean": float(np.mean(ttft))}}


def main() -> None:
    parser = script_parser(__doc__, None)
    parser.add_argument("run", type=Path, help="a serve-bench run folder (serving.json, serving.csv)")
    args = parser.parse_args()
    doc = json.loads((args.run / "serving.json").read_text())
    rows = pd.read_csv(args.run / "serving.csv")
    cells: dict[tuple[str, str], list[dict]] = {}
    for (level, arm, _), group in rows[rows.level.str.startswith("concurrency-")].groupby(["level", "arm", "repeat"]):
        cells.setdefault((level, arm), []).append(repeat_figures(group, doc["prompt_lens"], int(level.split("-")[1])))
    worst = 0.0  # the rebuilt medians against serving.json's
    for (level, arm), repeats in cells.items():
        cell = doc["levels"][level][arm]
        worst = max(
            worst,
            abs(np.median([r["throughput_tokens_per_s"] for r in repeats]) / cell["throughput_tokens_per_s"] - 1),
            abs(np.median([r["ttft_ms"]["mean"] for r in repeats]) / cell["ttft_ms"]["mean"] - 1),
        )
    paired = paired_ratios(cells)
    for level, pairs in paired.items():
        print(level, "; ".join(f"{k} {v['throughput']:.3f} / {v['ttft_mean']:.3f}" for k, v in pairs.items()))
    print(f"rebuilt medians against serving.json: largest difference {worst:.2e}")
    if args.out:
        write_result(
            args.out,
            {"what": __doc__.splitlines()[0], "run": str(args.run), "rebuilt_vs_json": worst, "paired": paired},
        )


if __name__ == "__main__":
    main()

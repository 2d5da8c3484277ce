"""What the pipelined level (the policy's calibration) does to a bench's predictions, offline, on a bench that ran
before the profile's pipelined runs recorded their stage times.

The cells a profile's overhead phase would have measured are taken from the bench's own fixed arms (PP2 real,
BENCH_DIR/bench.csv, the shorter prompt): 8 chunks of B/4 after a prefix of 8 chunks of B, and the first 8 chunks of
B and of 2B, each repeat a run. The level is fitted on them as `ppprof fit` fits it (ppprof.fit.calibrate), and every
arm's TTFT at every prompt length is predicted by the policy's planning model without it and with it (its overhead
as measured by its profile), against the bench's measured median: the relative errors, their mean and max, and the
chunk MAPE of the bottleneck stage. The cells are the bench's, not a profile's: this checks the method, not a
profile's figures.

Usage: python scripts/experiments/calibrate.py BENCH_DIR POLICY [-o OUT.json]
  e.g. python scripts/experiments/calibrate.py results/bench-reference/pp2 results/bench-reference/profile/policy.json
  (the bench of 2026-12-02 it was written for, before the profile measured the level itself, is in git at 11413ca)
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from ppprof.bench.overhead import DEEP_PREFIX_CHUNKS, OVERHEAD_CHUNKS, overhead_run, summarize
from ppprof.fit.calibrate import calibration_of
from ppprof.manifest import script_parser, write_result
from ppprof.policy import load
from ppprof.policy.planners import ttft_ms


def emulated_runs(bench: pd.DataFrame, base: int, pp_size: int) -> list[dict]:
    """The overhead phase's runs, cut from the bench's fixed arms of the shorter prompt (see the module's text)."""
    runs = []
    short = int(bench.prompt_len.min())
    for x in (base // 4, base, 2 * base):
        first = DEEP_PREFIX_CHUNKS * base // x if x < base else 0
        arm = bench[
            (bench.arm == f"fixed-{x}")
            & (bench.prompt_len == short)
            & (bench.chunk >= first)
            & (bench.chunk < first + OVERHEAD_CHUNKS)
        ]
        for repeat, g in arm.groupby("repeat"):
            t = g.pivot_table(index="stage", columns="chunk", values="compute_ms").sort_index()
            if t.shape != (pp_size, OVERHEAD_CHUNKS):
                continue
            prefix = [base] * (first * x // base)  # the deep prefix, as B-sized chunks, is not a cell here
            run = overhead_run(
                prefix + [x] * OVERHEAD_CHUNKS,
                np.hstack([np.full((pp_size, len(prefix)), np.nan), t.to_numpy()]),
                np.nan,
                int(repeat),
            )
            run["stage_ms"] = [[None if np.isnan(v) else v for v in row] for row in run["stage_ms"]]
            runs.append(run)
    return runs


def arms(meta: dict) -> dict[str, dict[str, float]]:
    """prompt_len -> arm -> measured median TTFT (ms)."""
    out = {}
    for length, entry in meta["prompt_lens"].items():
        sweep = entry.get("fixed_sweep") or {}
        items = list(entry["strategies"].values()) + list(sweep.values() if isinstance(sweep, dict) else sweep)
        out[length] = {v["arm"]: v["ttft_ms"]["median"] for v in items}
    return out


def main() -> None:
    ap = script_parser(__doc__, None)
    ap.add_argument("bench_dir")
    ap.add_argument("policy")
    args = ap.parse_args()
    bench = pd.read_csv(Path(args.bench_dir) / "bench.csv")
    meta = json.loads((Path(args.bench_dir) / "bench.json").read_text())
    policy = load(args.policy)
    pp_size = int(meta["num_stages"])
    stage = policy.report.diagnostics.get("bottleneck_stage") or 0
    runs = emulated_runs(bench, policy.base_chunk_size, pp_size)
    cal = calibration_of({"pipeline_overhead": summarize(runs, pp_size) if runs else {}}, policy.latency_model, stage)
    models = {
        "uncalibrated": policy.latency_model.planning(None, policy.overhead_ms),
        "calibrated": policy.latency_model.planning(cal, policy.overhead_ms),
    }
    rows = []
    for length, measured in arms(meta).items():
        for arm, real in measured.items():
            sizes = (
                bench[
                    (bench.prompt_len == int(length))
                    & (bench.arm == arm)
                    & (bench.stage == 0)
                    & (bench.repeat == bench.repeat.min())
                ]
                .sort_values("chunk")
                .chunk_size.tolist()
            )
            prefix = np.cumsum([0] + sizes[:-1])
            row = {"prompt_len": int(length), "arm": arm, "num_chunks": len(sizes), "measured_ms": round(real, 2)}
            for name, model in models.items():
                row[name] = round(ttft_ms(model.chunk_latency_ms(prefix, sizes), pp_size) / real - 1.0, 4)
            rows.append(row)
    cells = bench[bench.stage == stage]
    summary = {}
    for name, model in models.items():
        errors = np.abs([r[name] for r in rows])
        fitted = model.chunk_latency_ms(cells.prefix_len.to_numpy(), cells.chunk_size.to_numpy()) - policy.overhead_ms
        summary[name] = {
            "mean_abs_error": round(float(errors.mean()), 4),
            "max_abs_error": round(float(errors.max()), 4),
            "within_3pct": int((errors <= 0.03).sum()),
            "arms": len(rows),
            "chunk_mape": round(float(np.mean(np.abs(cells.compute_ms.to_numpy() / fitted - 1.0))), 4),
        }
    print(
        f"calibration ({cal['source']}): linear scale {cal['linear_scale']:.4f}, shift {cal['shift_ms']:+.3f} ms, "
        f"{cal.get('cells', 0)} cells; overhead {policy.overhead_ms:.3f} ms a chunk, stage {stage}"
    )
    print(f"{'prompt':>7} {'arm':>15} {'chunks':>6} {'measured':>9} {'uncalibrated':>12} {'calibrated':>10}")
    for r in rows:
        print(
            f"{r['prompt_len']:>7} {r['arm']:>15} {r['num_chunks']:>6} {r['measured_ms']:>9.1f} "
            f"{r['uncalibrated']:>+12.3f} {r['calibrated']:>+10.3f}"
        )
    for name, s in summary.items():
        print(
            f"{name}: TTFT error mean {s['mean_abs_error']:.3f}, max {s['max_abs_error']:.3f}, "
            f"{s['within_3pct']} of {s['arms']} within 3%; chunk MAPE {s['chunk_mape']:.3f}"
        )
    if args.out:
        write_result(
            args.out,
            {
                "what": __doc__.splitlines()[0],
                "bench": args.bench_dir,
                "policy": args.policy,
                "calibration": cal,
                "overhead_ms": policy.overhead_ms,
                "summary": summary,
                "arms": rows,
            },
        )


if __name__ == "__main__":
    main()

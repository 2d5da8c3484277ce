"""Benchmark (not a test): what `--forward-trace` costs the serving loop itself, tracing on against off, through the
real pipeline. Pairs of `serve-bench` runs of the same policy, prompts and seed, one with `--forward-trace` and one
without, the order alternating pair by pair (on-off, off-on, ...), so that a host's drift moves both alike. Each run
serves REPEATS cells at concurrency 1; the batches are the same in every run (the policy sizes them), so a batch of
one run is matched to the same (cell, batch, stage) of its pair's other run.

Two figures a pair, each on/off - 1, then their median over the pairs and the pairs' range:
- the forwards: the median over the matched batches of their compute_ms (the writer's thread shares the host's
  cores with the ranks: does it slow the forwards?);
- the loop: each cell's makespan (first batch's start to the last stage's last end, serving.csv), the median over
  the cells, and the difference per forward against the smallest forward's time (the issue's goal: under 1%).

    python scripts/benchmarks/forward_trace_serving.py [--policy tests/runs/tiny-hybrid/policy.json] [--pairs 8]
        [--repeats 3] [-o results/bench_forward_trace_serving.json] [--quick]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from ppprof.manifest import script_parser, write_result

KEY = ["repeat", "batch", "stage"]


def serve(policy: str, out: Path, repeats: int, prompts: int, trace: bool) -> pd.DataFrame:
    """One serve-bench run at concurrency 1; its serving.csv."""
    cmd = [
        sys.executable, "-m", "ppprof", "serve-bench", policy, "--concurrency", "1", "--num-prompts", str(prompts),
        "--prompt-lens", "1000,2000,3000", "--strategies", "policy", "--repeats", str(repeats), "--seed", "0",
        "--out", str(out / "serving.json"),
    ]  # fmt: skip
    if trace:
        cmd += ["--forward-trace", str(out / "trace.jsonl")]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return pd.read_csv(out / "serving.csv")


def makespans(rows: pd.DataFrame) -> pd.Series:
    """Each cell's makespan in ms: its first batch's start to its last forward's end."""
    return rows.groupby("repeat").end_ms.max() - rows.groupby("repeat").start_ms.min()


def pair(on: pd.DataFrame, off: pd.DataFrame) -> dict:
    """One pair's figures: the forwards' and the loop's on/off - 1, and the loop's difference per forward."""
    both = on.merge(off, on=KEY, suffixes=("_on", "_off"))
    if len(both) != len(on) or len(on) != len(off):
        sys.exit(f"the runs' batches differ ({len(on)} and {len(off)} rows, {len(both)} matched): not one plan")
    forwards = float((both.compute_ms_on / both.compute_ms_off).median() - 1.0)
    span_on, span_off = makespans(on), makespans(off)
    per_forward_ms = float((span_on - span_off).median()) / (len(on) / on.repeat.nunique())
    return {
        "forwards": forwards,
        "loop": float((span_on / span_off).median() - 1.0),
        "loop_ms_per_forward": per_forward_ms,
        "smallest_forward_ms": float(min(on.compute_ms.min(), off.compute_ms.min())),
        "forwards_a_cell": len(on) / on.repeat.nunique(),
    }


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = script_parser(__doc__, "results/bench_forward_trace_serving.json", quick="1 pair of 1 cell, 3 prompts")
    parser.add_argument("--policy", default="tests/runs/tiny-hybrid/policy.json")
    parser.add_argument("--pairs", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    pairs, repeats, prompts = (1, 1, 3) if args.quick else (args.pairs, args.repeats, 12)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(pairs):
            order = (True, False) if k % 2 == 0 else (False, True)
            got = {}
            for trace in order:
                out = Path(tmp) / f"p{k}-{'on' if trace else 'off'}"
                got[trace] = serve(args.policy, out, repeats, prompts, trace)
            runs.append({"order": "on-off" if order[0] else "off-on", **pair(got[True], got[False])})
    smallest = min(r["smallest_forward_ms"] for r in runs)
    per_forward = spread([r["loop_ms_per_forward"] for r in runs])
    result = {
        "policy": args.policy,
        "pairs": pairs,
        "repeats": repeats,
        "prompts": prompts,
        "forwards_on_over_off": spread([r["forwards"] for r in runs]),
        "loop_on_over_off": spread([r["loop"] for r in runs]),
        "loop_ms_per_forward": per_forward,
        "smallest_forward_ms": smallest,
        "loop_fraction_of_smallest_forward": per_forward["median"] / smallest,
        "runs": runs,
    }
    write_result(args.out, result)
    f, loop = result["forwards_on_over_off"], result["loop_on_over_off"]
    print(
        f"tracing on/off over {pairs} pairs: forwards {f['median']:+.2%} ({f['min']:+.2%} to {f['max']:+.2%}), "
        f"cells' makespan {loop['median']:+.2%} ({loop['min']:+.2%} to {loop['max']:+.2%}); "
        f"{per_forward['median'] * 1e3:+.1f} us a forward ({per_forward['min'] * 1e3:+.1f} to "
        f"{per_forward['max'] * 1e3:+.1f}) = {result['loop_fraction_of_smallest_forward']:+.2%} of the smallest "
        f"forward ({smallest:.3f} ms)"
    )


if __name__ == "__main__":
    main()

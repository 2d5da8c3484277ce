"""A bench run's measured chunks predicted again by another policy's model: how well each latency model predicts the
chunks real plans prefill, offline, without running the bench again.

Every chunk of every arm in BENCH_DIR/bench.csv (PP2 real) is predicted on the bench's bottleneck stage (the one the
policy's model describes) by the model of each POLICY given, and compared with its measured compute time: the MAPE
over chunks, and per arm and prompt the median over repeats of (measured sum of the arm's chunk times) / (predicted
sum) - 1, the part of a TTFT error that comes from the stage times (the rest is the pipeline's overhead and waits).

Usage: python scripts/experiments/repredict.py BENCH_DIR POLICY [POLICY ...] [-o OUT.json]
  e.g. python scripts/experiments/repredict.py results/bench-reference/pp2 results/bench-reference/profile/policy.json \
           /tmp/refit/policy.json -o /tmp/repredict.json
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ppprof.manifest import script_parser, write_result
from ppprof.policy import load


def repredict(bench: pd.DataFrame, policy_path: str, stage: int) -> dict:
    policy = load(policy_path)
    rows = bench[bench.stage == stage]
    predicted = policy.latency_model.chunk_latency_ms(rows.prefix_len.to_numpy(), rows.chunk_size.to_numpy())
    rows = rows.assign(predicted=predicted)
    per_run = rows.groupby(["prompt_len", "arm", "repeat"]).agg(
        measured=("compute_ms", "sum"), predicted=("predicted", "sum")
    )
    per_run["error"] = per_run.measured / per_run.predicted - 1.0
    arms = per_run.groupby(["prompt_len", "arm"]).error.median()
    return {
        "policy": policy_path,
        "latency_model": policy.latency_model.to_dict(),
        "chunk_mape": float(np.mean(np.abs(rows.compute_ms.to_numpy() / predicted - 1.0))),
        "worst_arm_error": float(arms.abs().max()),
        "arms": {f"{arm}@{prompt}": round(float(e), 4) for (prompt, arm), e in arms.items()},
    }


def main() -> None:
    ap = script_parser(__doc__, None)
    ap.add_argument("bench_dir")
    ap.add_argument("policies", nargs="+")
    args = ap.parse_args()
    bench = pd.read_csv(Path(args.bench_dir) / "bench.csv")
    stage = int(load(args.policies[0]).report.diagnostics["bottleneck_stage"])
    out = {
        "what": __doc__.splitlines()[0],
        "bench": args.bench_dir,
        "stage": stage,
        "models": [repredict(bench, p, stage) for p in args.policies],
    }
    for m in out["models"]:
        print(
            f"{m['policy']}: {m['latency_model']['name']} model, chunk MAPE {m['chunk_mape']:.1%}, worst arm "
            f"{m['worst_arm_error']:+.1%}: " + ", ".join(f"{k} {v:+.1%}" for k, v in m["arms"].items())
        )
    if args.out:
        write_result(args.out, out)


if __name__ == "__main__":
    main()

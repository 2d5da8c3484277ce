"""Benchmark the planners on a 1M-token prompt (median of repeats); writes results/bench_planner.json.

At 1M tokens, PP 4, B 8192, alignment 64 the optimal planner's grid has 16385 positions and ~2M distinct chunk
latencies, too many to run as bounds one by one: it runs its branch and bound (a first pass of 48 quantile bounds,
then 3 passes of 48 more) and records how far its TTFT may be above the grid's optimum (search.gap_ms).

Usage: python scripts/benchmarks/planner.py [POLICY.json] [--prompt-len N] [--pp P]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from ppprof.io import atomic_write_json
from ppprof.policy import ChunkSettings, LatencyModel, from_dict, load
from ppprof.policy.planners import STRATEGIES, plan_prompt
from ppprof.policy.schema import SCHEMA_VERSION, make_table

REPEATS = 3


def synthetic_policy(context_len: int):
    model = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=2e-4)
    settings = ChunkSettings(base_chunk_size=8192, page_size=64, context_len=context_len)
    target = model.target_ms(settings.base_chunk_size)
    return from_dict({"schema_version": SCHEMA_VERSION, "status": "dynamic", "reason": "synthetic",
                      "latency_model": model.to_dict(), "settings": settings.to_dict(), "target_latency_ms": target,
                      "table": make_table(model, settings, target, "dynamic")})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("policy", nargs="?", default=None)
    parser.add_argument("--prompt-len", type=int, default=1 << 20)
    parser.add_argument("--pp", type=int, default=4)
    parser.add_argument("-o", "--out", default="results/bench_planner.json")
    args = parser.parse_args()
    policy = load(args.policy) if args.policy else synthetic_policy(args.prompt_len + 1024)
    timings, plans = {}, {}
    for strategy in STRATEGIES:
        runs = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            (plan,) = plan_prompt(policy, args.prompt_len, args.pp, (strategy,))
            runs.append(time.perf_counter() - start)
        timings[strategy] = statistics.median(runs)
        plans[strategy] = {"num_chunks": len(plan.chunk_sizes), "ttft_ms": plan.ttft_ms,
                           "max_latency_ms": max(plan.latencies_ms)}
        if plan.search is not None:
            plans[strategy]["search"] = plan.search
    result = {"policy": args.policy or "synthetic (prefix model, B=8192, alignment 64)", "prompt_len": args.prompt_len,
              "num_stages": args.pp, "seconds_median": timings, "repeats": REPEATS, "plans": plans}
    atomic_write_json(args.out, result)
    for s in STRATEGIES:
        search = plans[s].get("search")
        note = "" if not search else (" (exact on the grid)" if search["exact_on_grid"] else
                                      f" (within {search['gap_ms']:.1f} ms of the grid's optimum)")
        print(f"{s}: {timings[s]:.3f} s, {plans[s]['num_chunks']} chunks, TTFT {plans[s]['ttft_ms']:.1f} ms{note}")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

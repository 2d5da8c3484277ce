"""Benchmark the planners on a 1M-token prompt (median of repeats); writes results/bench_planner.json.

At 1M tokens, PP 4, B 8192, alignment 64 the optimal planner's grid has 16385 positions and ~2M distinct chunk
latencies, too many to run as bounds one by one: it runs its branch and bound (a first pass of 48 quantile bounds,
then 3 passes of 48 more) and records how far its TTFT may be above the grid's optimum (search.gap_ms).

The synthetic policy's rules are chosen as `ppprof fit` chooses them (ppprof.fit.build.carried), on chunks up to 4 B
and prompts up to the context.

Usage: python scripts/benchmarks/planner.py [POLICY.json] [--prompt-len N] [--pp P] [-o OUT.json] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import time

from ppprof.config import PolicyOptions
from ppprof.fit.build import Gated, carried
from ppprof.manifest import script_parser, write_result
from ppprof.policy import ChunkSettings, LatencyModel, from_dict, load
from ppprof.policy.planners import STRATEGIES, plan_prompt
from ppprof.policy.runtime import nested
from ppprof.policy.schema import SCHEMA_VERSION

REPEATS = 3


def synthetic_policy(context_len: int, pp_size: int, base_chunk_size: int = 8192):
    """A dynamic policy of known coefficients (B = `base_chunk_size`, page 64), its rules chosen for `pp_size`
    as `ppprof fit` chooses them (min_gain 0: dynamic whatever they gain)."""
    model = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=2e-4)
    settings = ChunkSettings(base_chunk_size=base_chunk_size, page_size=64, context_len=context_len)
    measured = {"prefix_len": [0, context_len], "chunk_size": [1, 4 * base_chunk_size]}
    options = PolicyOptions(min_gain=0.0, pp_size=pp_size)
    rules = carried(Gated(model, "dynamic", "synthetic"), settings, measured, None, options)
    return (
        from_dict(  # the report's fields beside the contract's, as the fit builds them, nested as the file holds them
            nested(
                {
                    "schema_version": SCHEMA_VERSION,
                    "latency_model": model.to_dict(),
                    "settings": settings.to_dict(),
                    "target_latency_ms": model.target_ms(base_chunk_size),
                    "provenance": {"pp_size": pp_size, "layer_partition": None},
                    "parity": None,
                    **rules,
                }
            )
        )
    )


def main() -> int:
    parser = script_parser(
        __doc__, "results/bench_planner.json", quick="a 16384-token prompt, B 1024, 2 stages, 1 repeat"
    )
    parser.add_argument("policy", nargs="?", default=None)
    parser.add_argument("--prompt-len", type=int, default=1 << 20)
    parser.add_argument("--pp", type=int, default=4)
    args = parser.parse_args()
    base_chunk_size, repeats = 8192, REPEATS
    if args.quick:
        args.prompt_len, args.pp, base_chunk_size, repeats = 16384, 2, 1024, 1
    policy = load(args.policy) if args.policy else synthetic_policy(args.prompt_len + 1024, args.pp, base_chunk_size)
    timings, plans = {}, {}
    for strategy in STRATEGIES:
        runs = []
        for _ in range(repeats):
            start = time.perf_counter()
            (plan,) = plan_prompt(policy, args.prompt_len, args.pp, (strategy,))
            runs.append(time.perf_counter() - start)
        timings[strategy] = statistics.median(runs)
        plans[strategy] = {
            "num_chunks": len(plan.chunk_sizes),
            "ttft_ms": plan.ttft_ms,
            "max_latency_ms": max(plan.latencies_ms),
        }
        if plan.search is not None:
            plans[strategy]["search"] = plan.search
    result = {
        "policy": args.policy or f"synthetic (prefix model, B={base_chunk_size}, alignment 64)",
        "prompt_len": args.prompt_len,
        "num_stages": args.pp,
        "seconds_median": timings,
        "repeats": repeats,
        "plans": plans,
    }
    write_result(args.out, result)
    for s in STRATEGIES:
        search = plans[s].get("search")
        note = (
            ""
            if not search
            else (
                " (exact on the grid)"
                if search["exact_on_grid"]
                else f" (within {search['gap_ms']:.1f} ms of the grid's optimum)"
            )
        )
        print(f"{s}: {timings[s]:.3f} s, {plans[s]['num_chunks']} chunks, TTFT {plans[s]['ttft_ms']:.1f} ms{note}")
    print(f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

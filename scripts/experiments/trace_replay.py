"""Mooncake's conversation trace (../shared/data/mooncake/, 12,031 requests over an hour, 37% of its input tokens an
earlier request's prefix) replayed whole in the serving simulation, every arm, with the prefix cache and without:
on the default profile (results/bench-reference/profile's samples refitted, lengths scaled onto its 32768-token
context) and on a GPU-sized policy of AMD ATOM's published model (PP4, B 8192, lengths as they are), each at the
trace's own pace and compressed until the pipeline is busy. What `serve-bench --simulate --trace` prints, per case.

Usage: python scripts/experiments/trace_replay.py [TRACE.jsonl] [-o OUT.json] [--quick]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from under_load_sim import default_policy, gpu_sized_policy  # noqa: E402

from ppprof.manifest import script_parser, write_result  # noqa: E402
from ppprof.policy import load  # noqa: E402
from ppprof.serving.arms import SERVING_ARMS  # noqa: E402
from ppprof.serving.replay import replay  # noqa: E402
from ppprof.traces import read_trace  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"
HEAD = REPO / "tests" / "data" / "mooncake-head.jsonl"
"""Its first 300 requests, shipped: what --quick replays."""
LONGEST = 126195
"""The conversation trace's longest input: the default profile's lengths are scaled so that it fits the context."""


def cases(quick: bool):
    """(name, policy, length scale, time scales)."""
    if quick:  # the committed policy as it is: no refit
        committed = load(REPO / "results/bench-reference/profile/policy.json")
        return [("default profile", committed, committed.settings.context_len / LONGEST, (1.0,))]
    default = default_policy()
    scale = default.settings.context_len / LONGEST
    return [("default profile", default, scale, (1.0, 0.4)), ("ATOM's model, PP4", gpu_sized_policy(), 1.0, (1.0, 0.3))]


def main() -> None:
    parser = script_parser(
        __doc__,
        "results/trace-replay.json",
        quick="the trace's first 300 requests, the committed default policy unrefitted",
    )
    parser.add_argument("trace", nargs="?", default=None, help=f"[{TRACE}; --quick: {HEAD.relative_to(REPO)}]")
    args = parser.parse_args()
    args.trace = args.trace or str(HEAD if args.quick else TRACE)
    window = None
    arms = ("fixed", "policy") if args.quick else SERVING_ARMS
    out = []
    for name, policy, length_scale, time_scales in cases(args.quick):
        for time_scale in time_scales:
            part = read_trace(
                args.trace,
                window_s=window,
                time_scale=time_scale,
                length_scale=length_scale,
                context_len=policy.settings.context_len,
            )
            for cache in (None, 0):
                runs = replay(policy, part, arms, policy.pp_size, 0, cache)
                out.append({"case": name, "trace": part.to_dict(), "cache": cache != 0, "runs": runs})
                best = min(r["mean_ttft_ms"] for r in runs)
                ranks = ", ".join(f"{r['arm']} {r['mean_ttft_ms'] / best - 1:+.1%}" for r in runs)
                print(
                    f"{name}, time x {time_scale:g}, cache {'on' if cache != 0 else 'off'}: mean TTFT vs best: {ranks}"
                )
    write_result(args.out, {"trace": args.trace, "cases": out})


if __name__ == "__main__":
    main()

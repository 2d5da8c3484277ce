"""Benchmark Policy.next_chunk_size lookups (timeit, median of repeats): the history-only table (one bisect, checked
against a linear scan) and the prompt-aware rule (two bisects); writes results/bench_policy.json.

Usage: python scripts/benchmarks/policy.py [POLICY.json] [-o OUT.json] [--quick]
  (default POLICY: a dynamic policy fitted to synthetic samples)
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

from ppprof.fit import fit
from ppprof.fit.synthetic import SyntheticProbes, SyntheticRun, make_samples, write_run_dir
from ppprof.manifest import script_parser, write_result
from ppprof.policy import LatencyModel, load

NUM_KEYS = 1000
REPEATS = 15
BUDGET_US = 1.0


def synthetic_policy(tmp: Path, context_len: int = 1 << 20) -> Path:
    """A prefix model's samples (B 8192, prefixes up to half the context) fitted as `ppprof fit` fits them."""
    model = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=2e-4)
    frame = make_samples(
        model,
        SyntheticProbes(
            base_chunk_size=8192,
            prefixes=[0, context_len // 32, context_len // 8, context_len // 2],
            chunk_sizes=[1024, 2048, 4096, 8192],
            noise=0.01,
        ),
    )
    samples = write_run_dir(tmp, frame, SyntheticRun(base_chunk_size=8192, context_len=context_len))
    path, _ = fit(samples, policy_options={"min_gain": 0.0})  # dynamic whatever its rules gain
    return path


def linear_lookup(table: dict, prefix_len: int) -> int:
    """The reference: the history-only table's chunk at `prefix_len` by a linear scan of its starts."""
    chunk = table["chunk_size"][0]
    for start, size in zip(table["prefix_len"], table["chunk_size"]):
        if start > prefix_len:
            break
        chunk = size
    return chunk


def main() -> int:
    parser = script_parser(
        __doc__, "results/bench_policy.json", quick="a context of 64K tokens, 3 repeats of 5 x 1000 lookups"
    )
    parser.add_argument("policy", nargs="?", default=None)
    args = parser.parse_args()
    repeats, number = (3, 5) if args.quick else (REPEATS, 200)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.policy) if args.policy else synthetic_policy(Path(tmp), 1 << 16 if args.quick else 1 << 20)
        policy = load(path)
        context_len = policy.settings.context_len
        keys = [random.Random(0).randrange(0, context_len) for _ in range(NUM_KEYS)]
        lookup = policy.next_chunk_size
        table = policy.data["table"]
        assert all(lookup(k) == linear_lookup(table, k) for k in keys[:200]), "bisect and linear scan disagree"
        timer = timeit.Timer("for k in keys: lookup(k)", globals={"keys": keys, "lookup": lookup})
        loop = timeit.Timer("for k in keys: pass", globals={"keys": keys})
        per_call = [
            (t - e) / (number * NUM_KEYS) * 1e6
            for t, e in zip(timer.repeat(repeats, number), loop.repeat(repeats, number))
        ]
        # The prompt-aware rule: a prompt of the context's length, asked at every key (two bisects).
        prompt_len = context_len
        rule_calls = timeit.Timer(
            "for k in keys: lookup(k, n)", globals={"keys": keys[:100], "lookup": lookup, "n": prompt_len}
        )
        rule_us = statistics.median(t / (20 * 100) * 1e6 for t in rule_calls.repeat(5, 20))
        result = {
            "policy": str(path) if args.policy else f"synthetic (prefix model, B=8192, context {context_len})",
            "status": policy.status,
            "table_entries": len(policy.data["table"]["chunk_size"]),
            "lookup_median_us": statistics.median(per_call),
            "lookup_min_us": min(per_call),
            "lookup_budget_us": BUDGET_US,
            "within_budget": statistics.median(per_call) <= BUDGET_US,
            "prompt_aware_median_us": rule_us,
            "repeats": repeats,
            "calls_per_repeat": number * NUM_KEYS,
        }
    write_result(args.out, result)
    print(
        f"lookup median {result['lookup_median_us']:.3f} us (prompt-aware rule {rule_us:.3f} us), "
        f"{result['table_entries']} table entries -> {args.out}"
    )
    return 0 if result["within_budget"] or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark Policy.next_chunk_size lookups (timeit, median of repeats); writes results/bench_policy.json.

Usage: python scripts/benchmarks/policy.py [POLICY.json]   (default: a dynamic policy fitted to synthetic samples)
"""

from __future__ import annotations

import argparse
import platform
import random
import statistics
import sys
import tempfile
import timeit
from pathlib import Path

from ppprof.fit import fit
from ppprof.fit.synthetic import make_samples, write_run_dir
from ppprof.io import atomic_write_json
from ppprof.policy import LatencyModel, load

NUM_KEYS = 1000
REPEATS = 15
BUDGET_US = 1.0


def synthetic_policy(tmp: Path) -> Path:
    model = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=2e-4)
    frame = make_samples(model, base_chunk_size=8192, prefixes=[0, 32768, 131072, 524288],
                         chunk_sizes=[1024, 2048, 4096, 8192], noise=0.01)
    samples = write_run_dir(tmp, frame, base_chunk_size=8192, context_len=1 << 20)
    path, _ = fit(samples)
    return path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("policy", nargs="?", default=None)
    parser.add_argument("-o", "--out", default="results/bench_policy.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(args.policy) if args.policy else synthetic_policy(Path(tmp))
        policy = load(path)
        context_len = policy.settings.context_len
        keys = [random.Random(0).randrange(0, context_len) for _ in range(NUM_KEYS)]
        lookup = policy.next_chunk_size
        assert all(lookup(k) == policy.rule(k) for k in keys[:200]), "table and rule disagree"
        timer = timeit.Timer("for k in keys: lookup(k)", globals={"keys": keys, "lookup": lookup})
        loop = timeit.Timer("for k in keys: pass", globals={"keys": keys})
        number = 200
        per_call = [(t - e) / (number * NUM_KEYS) * 1e6
                    for t, e in zip(timer.repeat(REPEATS, number), loop.repeat(REPEATS, number))]
        rule_calls = timeit.Timer("for k in keys: rule(k)", globals={"keys": keys[:100], "rule": policy.rule})
        rule_us = statistics.median(t / (20 * 100) * 1e6 for t in rule_calls.repeat(5, 20))
        result = {
            "policy": str(path) if args.policy else "synthetic (prefix model, B=8192, context 1M)",
            "status": policy.status,
            "table_entries": len(policy.data["table"]["chunk_size"]),
            "lookup_median_us": statistics.median(per_call),
            "lookup_min_us": min(per_call),
            "lookup_budget_us": BUDGET_US,
            "within_budget": statistics.median(per_call) <= BUDGET_US,
            "direct_rule_median_us": rule_us,
            "repeats": REPEATS,
            "calls_per_repeat": number * NUM_KEYS,
            "python": sys.version.split()[0],
            "machine": platform.machine(),
        }
    atomic_write_json(args.out, result)
    print(f"lookup median {result['lookup_median_us']:.3f} us (direct rule {rule_us:.3f} us), "
          f"{result['table_entries']} table entries -> {args.out}")
    return 0 if result["within_budget"] else 1


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark (not a test): ppprof's allocators against a reference design that keeps the free list as a tensor and
frees by torch.cat, as common serving engines do. Both run side by side in one process; the ratios are what count.

    python scripts/benchmarks/alloc.py [--repeats 7] [-o results/bench_alloc.json] [--quick]
"""

from __future__ import annotations

import random
import statistics
import time

import torch

from ppprof.manifest import script_parser, write_result
from ppprof.mem import KVAllocator, MambaAllocator

NUM_REQUESTS = 128
MIN_TIME_S = 0.2


class TensorFreeList:
    """The reference: free slots in a tensor; alloc slices it, free concatenates (one new tensor per free)."""

    def __init__(self, size: int) -> None:
        self.free_slots = torch.arange(1, size + 1, dtype=torch.int64)
        self.group: torch.Tensor | None = None

    def alloc(self, n: int) -> torch.Tensor | None:
        if self.group is not None and self.group.numel() >= n:
            out, self.group = self.group[:n], self.group[n:]
            return out
        if n > self.free_slots.numel():
            return None
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return out

    def free(self, idx: torch.Tensor) -> None:
        self.free_slots = torch.cat((self.free_slots, idx))

    def alloc_group_begin(self, n: int) -> None:
        self.group = self.alloc(n)

    def alloc_group_end(self) -> None:
        if self.group is not None and self.group.numel():
            self.free(self.group)
        self.group = None


def grouped_cycle(a) -> None:
    a.alloc_group_begin(NUM_REQUESTS)
    got = [a.alloc(1) for _ in range(NUM_REQUESTS)]
    for s in got:
        a.free(s)
    a.alloc_group_end()


def per_call_cycle(a) -> None:
    got = [a.alloc(1) for _ in range(NUM_REQUESTS)]
    for s in got:
        a.free(s)


def kv_cycle(a, lengths: list[int]) -> None:
    got = [a.alloc(n) for n in lengths]
    for s in got:
        a.free(s)


def ops_per_s(fn, ops_per_call: int, repeats: int, min_time_s: float = MIN_TIME_S) -> float:
    """Median over `repeats` of (ops / s), each repeat running `fn` for at least `min_time_s`."""
    rates = []
    for _ in range(repeats):
        calls, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < min_time_s:
            fn()
            calls += 1
        rates.append(calls * ops_per_call / elapsed)
    return statistics.median(rates)


def main() -> None:
    ap = script_parser(__doc__, "results/bench_alloc.json", quick="1 repeat of 10 ms a case")
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    repeats, min_time_s = (1, 0.01) if args.quick else (args.repeats, MIN_TIME_S)
    torch.set_num_threads(1)

    rng = random.Random(0)
    lengths = [rng.choice([64, 128, 256, 512, 1024, 2048]) + rng.randrange(0, 64) for _ in range(NUM_REQUESTS)]
    kv_size = sum(lengths) + 4096
    ops = 2 * NUM_REQUESTS  # one alloc and one free per request

    cases = {
        "mamba_grouped": (lambda: grouped_cycle(ours_m), lambda: grouped_cycle(ref_m)),
        "mamba_per_call": (lambda: per_call_cycle(ours_m), lambda: per_call_cycle(ref_m)),
        "kv_mixed_p1": (lambda: kv_cycle(ours_kv1, lengths), lambda: kv_cycle(ref_kv, lengths)),
        "kv_mixed_p16": (lambda: kv_cycle(ours_kv16, lengths), lambda: kv_cycle(ref_kv, lengths)),
    }
    ours_m, ref_m = MambaAllocator(1024), TensorFreeList(1024)
    ours_kv1, ours_kv16, ref_kv = KVAllocator(kv_size), KVAllocator(kv_size * 2 // 16 * 16, 16), TensorFreeList(kv_size)

    results = {}
    for name, (ours, ref) in cases.items():
        # Interleave ours and the reference per repeat so that machine noise hits both alike.
        r_ours, r_ref = [], []
        for _ in range(repeats):
            r_ours.append(ops_per_s(ours, ops, 1, min_time_s))
            r_ref.append(ops_per_s(ref, ops, 1, min_time_s))
        o, r = statistics.median(r_ours), statistics.median(r_ref)
        results[name] = {"ours_ops_per_s": round(o), "reference_ops_per_s": round(r), "speedup": round(o / r, 2)}
        print(f"{name:16s} ours {o:12,.0f} ops/s   reference {r:12,.0f} ops/s   x{o / r:6.2f}")

    grouped_vs_per_call = results["mamba_grouped"]["ours_ops_per_s"] / results["mamba_per_call"]["ours_ops_per_s"]
    print(f"ours: grouped / per-call = x{grouped_vs_per_call:.2f}")
    out = {
        "schema_version": 1,
        "what": "ops/s of alloc+free (2 ops a request), 128 requests a cycle; reference = tensor free list + torch.cat",
        "repeats": repeats,
        "cases": results,
        "grouped_over_per_call": round(grouped_vs_per_call, 2),
        "targets": {
            "grouped_speedup_vs_reference_ge_10": results["mamba_grouped"]["speedup"] >= 10,
            "grouped_faster_than_per_call": grouped_vs_per_call > 1,
        },
    }
    write_result(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

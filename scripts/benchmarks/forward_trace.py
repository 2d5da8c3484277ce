"""Benchmark (not a test): what a forward trace costs the serving loop. The loop's side of one forward is the
writer's `record()` (the pieces copied, a put without waiting), timed over a burst of forwards while the writer's
thread writes them; the thread's side is its CPU per forward (JSON, the write), which a busy host pays elsewhere.
Both against the smallest forward of a real trace (the committed serve-bench trace of tiny-hybrid by default): the
issue's goal is the loop's cost under 1% of the smallest forward.

    python scripts/benchmarks/forward_trace.py [--trace tests/runs/tiny-hybrid/trace.jsonl] [--repeats 7]
        [-o results/bench_forward_trace.json] [--quick]
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from ppprof.forwards import ForwardTraceWriter, TraceIdentity, header, read_forwards
from ppprof.manifest import script_parser, write_result

PIECES = [(1024, 256), (0, 128), (512, 64)]
"""A packed batch of three pieces: a trace record a little longer than most."""


def one_repeat(folder: Path, forwards: int, k: int) -> dict:
    """`forwards` records through a fresh writer: the loop's microseconds per record() (each call timed), and the
    whole per forward (from the first record to the file closed, over the forwards: the thread's JSON and write)."""
    identity = TraceIdentity(
        model_shape=None, pp_size=2, tp_size=1, device="cpu", dtype="float32", server="bench", server_version="0",
        context_len=4096,
    )  # fmt: skip
    head = header(identity, clock="perf_counter", max_records=0, started_at="")
    writer = ForwardTraceWriter(folder / f"t{k}.jsonl", head, forwards)
    start, loop_s = time.perf_counter(), 0.0
    for i in range(forwards):
        t = time.perf_counter()
        writer.record(i % 2, 0, PIECES, 3.25, 1.7e9 + i * 1e-3)
        loop_s += time.perf_counter() - t  # record() alone, not the yields below
        if writer.accepted - writer.written > 2048:  # the burst never outruns the thread into the drop path
            time.sleep(0.0005)
    writer.close()
    total_s = time.perf_counter() - start
    assert writer.written == forwards and writer.dropped == 0, (writer.written, writer.dropped)
    return {"loop_us": loop_s / forwards * 1e6, "thread_us": total_s / forwards * 1e6}


def main() -> None:
    parser = script_parser(__doc__, "results/bench_forward_trace.json", quick="2000 forwards, 3 repeats")
    parser.add_argument("--trace", default="tests/runs/tiny-hybrid/trace.jsonl")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    forwards, repeats = (2000, 3) if args.quick else (20000, args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        runs = [one_repeat(Path(tmp), forwards, k) for k in range(repeats)]
    smallest_ms = min(read_forwards([args.trace]).latency_ms)
    loop_us = statistics.median(r["loop_us"] for r in runs)
    thread_us = statistics.median(r["thread_us"] for r in runs)
    result = {
        "forwards_a_repeat": forwards,
        "repeats": repeats,
        "loop_us_per_forward": loop_us,
        "thread_us_per_forward": thread_us,
        "smallest_forward_ms": smallest_ms,
        "loop_fraction_of_smallest_forward": loop_us / (smallest_ms * 1e3),
        "thread_fraction_of_smallest_forward": thread_us / (smallest_ms * 1e3),
        "trace": args.trace,
        "runs": runs,
    }
    write_result(args.out, result)
    print(
        f"record(): {loop_us:.2f} us a forward in the loop, {thread_us:.2f} us in the writer's thread; smallest "
        f"forward {smallest_ms:.3f} ms: {result['loop_fraction_of_smallest_forward']:.3%} "
        f"({result['thread_fraction_of_smallest_forward']:.3%} with the thread's)"
    )


if __name__ == "__main__":
    main()

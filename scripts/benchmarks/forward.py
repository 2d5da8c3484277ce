"""Benchmark (not a test): latency of one prefill chunk through the whole synthetic model, per chunk size and prefix.

The prefix is synthetic, as a probe's is: random K/V at the prefix slots and a random Mamba state, not computed.

    python scripts/benchmarks/forward.py [--model tiny-hybrid] [--repeats 5] [-o results/bench_forward.json] [--quick]
"""

from __future__ import annotations

import statistics

import torch

from ppprof.manifest import script_parser, write_result
from ppprof.mem.cache import Request
from ppprof.model import Stage, build_stage_cache
from ppprof.probe.request import set_up_request
from ppprof.probe.synth import ProbeRequest
from ppprof.probe.timer import Timer
from ppprof.specs import load_spec
from ppprof.specs.memory import CacheSizes

CHUNK_SIZES = (64, 128, 256, 512)
PREFIX_LENS = (0, 512, 1024, 2048)
WARMUP = 2


def chunk_latency_ms(
    stage: Stage, cache, chunk_size: int, prefix_len: int, repeats: int, gen: torch.Generator
) -> float:
    """Median forward latency of a `chunk_size` chunk after a `prefix_len` prefix, over `repeats` runs after warm-up.
    Each run is a fresh request, set up as a probe's is (ppprof.probe.request) and released afterwards; the set-up
    and the release are not timed; the timer is the profile's (ppprof.probe.timer)."""
    tokens = torch.randint(0, stage.spec.vocab_size, (chunk_size,), generator=gen).to(cache.device)
    times_ms = []
    for run in range(WARMUP + repeats):
        req = Request(run)
        try:
            set_up_request(cache, req, ProbeRequest(run, prefix_len, chunk_size), gen)
            with Timer(cache.device) as t:
                stage(cache, req, tokens, None, prefix_len)
            if run >= WARMUP:
                times_ms.append(t.elapsed_ms)
        finally:
            cache.release(req)
    cache.check_no_leaks()
    return statistics.median(times_ms)


def main() -> None:
    ap = script_parser(__doc__, "results/bench_forward.json", quick="chunks 64 and 128, prefixes 0 and 512, 1 repeat")
    ap.add_argument("--model", default="tiny-hybrid", help="preset name or spec file")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    chunk_sizes, prefix_lens = (CHUNK_SIZES[:2], PREFIX_LENS[:2]) if args.quick else (CHUNK_SIZES, PREFIX_LENS)
    repeats = 1 if args.quick else args.repeats

    spec = load_spec(args.model)
    device = torch.device(args.device)
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    layer_ids = range(spec.num_layers)
    stage = Stage(spec, layer_ids, dtype=dtype, device=device, seed=0)
    context_len = max(chunk_sizes) + max(prefix_lens)
    cache = build_stage_cache(
        spec,
        layer_ids,
        CacheSizes(
            max_total_tokens=context_len + 64,
            page_size=1,
            max_mamba_cache_size=1,
            max_running_requests=1,
            context_len=context_len,
        ),
        dtype=dtype,
        device=device,
    )
    gen = torch.Generator().manual_seed(0)

    # One untimed sweep of every chunk size first: the first calls pay for lazy init (kernels, allocator pools),
    # which the per-cell warm-up alone does not absorb for the first cell.
    for chunk_size in chunk_sizes:
        chunk_latency_ms(stage, cache, chunk_size, 0, 1, gen)
    print(f"{spec.name} ({spec.pattern}), {dtype}, {device}, {torch.get_num_threads()} threads; median ms")
    print("chunk \\ prefix " + "".join(f"{p:>10d}" for p in prefix_lens))
    rows = []
    for chunk_size in chunk_sizes:
        line = f"{chunk_size:>15d}"
        for prefix_len in prefix_lens:
            latency_ms = chunk_latency_ms(stage, cache, chunk_size, prefix_len, repeats, gen)
            rows.append({"chunk_size": chunk_size, "prefix_len": prefix_len, "latency_ms": round(latency_ms, 3)})
            line += f"{latency_ms:>10.2f}"
        print(line)

    ms = {(r["chunk_size"], r["prefix_len"]): r["latency_ms"] for r in rows}
    grows = all(ms[c, prefix_lens[-1]] > ms[c, prefix_lens[0]] for c in chunk_sizes)
    print(f"latency at prefix {prefix_lens[-1]} > at prefix 0 for every chunk size: {grows}")
    out = {
        "schema_version": 1,
        "what": "median latency (ms) of one prefill chunk through the whole model, after a synthetic prefix",
        "model": spec.to_dict(),
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(device),
        "threads": torch.get_num_threads(),
        "warmup": WARMUP,
        "repeats": repeats,
        "samples": rows,
        "cost_grows_with_prefix": grows,
    }
    write_result(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

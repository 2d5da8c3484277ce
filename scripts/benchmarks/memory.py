"""Benchmark (not a test): the stage memory estimate (ppprof.specs.memory) against the measured peak of one forward of
the largest probe request, the whole model as one stage, on CPU in fp32, for the tiny presets, a few base chunks and
both attention backends. The probe sizes and pools are the profile's defaults for the base chunk (ProfileConfig), the
largest probe chunk 1.25 B (--max-probe-chunk-multiple 1.25, the size results/bench_memory.json measured: at 4 B the
reference backend's dense scores at B = 2048 would take several GiB and minutes).

    python scripts/benchmarks/memory.py [-o results/bench_memory.json] [--quick]
    python scripts/benchmarks/memory.py --measure MODEL BACKEND BASE_CHUNK [--malloc exact|default]  # one, as JSON

Each measurement runs in a fresh Python, so that its peak is its own: torch on one thread; a small warm-up forward of
the same model first (the first call of each op faults in libtorch's code pages, 5-10 MiB that are no tensor of the
model); then VmRSS is read and the peak reset (/proc/self/clear_refs), the stage, its cache and the request are built
as a profile rank builds them (ppprof.probe.request.set_up_request), one forward runs, and the peak VmHWM less that
VmRSS is the measured need. glibc's malloc decides how much freed memory stays resident, so each case is measured
under two settings (MALLOC_MODES): `exact`, the figure the estimate is held to (every block above 128 KiB mapped on
its own and unmapped when freed, so RSS follows the live tensors to the page), and `default`, glibc's moving
thresholds as any Python process has them (freed heap memory stays resident and is reused; the heap's layout, hence
the peak, varies from run to run with address randomisation, by up to ~30% here). A profile rank fixes the thresholds higher
(ppprof.probe.malloc), which keeps more freed memory resident; its RSS delta says little about one forward.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

MALLOC_MODES = {"exact": {"MALLOC_MMAP_THRESHOLD_": "131072"}, "default": {}}
"""Environment of each measurement's process (glibc reads MALLOC_MMAP_THRESHOLD_ at start)."""
CASES = [
    (model, backend, base)
    for model in ("tiny-dense", "tiny-hybrid")
    for backend in ("sdpa", "reference")
    for base in (512, 2048, 4096)
]
STATUS = Path("/proc/self/status")
CLEAR_REFS = Path("/proc/self/clear_refs")


def status_bytes(key: str) -> int:
    """VmRSS or VmHWM of this process in bytes."""
    return int(re.search(rf"^{key}:\s+(\d+) kB", STATUS.read_text(), re.M).group(1)) * 1024


def reset_peak() -> None:
    """VmHWM back to the current VmRSS (Linux >= 4.0)."""
    CLEAR_REFS.write_text("5")


def forward(cfg, spec, backend: str, chunk_size: int, prefix_len: int, max_total_tokens: int) -> tuple:
    """Build the whole model as one stage and its cache as a profile rank does, set up one probe request and run its
    forward; returns what must stay alive until the peak is read, and the RSS after the build."""
    import torch

    from ppprof.mem.cache import Request
    from ppprof.model.stage import Stage, build_stage_cache
    from ppprof.probe.request import set_up_request
    from ppprof.probe.synth import ProbeRequest
    from ppprof.specs.memory import CacheSizes

    layers = range(spec.num_layers)
    stage = Stage(spec, layers, dtype=torch.float32, attention_backend=backend)
    cache = build_stage_cache(
        spec,
        layers,
        CacheSizes(
            max_total_tokens=max_total_tokens,
            page_size=cfg.pools.page_size,
            max_mamba_cache_size=cfg.pools.max_mamba_cache_size,
            max_running_requests=cfg.pools.max_running_requests,
            context_len=cfg.probes.context_len,
        ),
        dtype=torch.float32,
    )
    gen = torch.Generator().manual_seed(0)
    req = Request(0)
    set_up_request(cache, req, ProbeRequest(0, prefix_len, chunk_size), gen)
    tokens = torch.randint(0, spec.vocab_size, (chunk_size,), generator=gen)
    built = status_bytes("VmRSS")
    build_peak = status_bytes("VmHWM")
    reset_peak()
    out = stage(cache, req, tokens, None, prefix_len)
    return (stage, cache, out), built, build_peak


def measure(model: str, backend: str, base_chunk_size: int) -> dict:
    """One measurement in this process (run it in a fresh one): estimate and measured peak, bytes."""
    import torch

    from ppprof.config import ProfileConfig
    from ppprof.config.sections import SGLANG_PROBE_MULTIPLE
    from ppprof.run.memory_check import profile_memory
    from ppprof.specs import load_spec

    torch.set_num_threads(1)
    cfg = ProfileConfig(
        model=model,
        base_chunk_size=base_chunk_size,
        attention_backend=backend,
        nproc_per_node=1,
        max_probe_chunk_multiple=SGLANG_PROBE_MULTIPLE,
    )
    spec = load_spec(model)
    (estimate,) = profile_memory(cfg, 1, spec)
    held = forward(cfg, spec, backend, 16, 16, 64)  # warm-up: every op once, small
    del held
    before = status_bytes("VmRSS")
    reset_peak()
    held, built, build_peak = forward(
        cfg, spec, backend, estimate.chunk_size, estimate.prefix_len, cfg.pools.max_total_tokens
    )
    peak = max(build_peak, status_bytes("VmHWM"))
    return {
        "model": model,
        "attention_backend": backend,
        "base_chunk_size": base_chunk_size,
        "chunk_size": estimate.chunk_size,
        "prefix_len": estimate.prefix_len,
        "estimate": estimate.total,
        "measured": peak - before,
        "ratio": round(estimate.total / (peak - before), 3),
        "activation_estimate": estimate.activation_peak,
        "activation_measured": status_bytes("VmHWM") - built,
        "activation_layer": estimate.activation_layer,
        "estimate_parts": estimate.to_dict(),
    }


def measure_in_fresh_python(
    model: str, backend: str, base_chunk_size: int, malloc: str = "exact", timeout_s: float = 120
) -> dict:
    """measure() in a new Python process (this script with --measure), malloc set as MALLOC_MODES[malloc] says."""
    argv = [sys.executable, __file__, "--measure", model, backend, str(base_chunk_size), "--malloc", malloc]
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | MALLOC_MODES[malloc]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False, env=env)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    from ppprof.manifest import script_parser, write_result

    ap = script_parser(__doc__, "results/bench_memory.json", quick=f"one case, {' '.join(map(str, CASES[0]))}")
    ap.add_argument("--measure", nargs=3, metavar=("MODEL", "BACKEND", "BASE_CHUNK"), help=argparse.SUPPRESS)
    ap.add_argument("--malloc", choices=tuple(MALLOC_MODES), default="exact", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        model, backend, base = args.measure
        print(json.dumps(measure(model, backend, int(base))))
        return

    mib = 2**20
    print(
        f"{'model':<12} {'backend':<10} {'B':>5} {'chunk':>6} {'prefix':>6} {'estimate':>9} {'exact':>9} "
        f"{'ratio':>6} {'default':>9} {'ratio':>6}   activations est / exact (MiB)"
    )
    rows = []
    for model, backend, base in CASES[:1] if args.quick else CASES:
        row = measure_in_fresh_python(model, backend, base)
        other = measure_in_fresh_python(model, backend, base, "default")
        row["measured_default_malloc"], row["ratio_default_malloc"] = other["measured"], other["ratio"]
        rows.append(row)
        print(
            f"{model:<12} {backend:<10} {base:>5} {row['chunk_size']:>6} {row['prefix_len']:>6} "
            f"{row['estimate'] / mib:>8.1f}M {row['measured'] / mib:>8.1f}M {row['ratio']:>6.2f} "
            f"{row['measured_default_malloc'] / mib:>8.1f}M {row['ratio_default_malloc']:>6.2f}   "
            f"{row['activation_estimate'] / mib:.1f} / {row['activation_measured'] / mib:.1f}"
        )
    summary = {key: [min(r[key] for r in rows), max(r[key] for r in rows)] for key in ("ratio", "ratio_default_malloc")}
    print(
        "estimate / measured, min .. max: " + ", ".join(f"{k} {lo:.2f} .. {hi:.2f}" for k, (lo, hi) in summary.items())
    )
    write_result(
        args.out,
        {
            "schema_version": 1,
            "what": "estimated (ppprof.specs.memory) vs measured (VmHWM - VmRSS, fresh process) bytes of one stage "
            "holding the whole model: weights, pools and one forward of the largest probe request; CPU, fp32, "
            "1 thread, profile defaults for each base chunk. measured: malloc 'exact' (MALLOC_MMAP_THRESHOLD_="
            "131072: RSS follows the live tensors); measured_default_malloc: glibc's defaults",
            "rows": rows,
            "ratio_range": summary,
        },
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

"""AMD ATOM's published case under load, simulated: Kimi-K2.5 on MI355X, prefill-only PP4, 131072-token prompts, fixed
chunks of 32768 against ATOM's dynamic rule, at concurrency 1, 4 and 16 (closed loop), beside ATOM's measured changes.

The latency model is ATOM's published calibration (a 3.25e-7 ms/token^2, b 6.03e-3 ms/token, c 26.1 ms, g 5.39e-4
ms/token), the prefix form t(L, x) = c + g L + b x + a (2 L x + x^2); the scheduler is ppprof.serving's (SGLang's PP
loop for a prefill-only server: 4 micro-batch slots round robin, the chunked request first, waiting requests packed
into the rest of the budget), each batch priced as one packed forward, with OVERHEAD_MS a chunk (what brings this
model's one-prompt TTFTs to ATOM's measured ones). SGLang keeps pp_size micro-batches in flight by default
(pp_async_batch_depth 0); an engine may keep more: each level is simulated at async depths 0 to 4.

Usage: python scripts/experiments/atom_under_load.py [-o OUT.json]
"""

from __future__ import annotations

from ppprof.manifest import script_parser, write_result
from ppprof.policy.rule import LatencyModel
from ppprof.servers.atom import ATOM
from ppprof.servers.base import ServerSetting
from ppprof.serving.arms import packed_stage_ms
from ppprof.serving.scheduler import Capacity
from ppprof.serving.simulate import Arrivals, LoadLevel, serve

MODEL = LatencyModel("prefix", a=3.25e-7, b=6.03e-3, c=26.1, g=5.39e-4)
PP_SIZE, PROMPT_LEN, B, CONTEXT_LEN = 4, 131072, 32768, 262144
OVERHEAD_MS = 20.0
MEASURED = {  # ATOM's design doc: throughput and mean TTFT, fixed 32768 -> dynamic
    1: {"ttft_ms": (14896, 9774)},
    4: {"throughput": (14618, 13095), "ttft_ms": (30108, 35451)},
    16: {"throughput": (15785, 13377), "ttft_ms": (110727, 131369)},
}


def sizers():
    dynamic = ServerSetting(
        server="atom",
        base_chunk_size=B,
        dynamic=True,
        smooth_factor=1.0,
        min_chunk_size=4096,
        max_chunk_size=B,
        page_size=1,
    )
    rule = ATOM.rule(dynamic, MODEL, CONTEXT_LEN)
    return {"fixed-32768": lambda L, n, load: B, "atom-dynamic": lambda L, n, load: rule.next(L)}


def level(concurrency: int, overhead_ms: float, async_depth: int) -> dict:
    out = {}
    for arm, sizer in sizers().items():
        prompts = [PROMPT_LEN] * max(4 * concurrency, 8)
        served = serve(
            PP_SIZE,
            sizer,
            packed_stage_ms(MODEL.with_overhead(overhead_ms), PP_SIZE),
            Capacity(PROMPT_LEN * concurrency, concurrency),
            Arrivals(prompts, LoadLevel(concurrency=concurrency)),
            async_depth,
        )
        out[arm] = served.summary()
    fixed, dyn = out["fixed-32768"], out["atom-dynamic"]
    out["simulated_change"] = {
        "throughput": dyn["throughput_tokens_per_s"] / fixed["throughput_tokens_per_s"] - 1,
        "mean_ttft": dyn["ttft_ms"]["mean"] / fixed["ttft_ms"]["mean"] - 1,
    }
    measured = MEASURED[concurrency]
    out["measured_change"] = {k: v[1] / v[0] - 1 for k, v in measured.items()}
    return out


def main() -> None:
    args = script_parser(__doc__, None).parse_args()
    result = {"what": __doc__.splitlines()[0], "levels": {}}
    result["overhead_ms"] = OVERHEAD_MS
    for depth in range(5):
        rows = result["levels"][f"async_depth_{depth}"] = {}
        for concurrency in MEASURED:
            rows[str(concurrency)] = r = level(concurrency, OVERHEAD_MS, depth)
            sim, meas = r["simulated_change"], r["measured_change"]
            print(
                f"async depth {depth}, concurrency {concurrency:2d}: fixed {r['fixed-32768']['ttft_ms']['mean']:8.0f} ms "
                f"{r['fixed-32768']['throughput_tokens_per_s']:7.0f} tok/s, dynamic "
                f"{r['atom-dynamic']['ttft_ms']['mean']:8.0f} ms {r['atom-dynamic']['throughput_tokens_per_s']:7.0f} tok/s "
                f"({r['atom-dynamic']['chunks_per_request']:.0f} chunks); simulated throughput {sim['throughput']:+.1%}, "
                f"mean TTFT {sim['mean_ttft']:+.1%}; measured " + ", ".join(f"{k} {v:+.1%}" for k, v in meas.items())
            )
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()

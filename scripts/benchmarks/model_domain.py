"""Benchmark (not a test): the old default probe grid (prefixes B, 2B, 4B) against the new default (6 prefixes
log-spaced from B to the context), each judged on what it never saw:
1. a separate validation profile (other prefix lengths across the context, other chunk sizes, another seed): MAPE of
   each policy's model on its prefixed rows, per prefix band;
2. `ppprof bench` at 16 x B and 64 x B (PP2, real): the prediction error per strategy, and whether the predicted
   ranking of fixed-best, greedy and optimal matches the measured one.
Profiles and benches run one after another on an otherwise idle machine (about 6 minutes on 2 cores).

    python scripts/benchmarks/model_domain.py [-o results/bench_model_domain] [--repeats 3]

It starts ranks for minutes: tests/test_scripts.py runs its --help only. OUT/manifest.json says how OUT was made.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ppprof.io import atomic_write_json
from ppprof.manifest import script_parser, write_manifest
from ppprof.policy import load
from ppprof.runfiles import stage_column

PPPROF = [sys.executable, "-m", "ppprof"]
GRIDS = {
    "old grid (B, 2B, 4B)": ["--design", "grid", "--prefix-lens", "512,1024,2048"],
    "new grid (whole context)": ["--design", "grid"],
}
VALIDATION = [
    "--design",
    "grid",
    "--base-chunk-size",
    "400",
    "--prefix-lens",
    "800,3000,9000,20000,30000",
    "--seed",
    "7",
    "--no-fit",
]
PROMPTS = (8192, 32768)
RANKED = ("fixed-best", "greedy", "optimal")


def run(args: list[str]) -> None:
    r = subprocess.run(PPPROF + args, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ppprof {' '.join(args)} failed:\n{r.stderr[-3000:]}")


def validation_errors(policy_path: Path, samples: pd.DataFrame) -> dict:
    """MAPE of the policy's model on the validation profile's prefixed rows, overall and per prefix band."""
    policy = load(policy_path)
    stage = policy.report.diagnostics.get("bottleneck_stage") or 0
    rows = samples[samples.prefix_len > 0]
    y = rows[stage_column(stage)].to_numpy()
    err = np.abs(policy.latency_model.chunk_latency_ms(rows.prefix_len.to_numpy(), rows.chunk_size.to_numpy()) - y) / y
    bands = {str(p): float(err[(rows.prefix_len == p).to_numpy()].mean()) for p in sorted(rows.prefix_len.unique())}
    return {
        "model": policy.latency_model.name,
        "status": policy.status,
        "mape_prefixed": float(err.mean()),
        "mape_per_band": bands,
    }


def bench_errors(doc: dict) -> dict:
    """Per prompt length: prediction error per strategy and the predicted vs measured ranking."""
    out = {}
    for prompt_len, entry in doc["prompt_lens"].items():
        s = entry["strategies"]
        measured = {k: s[k]["ttft_ms"]["median"] for k in RANKED if k in s}
        predicted = {k: s[k]["predicted_ttft_ms"] for k in RANKED if k in s}
        out[prompt_len] = {
            "prediction_error": {k: v["prediction_error"] for k, v in s.items()},
            "measured_ranking": sorted(measured, key=measured.get),
            "predicted_ranking": sorted(predicted, key=predicted.get),
        }
        out[prompt_len]["ranking_matches"] = out[prompt_len]["measured_ranking"] == out[prompt_len]["predicted_ranking"]
    return out


def main() -> None:
    ap = script_parser(__doc__, "results/bench_model_domain")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    validation = out / "validation"
    run(["profile", "--out", str(validation), *VALIDATION])
    samples = pd.read_csv(validation / "samples.csv")
    write_manifest(out)
    result = {
        "schema_version": 1,
        "what": __doc__.split("\n\n")[0],
        "validation": VALIDATION,
        "prompt_lens": list(PROMPTS),
        "repeats": args.repeats,
        "grids": {},
    }
    for name, flags in GRIDS.items():
        folder = out / ("grid-new" if len(flags) == 2 else "grid-old")
        run(["profile", "--out", str(folder / "profile"), *flags])
        run(
            [
                "bench",
                str(folder / "profile" / "policy.json"),
                "--out",
                str(folder / "bench"),
                "--repeats",
                str(args.repeats),
                "--strategies",
                "fixed,fixed-best,greedy,optimal",
                *[a for n in PROMPTS for a in ("--prompt-len", str(n))],
            ]
        )
        doc = json.loads((folder / "bench" / "bench.json").read_text())
        result["grids"][name] = {
            "flags": flags,
            "held_out": validation_errors(folder / "profile" / "policy.json", samples),
            "bench": bench_errors(doc),
        }
    atomic_write_json(out / "summary.json", result)
    for name, g in result["grids"].items():
        print(
            f"{name}: {g['held_out']['model']}, held-out MAPE on prefixed rows {g['held_out']['mape_prefixed']:.1%}"
            f" (per band: " + ", ".join(f"{k} {v:.1%}" for k, v in g["held_out"]["mape_per_band"].items()) + ")"
        )
        for n, b in g["bench"].items():
            errors = ", ".join(f"{k} {v:+.1%}" for k, v in b["prediction_error"].items() if v is not None)
            print(
                f"  prompt {n}: {errors}; ranking measured {b['measured_ranking']}, predicted "
                f"{b['predicted_ranking']} ({'matches' if b['ranking_matches'] else 'differs'})"
            )


if __name__ == "__main__":
    main()

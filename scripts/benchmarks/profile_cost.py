"""Benchmark (not a test): what a profile costs and what it buys, in one run on one machine.

Profiles, interleaved seed by seed (sweep, grid, adaptive, sweep, grid, adaptive, ...):
- sweep: the SGLang-equivalent profile, the 128-request prefix-free sweep only (`--design grid --prefix-lens ''`);
- grid: the fixed design (the default before 2026-12-05), the sweep and one 128-request probe per prefix length (`--design grid`);
- adaptive: `--design adaptive`;
and first a dense validation profile none of them saw (7 other prefix lengths across the context, another seed).
For each profile: probing wall time (run.json probe_wall_s: warm-up, probes and, for adaptive, its fits) as a
ratio to the median sweep profile's; held-out MAPE of its policy's latency model on the validation rows, prefixed
and prefix-free apart (the sweep's policy is static when its quadratic has a <= 0: its unconstrained quadratic,
SGLang's f on [1, l, l^2], is scored instead); and how many entries of its chunk-size table differ from the
validation profile's by more than one alignment unit (entries: stretches of prefix_len on which neither table
changes). For adaptive profiles also when (probing seconds, and as a ratio to the sweep) the table alone was stable.

    python scripts/benchmarks/profile_cost.py [--seeds 0,1,2] [-o results/bench_profile_cost]
    python scripts/benchmarks/profile_cost.py --small --seeds 0 --out /tmp/bench_profile_cost   # a quick check
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from ppprof.adaptive.uncertainty import table_differences
from ppprof.manifest import script_parser, write_result
from ppprof.policy import load
from ppprof.policy.rule import LatencyModel
from ppprof.runfiles import stage_column

PPPROF = [sys.executable, "-m", "ppprof", "profile"]
KINDS = {
    "sweep": ["--design", "grid", "--prefix-lens", ""],
    "grid": ["--design", "grid"],
    "adaptive": ["--design", "adaptive"],
}
VALIDATION_FRACTIONS = (0.025, 0.06, 0.14, 0.27, 0.49, 0.73, 0.97)
"""The validation profile's prefix lengths, as fractions of the deepest prefix the context allows."""
VALIDATION_SEED = 1000
SMALL = ["--base-chunk-size", "128", "--context-len", "4096"]


def profile(out: Path, args: list[str]) -> dict:
    """Run one profile; return its run.json."""
    start = time.perf_counter()
    r = subprocess.run(PPPROF + ["--out", str(out), *args], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"ppprof profile {' '.join(args)} failed:\n{r.stderr[-3000:]}")
    run = json.loads((out / "run.json").read_text())
    run["process_wall_s"] = time.perf_counter() - start
    return run


def validation_prefixes(common: list[str]) -> list[int]:
    from ppprof.run.resolve import resolve_config

    cfg = resolve_config(None, {k.lstrip("-").replace("-", "_"): int(v) for k, v in zip(common[::2], common[1::2])})
    top = cfg.probes.context_len - cfg.max_probe_chunk_size
    return sorted({max(1, int(f * top)) for f in VALIDATION_FRACTIONS})


def raw_quadratic(samples: pd.DataFrame, column: str) -> LatencyModel | None:
    """SGLang's least squares f(l) = a l^2 + b l + c on the prefix-free rows (the first dropped), a and b as they
    come: what the sweep profile's model predicts when its policy is static."""
    rows = samples[samples.prefix_len == 0].iloc[1:]
    if len(rows) < 3:
        return None
    l = rows.chunk_size.to_numpy(dtype=float)
    c, b, a = np.linalg.lstsq(np.column_stack([np.ones_like(l), l, l * l]), rows[column].to_numpy(), rcond=None)[0]
    # LatencyModel requires a known form; the quadratic's chunk latency c + f(L+x) - f(L) is the prefix form, g = 0.
    return LatencyModel("prefix", a=float(a), b=float(b), c=float(c))


def mape(model: LatencyModel, rows: pd.DataFrame, column: str) -> float:
    y = rows[column].to_numpy()
    return float(
        np.mean(np.abs(model.chunk_latency_ms(rows.prefix_len.to_numpy(), rows.chunk_size.to_numpy()) - y) / y)
    )


def judge(folder: Path, run: dict, validation: pd.DataFrame, dense_table: dict, sweep_wall_s: float) -> dict:
    policy = load(folder / "policy.json")
    stage = policy.report.diagnostics.get("bottleneck_stage") or 0
    column = stage_column(stage)
    model, scored = policy.latency_model, "policy"
    if model is None:
        model, scored = raw_quadratic(pd.read_csv(folder / "samples.csv"), column), "unconstrained quadratic"
    prefixed, free = validation[validation.prefix_len > 0], validation[validation.prefix_len == 0]
    diff, entries = table_differences(policy.data["table"], dense_table, policy.settings.alignment)
    design = run.get("design") or {}
    # When the adaptive design's table alone was stable (the TTFT criterion is what runs it longer).
    table_at = next(
        (h["seconds"] for h in design.get("history", []) if (h.get("table_within_one_unit") or 0) >= 0.95), None
    )
    return {
        "status": policy.status,
        "model": None if policy.latency_model is None else policy.latency_model.name,
        "scored": scored,
        "probe_wall_s": run["probe_wall_s"],
        "ratio_to_sweep": run["probe_wall_s"] / sweep_wall_s,
        "process_wall_s": round(run["process_wall_s"], 2),
        "requests": run["timed_requests"],
        "forward_tokens": run["forward_tokens"],
        "stopping_reason": design.get("stopping_reason"),
        "mape_prefixed": None if model is None else mape(model, prefixed, column),
        "mape_prefix_free": None if model is None else mape(model, free, column),
        "table_entries": entries,
        "table_entries_off_by_more_than_one_unit": diff,
        "table_within_one_unit": 1 - diff / entries,
        "table_stable_at_s": table_at,
        "table_stable_ratio_to_sweep": None if table_at is None else table_at / sweep_wall_s,
    }


def summarize(per_kind: dict[str, list[dict]]) -> dict:
    out = {}
    for kind, rows in per_kind.items():

        def med(key, rows=rows):
            values = [r[key] for r in rows if r[key] is not None]
            return float(np.median(values)) if values else None

        out[kind] = {
            key: med(key)
            for key in (
                "ratio_to_sweep",
                "probe_wall_s",
                "requests",
                "mape_prefixed",
                "mape_prefix_free",
                "table_within_one_unit",
                "table_stable_ratio_to_sweep",
            )
        }
    adaptive, sweep = out["adaptive"], out["sweep"]
    if adaptive["mape_prefixed"] and sweep["mape_prefixed"]:
        adaptive["accuracy_vs_sweep_quadratic"] = sweep["mape_prefixed"] / adaptive["mape_prefixed"]
    return out


def main() -> None:
    ap = script_parser(__doc__, "results/bench_profile_cost")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--small", action="store_true", help=f"a quick check: {' '.join(SMALL)}")
    args = ap.parse_args()
    out = Path(args.out)
    seeds = [int(s) for s in args.seeds.split(",")]
    common = SMALL if args.small else []
    prefixes = validation_prefixes(common)
    vflags = common + [
        "--design",
        "grid",
        "--prefix-lens",
        ",".join(map(str, prefixes)),
        "--seed",
        str(VALIDATION_SEED),
    ]
    vrun = profile(out / "validation", vflags)
    validation = pd.read_csv(out / "validation" / "samples.csv")
    dense_table = load(out / "validation" / "policy.json").data["table"]
    runs = {kind: [] for kind in KINDS}
    for seed in seeds:
        for kind, flags in KINDS.items():
            folder = out / f"{kind}-seed{seed}"
            runs[kind].append((folder, profile(folder, common + flags + ["--seed", str(seed)])))
    sweep_wall_s = float(np.median([run["probe_wall_s"] for _, run in runs["sweep"]]))
    per_kind = {
        kind: [
            judge(folder, run, validation, dense_table, sweep_wall_s) | {"seed": seed}
            for seed, (folder, run) in zip(seeds, items)
        ]
        for kind, items in runs.items()
    }
    result = {
        "schema_version": 1,
        "what": __doc__.split("\n\n")[0],
        "profile_flags": {kind: common + flags for kind, flags in KINDS.items()},
        "validation": {
            "flags": vflags,
            "rows": len(validation),
            "probe_wall_s": vrun["probe_wall_s"],
            "table": dense_table,
        },
        "seeds": seeds,
        "sweep_probe_wall_s_median": sweep_wall_s,
        "profiles": per_kind,
        "summary": summarize(per_kind),
    }
    write_result(out.with_suffix(".json") if out.name == "bench_profile_cost" else out / "summary.json", result)
    for kind, s in result["summary"].items():
        text = ", ".join(f"{k} {v:.3g}" for k, v in s.items() if v is not None)
        print(f"{kind}: {text}")


if __name__ == "__main__":
    main()

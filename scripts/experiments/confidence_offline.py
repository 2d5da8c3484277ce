"""The status and the plans of each committed profile's samples against copies of them with extra row noise, under the
status by the decision's confidence (this code) and under the per-row gates it replaces (the code of BEFORE), on the
same noisy copies (issue 35).

Each copy multiplies every row's latency by its own lognormal factor (sigma 0.1, 0.2, 0.3; seeds 0..SEEDS-1), then
is fitted as `ppprof fit` fits it (its run.json's settings). A copy agrees when its status is the clean samples';
its plans' error is the weighted mean TTFT of its plans of the clean policy's workload, priced on the clean policy's
planning model, against the clean policy's own plans (0: the same TTFT). The no-gain surfaces: each profile's layout
and its rows' own scatter about its clean fit, on a surface whose gain over the best fixed chunk is below the
threshold (the clean fit of a profile that gains less than it), with the same extra noise: each copy should be static.

Usage: python scripts/experiments/confidence_offline.py [-o OUT.json] [--quick] [--before REV]
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
BEFORE = "afbd823"
"""The code before issue 35's status: the per-row gates (RMS residual, CV MAPE) decide."""
SIGMAS = (0.1, 0.2, 0.3)
SEEDS = 3
NO_GAIN = (
    "results/bench-reference/tiny-dense/profile",
    "results/bench_model_domain/grid-new/profile",
    "results/profile-llama3-8b-2layers",
)
"""Profiles whose clean fit gains less than the threshold on their own settings: their fitted models are the
candidate no-gain surfaces; one counts on a layout only where its gain on the layout's settings (the rules chosen
on the surface itself) is below THRESHOLD too."""
THRESHOLD = 0.02
LAYOUTS = ("results/baseline", "results/bench-reference/tiny-dense/profile")
"""The profiles whose rows the no-gain surfaces are drawn on."""


def profiles(quick: bool) -> list[str]:
    """Every committed profile's folder (samples.csv with run.json beside it), relative to the repository."""
    if quick:
        return ["results/profile-llama3-8b-2layers"]
    found = sorted(p.parent for p in (REPO / "results").rglob("samples.csv") if (p.parent / "run.json").is_file())
    return [str(p.relative_to(REPO)) for p in found]


def fitter(folder: str):
    """(samples, fit(samples) -> policy dict) of a profile, as `ppprof fit` fits it, on the ppprof imported."""
    from ppprof.fit.build import fit_samples
    from ppprof.fit.samples import read_run, read_samples
    from ppprof.fit.settings import resolve_policy_options, resolve_settings

    path = REPO / folder / "samples.csv"
    samples, run = read_samples(path), read_run(path)
    settings = resolve_settings(run, path)
    options = resolve_policy_options(run, path, settings.context_len)
    try:  # the one fit over RunSamples (2026-12-05 on); --before may name code from before it
        from ppprof.fit.fitted import RunSamples
    except ImportError:
        return samples, lambda s: fit_samples(s, run, settings, "auto", None, options)
    idle = dataclasses.replace(options, load_rule=False)  # the status and rules only, as the older fit_samples gave
    return samples, lambda s: fit_samples(RunSamples(s, run), settings, idle)[0].data


def report(policy: dict) -> dict:
    """The report's fields of a policy document: its `report` object (schema 6 on), else the document itself (the
    flat layout the code of BEFORE writes, which has no ppprof.policy.runtime.report_of to read it with)."""
    return policy.get("report", policy)


def noisy(samples, sigma: float, seed: int):
    factor = np.exp(np.random.default_rng(seed).normal(0.0, sigma, len(samples)))
    return dataclasses.replace(samples, chunk_latency_ms=samples.chunk_latency_ms * factor)


def plans_error(policy: dict, clean: dict) -> float:
    """Weighted mean TTFT of `policy`'s plans of the clean policy's workload on the clean planning model, / the clean
    policy's own - 1."""
    from ppprof.policy.planners import chunk_latencies_ms, ttft_ms
    from ppprof.policy.runtime import Policy

    ref, cand = Policy.of(clean), Policy.of(policy)
    model, stages = ref.planning_model, clean["num_stages"]
    workload = report(clean)["workload"]
    lengths, weights = workload["prompt_lens"], workload["weights"]

    def mean(p) -> float:
        return sum(w * ttft_ms(chunk_latencies_ms(model, p.plan(int(n))), stages) for n, w in zip(lengths, weights))

    return mean(cand) / mean(ref) - 1.0


def outcome(policy: dict, clean: dict | None) -> dict:
    predicted = report(policy).get("predicted") or {}
    interval = predicted.get("gain_interval") or {}
    out = {"status": policy["status"], "gain": predicted.get("gain_vs_fixed_best"), "lower": interval.get("lower")}
    if clean is not None:
        out["agrees"] = policy["status"] == clean["status"]
        out["ttft_error"] = plans_error(policy, clean) if clean["latency_model"] else None
    return out


def surface_samples(layout: str, surface: str):
    """(samples, fit, gain): the rows of profile `layout` on the clean fit of profile `surface` (each row's latency
    the surface's times the row's own ratio to the layout's clean fit: its scatter), the layout's fit, and the gain
    of the rules chosen on the surface itself with the layout's settings."""
    from ppprof.fit.build import rechoose
    from ppprof.policy.rule import LatencyModel

    samples, fit = fitter(layout)
    clean = fit(samples)
    own = LatencyModel.from_dict(clean["latency_model"])
    ssamples, sfit = fitter(surface)
    model = LatencyModel.from_dict(sfit(ssamples)["latency_model"])
    L, x = samples.prefix_len, samples.chunk_size
    scatter = samples.chunk_latency_ms / own.chunk_latency_ms(L, x)
    gain = report(rechoose(clean, model))["predicted"]["gain_vs_fixed_best"]
    return dataclasses.replace(samples, chunk_latency_ms=model.chunk_latency_ms(L, x) * scatter), fit, gain


def evaluate(folders: list[str], seeds: int, layouts: list[str], surfaces: list[str]) -> dict:
    """Every profile's clean status and its noisy copies' outcomes, then the no-gain surfaces' (each of `surfaces` on
    the rows of each of `layouts`), on the ppprof imported."""
    out = {"profiles": {}, "no_gain": {}}
    for folder in folders:
        samples, fit = fitter(folder)
        started = time.perf_counter()
        clean = fit(samples)
        row = {"clean": outcome(clean, None) | {"fit_s": time.perf_counter() - started}}
        for sigma in SIGMAS:
            row[str(sigma)] = [outcome(fit(noisy(samples, sigma, seed)), clean) for seed in range(seeds)]
        out["profiles"][folder] = row
    for layout in layouts:
        for surface in surfaces:
            samples, fit, gain = surface_samples(layout, surface)
            row = {"surface_gain": gain, "no_gain": gain < THRESHOLD, "clean": outcome(fit(samples), None)}
            for sigma in SIGMAS:
                row[str(sigma)] = [outcome(fit(noisy(samples, sigma, seed)), None) for seed in range(seeds)]
            out["no_gain"][f"{surface} on {layout}"] = row
    return out


def before(rev: str, spec: dict) -> dict:
    """evaluate() on the code of `rev` (its ppprof/ extracted to a temporary folder, run in a child process)."""
    archive = subprocess.run(["git", "archive", rev, "ppprof"], cwd=REPO, capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        tarfile.open(fileobj=io.BytesIO(archive)).extractall(tmp, filter="data")
        env = dict(os.environ, PYTHONPATH=tmp)
        child = [sys.executable, __file__, "--worker", json.dumps(spec)]
        return json.loads(subprocess.run(child, env=env, capture_output=True, check=True, text=True).stdout)


def summary(result: dict) -> dict:
    """Per sigma: copies agreeing with the clean status, and the plans' TTFT error (mean |.| and worst) of the
    profiles; the static copies of the surfaces that gain less than THRESHOLD on their layout."""
    out = {}
    for sigma in map(str, SIGMAS):
        copies = [c for row in result["profiles"].values() for c in row[sigma]]
        errors = [abs(c["ttft_error"]) for c in copies if c.get("ttft_error") is not None]
        static = [c["status"] == "static" for row in result["no_gain"].values() if row["no_gain"] for c in row[sigma]]
        dynamic = [c for row in result["profiles"].values() if row["clean"]["status"] == "dynamic" for c in row[sigma]]
        out[sigma] = {
            "agree": f"{sum(c['agrees'] for c in copies)}/{len(copies)}",
            "agree_of_dynamic_profiles": f"{sum(c['agrees'] for c in dynamic)}/{len(dynamic)}",
            "plans_within_1pct": f"{sum(e <= 0.01 for e in errors)}/{len(errors)}",
            "ttft_error_mean": float(np.mean(errors)) if errors else None,
            "ttft_error_max": float(np.max(errors)) if errors else None,
            "no_gain_static": f"{sum(static)}/{len(static)}",
        }
    return out


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        print(json.dumps(evaluate(**json.loads(sys.argv[2]))))
        return
    from ppprof.manifest import script_parser, write_result

    parser = script_parser(__doc__, None, "one small profile, one seed")
    parser.add_argument("--before", default=BEFORE, help=f"the code compared with (default {BEFORE})")
    args = parser.parse_args()
    folders = profiles(args.quick)
    spec = {
        "folders": folders,
        "seeds": 1 if args.quick else SEEDS,
        "layouts": folders if args.quick else list(LAYOUTS),
        "surfaces": list(NO_GAIN[:1] if args.quick else NO_GAIN),
    }
    started = time.perf_counter()
    after = evaluate(**spec)
    old = before(args.before, spec)
    result = {
        "sigmas": list(SIGMAS),
        "seeds": spec["seeds"],
        "no_gain_surfaces": spec["surfaces"],
        "no_gain_layouts": spec["layouts"],
        "before_code": args.before,
        "summary": {"before": summary(old), "after": summary(after)},
        "before": old,
        "after": after,
        "wall_s": time.perf_counter() - started,
    }
    print(json.dumps(result["summary"], indent=2))
    if args.out:
        write_result(args.out, result)


if __name__ == "__main__":
    main()

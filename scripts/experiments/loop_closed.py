"""The loop closed on CPU, through the real pipeline (issue 44): a policy wrong about the server the way ATOM's dummy
profile was (fitted on the profile's prefix-free rows alone: no prefix term), served with --forward-trace, refitted
with `ppprof calibrate`, then served again beside the policy profiled on the right model, interleaved.

Steps, every one through the CLI (ranks: gloo, one per stage):
1. right/: the profile's run folder as it is (its policy profiled on the served model); wrong/: the same run.json
   and the profile's prefix-free rows only, fitted (`ppprof fit --min-gain`, as the committed policy was).
2. `serve-bench wrong/policy.json --forward-trace wrong/trace-0.jsonl` (N prompts, concurrency 1, arm policy), then
   `calibrate wrong/policy.json wrong/trace-0.jsonl -o wrong/calibrated-1.json`; then the loop turns once more:
   calibrated-1 served with its trace, and `calibrate wrong/policy.json wrong/trace-0.jsonl wrong/trace-1.jsonl -o
   wrong/calibrated-2.json` (a fixed-chunk policy's forwards hold one chunk size at every prefix; the next
   policy's chunks add others).
3. REPEATS rounds, the order of the policies rotated each round: serve-bench of each with other prompts (seed
   100 + round: held out from the calibration), its own forward trace; throughput and mean TTFT of the arm policy.
4. Prediction: each policy's median and worst |predicted / live - 1| over the held-out forwards of the rounds
   (ppprof.fit.live_forwards.predicted_ms: the model at the pipelined level, no per-chunk overhead).
5. Drift: `compare right/policy.json TRACE` and `compare wrong/policy.json TRACE` on a held-out trace of the right
   policy's round: exit codes and where.

    python scripts/experiments/loop_closed.py [--run tests/runs/tiny-hybrid] [--num-prompts 12] [--repeats 3]
        [--prompt-lens 1000,2000,3000] -o results/loop-closed/result.json
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from ppprof.fit.live_forwards import live_forwards, predicted_ms
from ppprof.forwards import read_forwards
from ppprof.manifest import script_parser, write_result

POLICIES = ("wrong", "calibrated-1", "calibrated-2", "right")


def ppprof(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-m", "ppprof", *map(str, args)], capture_output=True, text=True)
    if check and done.returncode != 0:
        sys.exit(f"ppprof {' '.join(map(str, args))} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return done


def serve(policy: Path, out: Path, trace: Path, prompts: int, lens: str, seed: int) -> dict:
    """One serve-bench of `policy`'s arm policy at concurrency 1; its throughput and mean TTFT."""
    ppprof(
        "serve-bench", policy, "--concurrency", "1", "--num-prompts", prompts, "--prompt-lens", lens,
        "--strategies", "policy", "--repeats", "1", "--seed", seed, "--out", out, "--forward-trace", trace,
    )  # fmt: skip
    cell = json.loads(out.read_text())["levels"]["concurrency-1"]["policy"]
    return {
        "throughput_tokens_per_s": cell["throughput_tokens_per_s"],
        "ttft_mean_ms": cell["ttft_ms"]["mean"],
        "chunks_per_request": cell["chunks_per_request"],
    }


def prepare(run: Path, folder: Path) -> dict[str, Path]:
    """Step 1: right/ and wrong/ beside each other under `folder`."""
    right, wrong = folder / "right", folder / "wrong"
    for d in (right, wrong):
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(run / "run.json", d / "run.json")
    for name in ("samples.csv", "policy.json"):
        shutil.copy(run / name, right / name)
    samples = pd.read_csv(run / "samples.csv")
    samples[samples.prefix_len == 0].to_csv(wrong / "samples.csv", index=False)
    ppprof("fit", wrong / "samples.csv", "--min-gain", "0.01")
    return {name: wrong / f"{name}.json" for name in POLICIES[1:3]} | {
        "wrong": wrong / "policy.json",
        "right": right / "policy.json",
    }


def prediction_errors(policy: Path, traces: list[Path]) -> dict:
    """Step 4: |predicted / live - 1| of `policy` over the forwards of `traces`."""
    data = json.loads(policy.read_text())
    if data.get("latency_model") is None:
        return {"forwards": 0, "median": None, "worst": None}
    errors = []
    for trace in traces:
        live = live_forwards(read_forwards([trace]), int(data["settings"]["context_len"]))
        errors += list(np.abs(predicted_ms(data, live) / live.latency_ms - 1.0))
    return {"forwards": len(errors), "median": float(np.median(errors)), "worst": float(np.max(errors))}


def main() -> None:
    parser = script_parser(__doc__, "results/loop-closed/result.json")
    parser.add_argument("--run", default="tests/runs/tiny-hybrid", help="the profile's run folder (the right one)")
    parser.add_argument("--num-prompts", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prompt-lens", default="1000,2000,3000")
    args = parser.parse_args()
    folder = Path(args.out).parent
    policies = prepare(Path(args.run), folder)
    served, calibration, first = [], {}, {}
    for k, name in enumerate(("wrong", "calibrated-1")):
        served.append(folder / "wrong" / f"trace-{k}.jsonl")
        out = folder / "wrong" / f"serving-{k}.json"
        first[name] = serve(policies[name], out, served[-1], args.num_prompts, args.prompt_lens, k)
        target = policies[f"calibrated-{k + 1}"]
        calibration[target.stem] = ppprof("calibrate", policies["wrong"], *served, "-o", target).stdout.splitlines()
    rounds, traces = {name: [] for name in POLICIES}, {name: [] for name in POLICIES}
    for r in range(args.repeats):
        for name in POLICIES[r % len(POLICIES) :] + POLICIES[: r % len(POLICIES)]:
            out = folder / "rounds" / f"{name}-{r}" / "serving.json"
            t = out.with_name("trace.jsonl")
            rounds[name].append(serve(policies[name], out, t, args.num_prompts, args.prompt_lens, 100 + r))
            traces[name].append(t)
    held_out = [t for ts in traces.values() for t in ts]
    medians = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in rounds.items()}
    right = medians["right"]
    drift = {}
    for name in POLICIES:
        done = ppprof("compare", policies[name], traces["right"][0], "--json", check=False)
        report = json.loads(done.stdout) if done.returncode in (0, 1) else {"error": done.stderr.strip()}
        drift[name] = {"exit": done.returncode, "level": report.get("level"), "where": report.get("where")}
    calibrated = {name: json.loads(policies[name].read_text()) for name in POLICIES[1:3]}
    result = {
        "num_prompts": args.num_prompts,
        "prompt_lens": args.prompt_lens,
        "repeats": args.repeats,
        "calibration_forwards": {n: c["provenance"]["live"]["forwards_used"] for n, c in calibrated.items()},
        "calibration_status": {n: [c["status"], c["reason"]] for n, c in calibrated.items()},
        "profile_requests": int(len(pd.read_csv(Path(args.run) / "samples.csv"))),
        "calibration_serves": first,
        "medians": medians,
        "vs_right": {
            name: {k: m[k] / right[k] - 1.0 for k in ("throughput_tokens_per_s", "ttft_mean_ms")}
            for name, m in medians.items()
        },
        "rounds": rounds,
        "prediction_on_held_out": {name: prediction_errors(policies[name], held_out) for name in POLICIES},
        "drift": drift,
        "calibrate_output": calibration,
    }
    write_result(args.out, result)
    print(json.dumps({k: result[k] for k in ("medians", "vs_right", "prediction_on_held_out", "drift")}, indent=2))


if __name__ == "__main__":
    main()

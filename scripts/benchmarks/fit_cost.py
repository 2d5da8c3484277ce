"""Benchmark `ppprof fit` (samples to policy.json, every rule chosen and checked) on this checkout against another
git revision, interleaved: each fit in a fresh Python whose imports are done before the clock starts, the CPU time
(process_time) and the wall time of the fit alone, medians with their range; writes results/bench_fit_cost.json.

Cases: the committed default profile (results/baseline/samples.csv with its run.json) and a GPU-sized prefix model
(B 8192, context 131072, 4 stages: the prompt-aware rule's DP over 2048 positions).

Usage: python scripts/benchmarks/fit_cost.py [--against REV] [--repeats N] [-o OUT.json] [--quick]
  (--against: a revision checked out into a temporary worktree, e.g. the one before a change; default: none)
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ppprof.manifest import script_parser, write_result

REPO = Path(__file__).resolve().parents[2]
CASES = ("default-profile", "gpu-sized")
ONE_FIT = r"""
import json, shutil, sys, tempfile, time
from pathlib import Path
import ppprof
assert Path(ppprof.__file__).resolve().parents[1] == Path.cwd().resolve(), ppprof.__file__  # the tree measured
from ppprof.fit import fit
from ppprof.fit.synthetic import SyntheticProbes, SyntheticRun, make_samples, write_run_dir
from ppprof.policy import LatencyModel
import sklearn, jsonschema  # imported before the clock, as in a profile's process
case, repo = sys.argv[1], Path(sys.argv[2])
tmp = Path(tempfile.mkdtemp())
if case == "default-profile":
    for name in ("samples.csv", "run.json", "packed.csv"):
        if (repo / "results/baseline" / name).is_file():
            shutil.copy(repo / "results/baseline" / name, tmp / name)
    samples, options = tmp / "samples.csv", {}
else:
    model = LatencyModel("prefix", a=2e-6, b=0.05, c=3.0, g=1e-4)
    probes = SyntheticProbes(base_chunk_size=8192, prefixes=[0, 16384, 65536], chunk_sizes=[2048, 8192], noise=0.0)
    frame = make_samples(model, probes)
    samples = write_run_dir(tmp, frame, SyntheticRun(base_chunk_size=8192, context_len=131072))
    options = {"policy_options": {"min_gain": 0.0, "pp_size": 4}}
cpu, wall = time.process_time(), time.perf_counter()
path, data = fit(samples, **options)
print(json.dumps({"cpu_s": time.process_time() - cpu, "wall_s": time.perf_counter() - wall, "status": data["status"]}))
shutil.rmtree(tmp)
"""


def one_fit(tree: Path, case: str) -> dict:
    """One fit of `case` with the ppprof of `tree`, in a fresh Python."""
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(  # run in `tree`: `python -c` puts the working folder first on sys.path
        [sys.executable, "-c", ONE_FIT, case, str(REPO)], capture_output=True, text=True, env=env, timeout=600, cwd=tree
    )
    if done.returncode:
        raise SystemExit(f"fit_cost: the fit of {case} with {tree} failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def figures(runs: list[dict]) -> dict:
    out = {}
    for key in ("cpu_s", "wall_s"):
        values = [r[key] for r in runs]
        out[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
    out["status"] = sorted({r["status"] for r in runs})
    return out


def main() -> int:
    parser = script_parser(__doc__, "results/bench_fit_cost.json", quick="the default profile once, no other revision")
    parser.add_argument("--against", default=None, help="a git revision to compare with (a temporary worktree)")
    parser.add_argument("--repeats", type=int, default=5, help="fits of each case and revision, interleaved")
    args = parser.parse_args()
    cases, repeats = (CASES[:1], 1) if args.quick else (CASES, args.repeats)
    trees = {"this checkout": REPO}
    with tempfile.TemporaryDirectory() as tmp:
        if args.against and not args.quick:
            other = Path(tmp) / "against"
            subprocess.run(["git", "worktree", "add", "-q", "--detach", str(other), args.against], cwd=REPO, check=True)
            trees[args.against] = other
        try:
            runs = {(name, case): [] for name in trees for case in cases}
            for _ in range(repeats):  # interleaved: every revision and case once a round
                for case in cases:
                    for name, tree in trees.items():
                        runs[name, case].append(one_fit(tree, case))
        finally:
            if len(trees) > 1:
                subprocess.run(["git", "worktree", "remove", "--force", str(trees[args.against])], cwd=REPO)
    result = {
        "what": "ppprof fit's CPU and wall time (the fit alone, imports done) per case and revision, interleaved "
        "rounds, each fit in a fresh Python with 1 thread",
        "repeats": repeats,
        "cases": {case: {name: figures(runs[name, case]) for name in trees} for case in cases},
    }
    write_result(args.out, result)
    for case in cases:
        for name in trees:
            f = result["cases"][case][name]["cpu_s"]
            print(f"{case:16} {name:14} cpu {f['median']:.2f} s (range {f['min']:.2f}-{f['max']:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

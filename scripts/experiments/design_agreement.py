"""Experiment (issue 35, item 2): the adaptive design against the grid design on one host, interleaved. Each round runs
the README's first command once with each design (`ppprof profile --design grid|adaptive`, the order alternating from
round to round); the --loaded rounds run beside one Python busy loop (1 of 2 cores). Each run's samples.csv, run.json
and policy.json are kept (plots and logs dropped), with its process wall time.

Then, from the folders: each run's probing time (run.json probe_wall_s: warm-up, probes and the adaptive design's
fits), requests, design steps, status, model, gain and its interval; the grid's decision (the most common status of
the grid runs); for each adaptive run, whether its status is the grid's decision and, priced on each grid run's
planning model, the mean TTFT of its plans of that grid run's workload over the grid policy's own (the grid runs among
themselves, the same way, for the noise between two runs of one design); and the adaptive design's probing time over
the grid's median.

With --bench, each profile is followed by `ppprof bench POLICY --prompt-len 8192 --repeats 3` on the same pipeline
(only bench.json kept): each run's median and worst prediction error over the bench's arms (|predicted / measured - 1|),
the figure issue 49 judges the designs by; and the same at the arms' median level (the shape alone).

Usage:
    python scripts/experiments/design_agreement.py OUT [--rounds 5] [--loaded 2]   # profiles, ~2 min a round
    python scripts/experiments/design_agreement.py OUT --rounds 4 --loaded 2 --bench  # and a bench each, ~4 min a round
    python scripts/experiments/design_agreement.py OUT --flags '--pp-size 1'       # another setup
    python scripts/experiments/design_agreement.py OUT --summary-only              # re-read OUT's runs
The summary goes to OUT/summary.json (-o to put it elsewhere).
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ppprof.manifest import script_parser, write_result
from ppprof.policy.choice import mean_ttft
from ppprof.policy.planners import fixed_chunks
from ppprof.policy.rule import LatencyModel
from ppprof.policy.runtime import report_of, upgraded
from ppprof.policy.tables import PromptRule

DESIGNS = ("grid", "adaptive")
KEEP = ("samples.csv", "run.json", "policy.json")


@contextmanager
def busy_loop(on: bool):
    """One Python busy loop beside the profiles while `on`."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if on else None
    try:
        yield
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


def profile(out: Path, design: str, flags: list[str]) -> None:
    """One default profile (with `flags`) with `design` into `out`, only KEEP kept, its process wall time in
    out/wall_s."""
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    cmd = [sys.executable, "-m", "ppprof", "profile", *flags, "--design", design, "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    wall = time.perf_counter() - start
    for f in out.iterdir():
        if f.name not in KEEP:
            shutil.rmtree(f) if f.is_dir() else f.unlink()
    (out / "wall_s").write_text(f"{wall:.2f}\n")


def bench(out: Path) -> None:
    """`ppprof bench` of out/policy.json at one 8192-token prompt, 3 repeats; only bench.json kept in out/bench."""
    where = out / "bench"
    cmd = [sys.executable, "-m", "ppprof", "bench", str(out / "policy.json"), "--prompt-len", "8192"]
    r = subprocess.run([*cmd, "--repeats", "3", "--out", str(where)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{r.stderr[-3000:]}")
    for f in where.iterdir():
        if f.name != "bench.json":
            shutil.rmtree(f) if f.is_dir() else f.unlink()


BENCH_FIGURES = (
    "bench_error_median",
    "bench_error_worst",
    "bench_level",
    "bench_shape_error_median",
    "bench_shape_error_worst",
)


def bench_errors(folder: Path) -> dict:
    """Median and worst |prediction error| over the bench's arms at its one prompt length; the level (the arms' median
    predicted / measured: how far the host moved between the profile and the bench, or the model's level is off), and
    the errors at that level (each arm's ratio over the median: the shape alone, what decides which chunks win). None
    without a bench."""
    path = folder / "bench" / "bench.json"
    if not path.is_file():
        return dict.fromkeys(BENCH_FIGURES)
    lengths = json.loads(path.read_text())["prompt_lens"]
    ratios = np.array([1 + s["prediction_error"] for one in lengths.values() for s in one["strategies"].values()])
    errors, shape = np.abs(ratios - 1), np.abs(ratios / np.median(ratios) - 1)
    return {
        "bench_error_median": float(np.median(errors)),
        "bench_error_worst": float(errors.max()),
        "bench_level": float(np.median(ratios)),
        "bench_shape_error_median": float(np.median(shape)),
        "bench_shape_error_worst": float(shape.max()),
    }


def run_rounds(folder: Path, rounds: int, loaded: int, flags: list[str], with_bench: bool) -> None:
    for i in range(rounds + loaded):
        kind = "quiet" if i < rounds else "loaded"
        order = DESIGNS if i % 2 == 0 else DESIGNS[::-1]
        with busy_loop(kind == "loaded"):
            for design in order:
                name = f"{kind}-{i + 1}-{design}"
                profile(folder / name, design, flags)
                if with_bench:
                    bench(folder / name)
                print(f"{name}: {row(folder / name)['status']}", file=sys.stderr)


def row(folder: Path) -> dict:
    """One run's figures."""
    run = json.loads((folder / "run.json").read_text())
    policy = json.loads((folder / "policy.json").read_text())
    predicted, design = report_of(policy).get("predicted") or {}, run.get("design") or {}
    interval = predicted.get("gain_interval") or {}
    return {
        "run": folder.name,
        "design": design.get("design"),
        "loaded": folder.name.startswith("loaded"),
        "probe_wall_s": run.get("probe_wall_s"),
        "process_wall_s": float((folder / "wall_s").read_text()) if (folder / "wall_s").is_file() else None,
        "requests": design.get("requests"),
        "steps": design.get("steps"),
        "stopping_reason": design.get("stopping_reason"),
        "status": policy["status"],
        "model": (policy.get("latency_model") or {}).get("name"),
        "gain": predicted.get("gain_vs_fixed_best"),
        "gain_lower": interval.get("lower"),
        "gain_upper": interval.get("upper"),
        **bench_errors(folder),
    }


def plans_of(policy: dict, lengths) -> list[list[int]]:
    """The chunks `policy` (schema 6's layout: upgraded) runs for each prompt length: its prompt-aware rule (a static
    one's fixed chunk)."""
    if policy["status"] == "static":
        best = (policy["report"].get("predicted") or {}).get("fixed_best_chunk")
        size = int(best or policy["table"]["chunk_size"][0])
        return [fixed_chunks(size, int(n)) for n in lengths]
    rule = PromptRule.from_dict(policy["prompt_table"])
    return [rule.plan(int(n)) for n in lengths]


def ttft_ratio(policy: dict, reference: dict) -> float | None:
    """Mean TTFT of `policy`'s plans of `reference`'s workload over `reference`'s own, on `reference`'s planning
    model (None where it has none)."""
    if reference.get("latency_model") is None:
        return None
    model = LatencyModel.from_dict(reference["latency_model"]).planning(
        reference["calibration"], reference["overhead"]["ms_per_chunk"]
    )
    workload = reference["report"]["workload"]
    lengths, weights = workload["prompt_lens"], workload["weights"]
    stages = reference["num_stages"]
    own = mean_ttft(model, plans_of(reference, lengths), weights, stages)
    return mean_ttft(model, plans_of(policy, lengths), weights, stages) / own


def spread(values: list[float]) -> list[float] | None:
    """[min, median, max]."""
    return [float(min(values)), float(np.median(values)), float(max(values))] if values else None


def summary(folder: Path) -> dict:
    runs = sorted(p for p in folder.iterdir() if p.is_dir() and (p / "policy.json").is_file())
    rows = [row(p) for p in runs]
    policies = {p.name: upgraded(json.loads((p / "policy.json").read_text())) for p in runs}  # any version's
    grid = [r for r in rows if r["design"] == "grid"]
    adaptive = [r for r in rows if r["design"] == "adaptive"]
    decision = Counter(r["status"] for r in grid).most_common(1)[0][0] if grid else None
    grid_s = float(np.median([r["probe_wall_s"] for r in grid])) if grid else None
    for r in rows:
        others = [g for g in grid if g["run"] != r["run"]]
        ratios = [ttft_ratio(policies[r["run"]], policies[g["run"]]) for g in others]
        r["ttft_on_grid_models"] = spread([v for v in ratios if v is not None])
        r["probe_time_over_grid_median"] = r["probe_wall_s"] / grid_s if grid_s else None

    def group(members: list[dict]) -> dict:
        worst = [r["ttft_on_grid_models"][2] for r in members if r["ttft_on_grid_models"]]
        return {
            "runs": len(members),
            "give_the_grid_decision": sum(r["status"] == decision for r in members),
            "probe_wall_s": spread([r["probe_wall_s"] for r in members]),
            "probe_time_over_grid_median": spread([r["probe_time_over_grid_median"] for r in members]),
            "requests": spread([r["requests"] for r in members]),
            "gain": spread([r["gain"] for r in members if r["gain"] is not None]),
            "worst_ttft_on_grid_models": spread(worst),
            "plans_within_1pct_of_every_grid_run": sum(v <= 1.01 for v in worst),
            **{k: spread([r[k] for r in members if r[k] is not None]) for k in BENCH_FIGURES},
        }

    return {
        "what": (
            "The adaptive design against the grid design, interleaved on one host: probing time, status and, priced "
            "on each grid run's planning model, the mean TTFT of each run's plans over that grid policy's own"
        ),
        "grid_decision": decision,
        "grid_probe_wall_s_median": grid_s,
        "grid": group(grid),
        "grid_quiet": group([r for r in grid if not r["loaded"]]),
        "adaptive": group(adaptive),
        "adaptive_quiet": group([r for r in adaptive if not r["loaded"]]),
        "adaptive_loaded": group([r for r in adaptive if r["loaded"]]),
        "runs": rows,
    }


def main() -> None:
    parser = script_parser(__doc__, None)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--rounds", type=int, default=5, help="quiet rounds (a grid and an adaptive profile each)")
    parser.add_argument("--loaded", type=int, default=2, help="rounds beside one Python busy loop")
    parser.add_argument("--summary-only", action="store_true", help="re-read the runs FOLDER holds; profile none")
    parser.add_argument("--bench", action="store_true", help="a `ppprof bench` after each profile (its errors)")
    parser.add_argument("--flags", default="", help="more `ppprof profile` flags, e.g. '--pp-size 1'")
    args = parser.parse_args()
    if not args.summary_only:
        args.folder.mkdir(parents=True, exist_ok=True)
        run_rounds(args.folder, args.rounds, args.loaded, shlex.split(args.flags), args.bench)
    result = summary(args.folder)
    command = "python scripts/experiments/design_agreement.py " + " ".join(sys.argv[1:])
    out = write_result(args.out or args.folder / "summary.json", result, command)
    print(json.dumps({k: result[k] for k in ("grid_decision", "grid", "adaptive")}, indent=1))
    print(f"wrote {out}", file=sys.stderr)


if __name__ == "__main__":
    main()

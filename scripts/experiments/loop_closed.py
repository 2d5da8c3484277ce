"""The loop closed on CPU, through the real pipeline (issue 44): policies wrong about the served model, served with
--forward-trace, refitted with `ppprof calibrate` on the served model's forwards, then served again beside the policy
profiled on the served model, interleaved.

Steps, every one through the CLI (ranks: gloo, one per stage; the served model is tiny-hybrid, 2 stages):
1. right/: a profile of the served model (the grid of tests/runs/README.md, 132 timed requests), refitted with
   --min-gain 0.01 as the committed one was. wrong/: the prefix-free rows alone of the committed profile of the
   served model (tests/runs/tiny-hybrid), fitted the same way (no prefix term, as ATOM's dummy profile; a fresh
   profile's prefix-free rows can curve down, a < 0, and then give no latency model at all). other/: the policy of
   the same profile of another preset (OTHER_PRESET, written beside the results as tiny-hybrid-attn.yaml: the
   shapes a server checks are tiny-hybrid's, its layers and MLPs are not), with the served model's run.json beside
   it, so that it serves tiny-hybrid.
2. `serve-bench POLICY --forward-trace` of wrong and other on N prompts (concurrency 1, seed 0), then `calibrate
   POLICY TRACE -o calibrated.json` of each; the wrong policy's loop turns once more (calibrated.json served, seed 1,
   and `calibrate wrong/policy.json` on both traces: wrong-calibrated-2), since a fixed-chunk policy's forwards hold
   one chunk size and the next policy's add others.
3. Every policy served in one `serve-bench` of REPEATS cells (concurrency 1, other prompts: seed 100, held out from
   the calibration; PPPROF_POLICY_CHECK_S=0), the policy file replaced by the next policy of the rotation as each
   cell ends, once the ranks took the one before (ppprof.policy.reload): the right policy between every two others,
   so that each cell of another policy has the right policy's cells a second or two away and a busy host's load
   (which moves over tens of seconds) moves under both alike. right-again, the right policy under another sha256,
   measures the comparison's own noise (an A/A arm). Each cell's policy is the sha256 its batches ran under
   (serving.csv); at concurrency 1 a cell's mean TTFT is its makespan over its requests (each arrives as the one
   before leaves the last stage) and its throughput its tokens over the makespan. Each policy's cells against the
   right policy's nearest cells in time: the median ratio, its 80% interval and its range.
4. Prediction: each policy's median and worst |predicted / live - 1| over the held-out forwards of the rotation
   (ppprof.fit.live_forwards.predicted_ms: the model at the pipelined level, no per-chunk overhead), and the same at
   its level (predictions times the median of live / predicted: the shape alone).
5. Drift: `compare POLICY TRACE` of every policy on the rotation's trace, at the default tolerances and with
   --tolerance pace=none (the shape alone); and a serve of the other policy on its own model (trace B), so that the
   right and the other policy are each judged on their own model's trace and on the other's.

    python scripts/experiments/loop_closed.py [--num-prompts 12] [--repeats 98] [--prompt-lens 1000,2000,3000]
        -o results/loop-closed/result.json
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd

from ppprof.fit.live_forwards import live_forwards, predicted_ms
from ppprof.forwards import read_forwards
from ppprof.manifest import script_parser, write_manifest, write_result
from ppprof.policy.runtime import report_of, upgraded

HERE = Path(__file__).resolve().parent
OTHER_PRESET = """\
# tiny-hybrid-attn: the other preset of scripts/experiments/loop_closed.py. Every field a server checks a policy
# against (ppprof.sglang.match: the family, hidden size, layers, heads, KV heads, head dim) is tiny-hybrid's, so a
# policy profiled on it is taken by a tiny-hybrid server; but its layers are attention where tiny-hybrid's are Mamba2,
# and its MLPs twice as wide: a prefix term about twice tiny-hybrid's and another level.
name: tiny-hybrid-attn
family: nemotron_h
pattern: "*-*E*-*-"
hidden_size: 64
vocab_size: 512
intermediate_size: 256
rms_norm_eps: 1.0e-5
num_attention_heads: 4
num_key_value_heads: 2
head_dim: 16
rope_theta: 10000.0
mamba_num_heads: 8
mamba_head_dim: 16
ssm_state_size: 16
conv_kernel: 4
mamba_n_groups: 2
mamba_chunk_size: 64
num_experts: 4
num_experts_per_tok: 2
moe_intermediate_size: 64
"""
"""The other preset's spec, written beside the results as tiny-hybrid-attn.yaml and profiled from there."""
COMMITTED = HERE.parents[1] / "tests" / "runs" / "tiny-hybrid"
POLICIES = ("wrong", "wrong-calibrated", "wrong-calibrated-2", "other", "other-calibrated", "right", "right-again")
"""right-again: the right policy with a note added to its provenance (a file of another sha256, the same rules): its
cells against the right policy's are the measurement's own noise (an A/A comparison)."""
PROFILE = (
    "--design", "grid", "--base-chunk-size", "256", "--requests-per-probe", "32", "--prefix-lens", "256,512,1024",
    "--warmup", "1", "--context-len", "4096",
)  # fmt: skip
"""The profile of tests/runs/README.md (tests/runs/tiny-hybrid)."""


def ppprof(*args, check: bool = True) -> subprocess.CompletedProcess:
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


def profile(model: str | Path, out: Path) -> Path:
    """A profile of `model` into `out`, its samples refitted with --min-gain 0.01; its policy."""
    if out.exists():
        shutil.rmtree(out)
    ppprof("profile", "--model", model, "--out", out, *PROFILE)
    ppprof("fit", out / "samples.csv", "--min-gain", "0.01")
    for junk in ("chunks.png", "fit.png", "rank0.log", "rank1.log", "packed.csv"):
        (out / junk).unlink(missing_ok=True)
    return out / "policy.json"


def prepare(folder: Path) -> dict[str, Path]:
    """Step 1: right/, wrong/, other/ (and other-profile/, the other preset's own run folder) under `folder`."""
    right = profile("tiny-hybrid", folder / "right")
    spec = folder / "tiny-hybrid-attn.yaml"
    spec.write_text(OTHER_PRESET)
    profile(spec, folder / "other-profile")
    wrong, other = folder / "wrong", folder / "other"
    for d in (wrong, other):
        if d.exists():
            shutil.rmtree(d)
        d.mkdir(parents=True)
        shutil.copy(folder / "right" / "run.json", d / "run.json")  # both serve the served model
    for name in ("policy.json", "samples.csv"):
        shutil.copy(folder / "other-profile" / name, other / name)
    samples = pd.read_csv(COMMITTED / "samples.csv")
    samples[samples.prefix_len == 0].to_csv(wrong / "samples.csv", index=False)
    ppprof("fit", wrong / "samples.csv", "--min-gain", "0.01")
    again = json.loads(right.read_text())
    again["report"]["provenance"]["note"] = "the right policy again, under another sha256: the A/A arm of the rotation"
    (folder / "right" / "policy-again.json").write_text(json.dumps(again, indent=2) + "\n")
    return {
        "right": right,
        "right-again": folder / "right" / "policy-again.json",
        "wrong": wrong / "policy.json",
        "wrong-calibrated": wrong / "calibrated.json",
        "wrong-calibrated-2": wrong / "calibrated-2.json",
        "other": other / "policy.json",
        "other-calibrated": other / "calibrated.json",
    }


def prediction_errors(policy: Path, traces: list[Path]) -> dict:
    """Step 4: |predicted / live - 1| of `policy` over the forwards of `traces`, as predicted and at its level."""
    data = upgraded(json.loads(policy.read_text()))  # any version's, in schema 6's layout as predicted_ms reads it
    if data.get("latency_model") is None:
        return {"forwards": 0}
    live_ms, pred = [], []
    for trace in traces:
        live = live_forwards(read_forwards([trace]), int(data["settings"]["context_len"]))
        live_ms += list(live.latency_ms)
        pred += list(predicted_ms(data, live))
    live_ms, pred = np.array(live_ms), np.array(pred)
    level = float(np.median(live_ms / pred))
    err, at_level = np.abs(pred / live_ms - 1.0), np.abs(pred * level / live_ms - 1.0)
    return {
        "forwards": len(err),
        "median": float(np.median(err)),
        "worst": float(np.max(err)),
        "level": level,
        "median_at_level": float(np.median(at_level)),
        "p90_at_level": float(np.quantile(at_level, 0.9)),
        "worst_at_level": float(np.max(at_level)),
    }


def drift(policy: Path, trace: Path) -> dict:
    """Step 5: `compare POLICY TRACE` at the default tolerances and with the level left out."""
    out = {}
    for name, extra in (("default", ()), ("shape", ("--tolerance", "pace=none"))):
        done = ppprof("compare", policy, trace, "--json", *extra, check=False)
        report = json.loads(done.stdout) if done.returncode in (0, 1) else {"error": done.stderr.strip()}
        # compare's JSON names the level `pace` (its old key `level` kept in this script's results)
        out[name] = {"exit": done.returncode, "level": report.get("pace"), "where": report.get("where")}
    return out


def serve_rotating(policies: dict[str, Path], folder: Path, cells: int, prompts: int, lens: str) -> Path:
    """Step 3: one serve-bench of `cells` cells whose policy file is replaced by the next of `policies` as each cell
    ends; its serving.json."""
    folder.mkdir(parents=True, exist_ok=True)
    live = folder / "policy.json"
    shutil.copy(policies["right"], live)
    shutil.copy(policies["right"].with_name("run.json"), folder / "run.json")
    out, trace = folder / "serving.json", folder / "trace.jsonl"
    trace.unlink(missing_ok=True)
    cmd = [
        sys.executable, "-m", "ppprof", "serve-bench", live, "--concurrency", "1", "--num-prompts", prompts,
        "--prompt-lens", lens, "--strategies", "policy", "--repeats", cells, "--seed", 100, "--out", out,
        "--forward-trace", trace, "--verbose",
    ]  # fmt: skip
    env = {**os.environ, "PPPROF_POLICY_CHECK_S": "0", "PYTHONUNBUFFERED": "1"}  # each cell's line as it ends
    proc = subprocess.Popen(list(map(str, cmd)), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    # the right policy between every two others: each cell of another policy has the right policy's cells next to
    # it in time, a second or two away (a busy host's load moves over tens of seconds)
    order = [n for other in policies if other != "right" for n in ("right", other)]
    log = []

    def follow() -> None:
        """As a cell ends, the next policy of the rotation is installed, once the ranks took the one before (a
        policy installed while the ranks still serve the one before it would be skipped)."""
        k, taken = 0, True
        for line in proc.stderr:
            log.append(line)
            taken = taken or "taken by every rank" in line
            if (
                taken
                and line.startswith("[rank 0]")
                and "concurrency-1, policy, repeat" in line
                and "pools back" in line
            ):
                k, taken = k + 1, False
                tmp = live.with_name("policy.json.new")
                shutil.copy(policies[order[k % len(order)]], tmp)
                os.replace(tmp, live)

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    proc.wait()
    reader.join()
    if proc.returncode != 0:
        sys.exit(f"serve-bench of the rotation failed ({proc.returncode}):\n{''.join(log)[-3000:]}")
    return out


def cell_figures(serving: Path, policies: dict[str, Path], prompts: list[int]) -> list[dict]:
    """Each measured cell of the rotation in order: its policy (by the sha256 its batches ran under), mean TTFT and
    throughput from its makespan on the last stage (module doc, step 3)."""
    names = {hashlib.sha256(p.read_bytes()).hexdigest()[:12]: name for name, p in policies.items()}
    rows = pd.read_csv(serving.with_name("serving.csv"), dtype={"policy_sha256": str})
    last = rows.stage.max()
    out = []
    for repeat, g in rows.groupby("repeat"):
        shas = set(g.policy_sha256)
        assert len(shas) == 1, f"cell {repeat} ran under {shas}"
        makespan = float(g[g.stage == last].end_ms.max())
        out.append(
            {
                "repeat": int(repeat),
                "policy": names[shas.pop()],
                "ttft_mean_ms": makespan / len(prompts),
                "throughput_tokens_per_s": sum(prompts) / makespan * 1e3,
                "chunks_per_request": int((g.stage == last).sum()) / len(prompts),
            }
        )
    return out


def paired(cells: list[dict], key: str) -> dict:
    """Each policy's cells over the mean of the right policy's nearest cells before and after it (in serving order):
    the median ratio less 1, its 80% interval (a seeded bootstrap of the median over the pairs), range and count."""
    right = [c for c in cells if c["policy"] == "right"]
    rng = np.random.default_rng(0)
    out = {}
    for name in POLICIES:
        ratios = []
        for c in cells:
            if c["policy"] != name or name == "right":
                continue
            before = [r for r in right if r["repeat"] < c["repeat"]][-1:]
            near = before + [r for r in right if r["repeat"] > c["repeat"]][:1]
            if near:
                ratios.append(c[key] / statistics.mean(r[key] for r in near) - 1.0)
        if ratios:
            draws = np.median(np.array(ratios)[rng.integers(0, len(ratios), (2000, len(ratios)))], axis=1)
            out[name] = {
                "median": statistics.median(ratios),
                "interval_80": [float(q) for q in np.quantile(draws, [0.1, 0.9])],
                "min": min(ratios),
                "max": max(ratios),
                "cells": len(ratios),
            }
    return out


def main() -> None:
    parser = script_parser(__doc__, "results/loop-closed/result.json")
    parser.add_argument("--num-prompts", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=98, help="cells of the rotation (serve-bench takes at most 100)")
    parser.add_argument("--prompt-lens", default="1000,2000,3000")
    parser.add_argument(
        "--host", default="not stated", help="what else ran on the host (a quiet host, shared with ...): recorded as is"
    )
    args = parser.parse_args()
    folder = Path(args.out).parent
    policies = prepare(folder)
    first, calibration = {}, {}
    for name, served, target, seed in (
        ("wrong", ["wrong"], "wrong-calibrated", 0),
        ("wrong-calibrated", ["wrong", "wrong-calibrated"], "wrong-calibrated-2", 1),
        ("other", ["other"], "other-calibrated", 0),
    ):
        trace = policies[name].with_suffix(".trace.jsonl")
        trace.unlink(missing_ok=True)
        first[name] = serve(
            policies[name], policies[name].with_suffix(".serving.json"), trace, args.num_prompts, args.prompt_lens, seed
        )
        traces = [policies[n].with_suffix(".trace.jsonl") for n in served]
        base = policies[served[0]]
        calibration[target] = ppprof("calibrate", base, *traces, "-o", policies[target]).stdout.splitlines()
    if (folder / "rounds").exists():
        shutil.rmtree(folder / "rounds")
    serving = serve_rotating(policies, folder / "rotation", args.repeats, args.num_prompts, args.prompt_lens)
    prompts = json.loads(serving.read_text())["prompt_lens"]
    cells = cell_figures(serving, policies, prompts)
    held_out = [serving.with_name("trace.jsonl")]
    trace_b = folder / "other-profile" / "trace.jsonl"
    trace_b.unlink(missing_ok=True)
    on_b = folder / "other-profile" / "policy.json"
    serve(on_b, folder / "other-profile" / "serving.json", trace_b, args.num_prompts, args.prompt_lens, 100)
    medians = {
        name: {
            k: statistics.median(c[k] for c in cells if c["policy"] == name)
            for k in cells[0]
            if k not in ("repeat", "policy")
        }
        | {"cells": sum(c["policy"] == name for c in cells)}
        for name in POLICIES
    }
    calibrated = {name: json.loads(policies[name].read_text()) for name in POLICIES if "calibrated" in name}
    result = {
        "num_prompts": args.num_prompts,
        "prompt_lens": args.prompt_lens,
        "repeats": args.repeats,
        "host": args.host,
        "method": (
            "policies rotated cell by cell in one run, medians and ranges of ratios to the right policy's "
            "neighbouring cells"
        ),
        "statuses": {
            n: [json.loads(p.read_text())["status"], json.loads(p.read_text())["reason"]] for n, p in policies.items()
        },  # fmt: skip
        "calibration_forwards": {n: report_of(c)["provenance"]["live"]["forwards_used"] for n, c in calibrated.items()},
        "calibration_profile_rows": {
            n: report_of(c)["provenance"]["live"]["profile_rows"] for n, c in calibrated.items()
        },
        "profile_requests": int(len(pd.read_csv(folder / "right" / "samples.csv"))),
        "calibration_serves": first,
        "medians": medians,
        "vs_right_paired": {
            "ttft_mean_ms": paired(cells, "ttft_mean_ms"),
            "throughput_tokens_per_s": paired(cells, "throughput_tokens_per_s"),
        },
        "cells": cells,
        "prediction_on_held_out": {name: prediction_errors(policies[name], held_out) for name in POLICIES},
        "drift_on_served_model": {name: drift(policies[name], held_out[0]) for name in POLICIES},
        "drift_on_other_model": {
            "trace": str(trace_b),
            "right": drift(policies["right"], trace_b),
            "other": drift(on_b, trace_b),
        },
        "calibrate_output": calibration,
    }
    write_result(args.out, result)
    write_manifest(folder)  # the folder's own, for results/README.md's entry
    print(json.dumps({k: result[k] for k in ("medians", "vs_right_paired", "prediction_on_held_out")}, indent=1))
    tidy(folder)


def tidy(folder: Path) -> None:
    """The plots and serving.csv go (result.json and serving.json summarise them); the rotation's trace, held out
    for prediction and drift, is kept gzipped (`gunzip -k` it for `ppprof compare`)."""
    for path in [*folder.rglob("*.png"), *folder.rglob("serving.csv")]:
        path.unlink()
    trace = folder / "rotation" / "trace.jsonl"
    with open(trace, "rb") as f, gzip.open(trace.with_suffix(".jsonl.gz"), "wb", compresslevel=9) as out:
        shutil.copyfileobj(f, out)
    trace.unlink()


if __name__ == "__main__":
    main()

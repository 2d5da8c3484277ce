#!/usr/bin/env bash
# Validates `ppprof tune` on the pipeline (results/bench-tune/): a tiny-hybrid profile on CPU (2 ranks) with a base
# chunk of 2048 (so that the profiled chunk sizes, up to 2560, leave the tuner room on both sides), `ppprof tune` of
# two prompt lengths for SGLang and for ATOM, then one `ppprof bench` that runs, interleaved: fixed chunks of the
# profile's B, the policy's own rule (greedy), and tune's plans (the server default, the policy's settings as the
# server runs them, each server's recommendation, the best fixed chunk and the DP-optimal plan).
# About 6 minutes on 2 cores; OUT/manifest.json records the run. Usage: bash scripts/experiments/bench_tune.sh [OUT]
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;; esac
command="bash scripts/experiments/bench_tune.sh${*:+$(printf ' %q' "$@")}"
cd "$(dirname "$0")/../.."
out=${1:-results/bench-tune}
rm -rf "$out"
mkdir -p "$out"
bash scripts/setup.sh > /dev/null
ppprof=.venv/bin/ppprof
$ppprof profile --design grid --base-chunk-size 2048 --requests-per-probe 64 --seed 0 --out "$out/profile" 2> "$out/profile.log"
lens=8192,24576
for server in sglang atom; do
  $ppprof tune "$out/profile/policy.json" --prompt-lens "$lens" --server "$server" --json \
    --png "$out/tune-$server.png" > "$out/tune-$server.json"
  $ppprof tune "$out/profile/policy.json" --prompt-lens "$lens" --server "$server" --png "$out/tune-$server.png" \
    > "$out/tune-$server.txt" 2>&1
  cat "$out/tune-$server.txt"
done
# One plans file: SGLang's plans as sglang-<name>, ATOM's recommendation as atom-recommended.
.venv/bin/python - "$out" <<'PY'
import json, sys
out = sys.argv[1]
sglang, atom = (json.load(open(f"{out}/tune-{s}.json"))["plans"] for s in ("sglang", "atom"))
plans = {n: {**{f"sglang-{k}": v for k, v in sglang[n].items()}, "atom-recommended": atom[n]["recommended"]}
         for n in sglang}
json.dump(plans, open(f"{out}/plans.json", "w"), indent=1)
PY
$ppprof bench "$out/profile/policy.json" --plans "$out/plans.json" --strategies fixed,greedy --repeats 5 \
  --out "$out/bench" 2> "$out/bench.log"
grep -v '^\[rank' "$out/bench.log" | grep -v 'it/s\]$' | tail -n 30
# What made OUT, for results/README.md (ppprof.manifest): the command line, git revision, CPU, date.
.venv/bin/python -m ppprof.manifest "$out" --command "$command" > /dev/null

#!/usr/bin/env bash
# The serving bench through the ranks against its simulation (issue 33): a fresh default profile (tiny-hybrid, CPU,
# 2 ranks, B = 512), then `ppprof serve-bench` on its policy, closed loops of 1, 2, 4 and 8 requests, prompts of 4 to
# 64 x B (2048-32768 tokens, equal weights), every arm, each (level, arm) REPEATS times interleaved; serving.json
# holds each cell's median beside the simulation of the same prompts on the fresh policy's model.
# About 15 minutes on 2 idle cores. Usage: bash scripts/experiments/serving_real.sh [OUT]
# REUSE_PROFILE=1 serves OUT's profile again; NUM_PROMPTS (16) and REPEATS (3) size the run.
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;; esac
command="bash scripts/experiments/serving_real.sh${*:+$(printf ' %q' "$@")}"
cd "$(dirname "$0")/../.."
out=${1:-results/serving-real}
mkdir -p "$out"
bash scripts/setup.sh > /dev/null
if [ -z "${REUSE_PROFILE:-}" ] || [ ! -f "$out/profile/policy.json" ]; then
  rm -rf "$out/profile"
  .venv/bin/ppprof profile --design grid --out "$out/profile" 2> "$out/profile.log"
fi
.venv/bin/ppprof serve-bench "$out/profile/policy.json" --concurrency 1,2,4,8 --num-prompts "${NUM_PROMPTS:-16}" \
  --prompt-lens 2048,4096,8192,16384,32768 --repeats "${REPEATS:-3}" --out "$out/serving.json" 2> "$out/serving.log"
grep -v '^\[rank' "$out/serving.log" || true
.venv/bin/python -m ppprof.manifest "$out" --command "$command" > /dev/null

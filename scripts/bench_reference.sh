#!/usr/bin/env bash
# The committed bench reference (results/bench-reference/): the default tiny-hybrid profile on CPU (2 ranks), then
# `ppprof bench` on its policy for prompts of 16 x B and 64 x B (B = 512): PP2 real and replay, PP4 and PP8 replayed
# on the same 2 ranks. About 15 minutes on 2 cores. Usage: bash scripts/bench_reference.sh [OUT]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/bench-reference}
rm -rf "$out"
mkdir -p "$out"
bash scripts/setup.sh > /dev/null
.venv/bin/ppprof profile --out "$out/profile" 2> "$out/profile.log"
for pp in 2 4 8; do
  .venv/bin/ppprof bench "$out/profile/policy.json" --prompt-len 8192 --prompt-len 32768 --pp "$pp" \
    --out "$out/pp$pp" 2> "$out/bench-pp$pp.log"
  grep -v '^\[rank' "$out/bench-pp$pp.log" | grep -v '^bench:.*it/s\]$' | tail -n 16
done

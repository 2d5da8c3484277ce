#!/usr/bin/env bash
# The committed bench reference (results/bench-reference/): for the default tiny-hybrid model (2 attention layers of 8)
# and for tiny-dense (every layer attention: the attention weighs more), the default profile on CPU (2 ranks), then
# `ppprof bench` on its policy for prompts of 16 x B and 64 x B (B = 512), every strategy (policy, policy-history,
# greedy, sglang, fixed, fixed-best, optimal) interleaved over 5 repeats: PP2 real and replay, PP4 and PP8 replayed on
# the same 2 ranks, each on the profile refitted for its depth. tiny-hybrid's runs are in OUT/ (profile/, pp2/, pp4/, pp8/), tiny-dense's in OUT/tiny-dense/.
# About 30 minutes on 2 idle cores; OUT/manifest.json records the run. Usage: bash scripts/experiments/bench_reference.sh [OUT]
# DEPTHS="4 8" bench only those depths; REUSE_PROFILES=1 keeps OUT's profiles (and the other depths' runs) and benches
# them again, e.g. on a host too noisy to profile on (a profile's CV gate fails there) but fit for paired benches.
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;; esac
command="bash scripts/experiments/bench_reference.sh${*:+$(printf ' %q' "$@")}"
cd "$(dirname "$0")/../.."
out=${1:-results/bench-reference}
depths=${DEPTHS:-2 4 8}
if [ -z "${REUSE_PROFILES:-}" ]; then
  rm -rf "$out"
fi
mkdir -p "$out"
bash scripts/setup.sh > /dev/null
for model in tiny-hybrid tiny-dense; do
  dir=$([ "$model" = tiny-hybrid ] && echo "$out" || echo "$out/$model")
  mkdir -p "$dir"
  if [ -z "${REUSE_PROFILES:-}" ] || [ ! -f "$dir/profile/samples.csv" ]; then
    .venv/bin/ppprof profile --design grid --model "$model" --out "$dir/profile" 2> "$dir/profile.log"
  fi
  for pp in $depths; do
    # A policy's rules are chosen for its pipeline depth: deeper pipelines bench the profile refitted for them.
    policy="$dir/profile/policy.json"
    if [ "$pp" != 2 ]; then
      policy="$dir/profile/policy-pp$pp.json"
      .venv/bin/ppprof fit "$dir/profile/samples.csv" --pp-size "$pp" -o "$policy" > /dev/null
    fi
    rm -rf "$dir/pp$pp"
    .venv/bin/ppprof bench "$policy" --prompt-len 8192 --prompt-len 32768 --pp-size "$pp" \
      --out "$dir/pp$pp" 2> "$dir/bench-pp$pp.log"
    echo "== $model, PP$pp"
    grep -v '^\[rank' "$dir/bench-pp$pp.log" | grep -v '^bench:.*it/s\]$' | tail -n 22
  done
done
# What made OUT, for results/README.md (ppprof.manifest): the command line, git revision, CPU, date.
.venv/bin/python -m ppprof.manifest "$out" --command "$command" > /dev/null

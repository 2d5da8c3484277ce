#!/usr/bin/env bash
# A window of Mooncake's conversation trace replayed through the real pipeline against its simulation (issue 45): a
# fresh default profile (tiny-hybrid, CPU, 2 ranks, B = 512, grid design), then `ppprof serve-bench --trace` on its
# policy: the requests of seconds WINDOW of the trace (600:660, 218 requests, 8.4% of their input an earlier one's
# prefix), lengths x LENGTH_SCALE (0.1), arrivals x TIME_SCALE (0.3: the simulated stages about 70% busy, not
# saturated), every arm, REPEATS (3) runs interleaved, with the prefix cache (cache/serving.json) and then without it
# (nocache/serving.json, --cache-tokens 0). Each serving.json holds every arm's median beside the simulation of the
# same window with the same cache; runs.jsonl every run in bench_serving's names. About 20 minutes on 2 idle cores.
# Usage: bash scripts/experiments/trace_real.sh [OUT]   (default results/trace-real)
# REUSE_PROFILE=1 serves OUT's profile again, PROFILE=DIR another profile's (its policy.json and run.json); TRACE,
# WINDOW, LENGTH_SCALE, TIME_SCALE, REPEATS, ARMS (all) size it.
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;; esac
command="bash scripts/experiments/trace_real.sh${*:+$(printf ' %q' "$@")}"
cd "$(dirname "$0")/../.."
out=${1:-results/trace-real}
trace=${TRACE:-../shared/data/mooncake/conversation_trace.jsonl}
mkdir -p "$out"
bash scripts/setup.sh > /dev/null
profile=${PROFILE:-$out/profile}
if [ -z "${PROFILE:-}" ] && { [ -z "${REUSE_PROFILE:-}" ] || [ ! -f "$out/profile/policy.json" ]; }; then
  rm -rf "$out/profile"
  .venv/bin/ppprof profile --design grid --out "$out/profile" 2> "$out/profile.log"
fi
arms=()
[ -z "${ARMS:-}" ] || arms=(--strategies "$ARMS")
rm -f "$out/runs.jsonl"
for cache in cache nocache; do
  extra=()
  [ "$cache" = cache ] || extra=(--cache-tokens 0)
  mkdir -p "$out/$cache"
  .venv/bin/ppprof serve-bench "$profile/policy.json" --trace "$trace" --trace-window "${WINDOW:-600:660}" \
    --length-scale "${LENGTH_SCALE:-0.1}" --time-scale "${TIME_SCALE:-0.3}" --repeats "${REPEATS:-3}" "${arms[@]}" \
    "${extra[@]}" --out "$out/$cache/serving.json" --output-file "$out/runs.jsonl" 2> "$out/$cache/serving.log" \
    || { tail -5 "$out/$cache/serving.log" >&2; exit 1; }
  grep -v '^\[rank' "$out/$cache/serving.log" || true
done
.venv/bin/python -m ppprof.manifest "$out" --command "$command" > /dev/null

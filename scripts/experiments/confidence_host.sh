#!/usr/bin/env bash
# The README's first command, profiled again and again on one host (issue 35): QUIET default profiles (3) with
# nothing else running, then LOADED ones (6) beside a stated background load: one Python busy loop, one of the 2
# cores. Each run's wall time goes into its folder (wall_s); then scripts/experiments/confidence_host.py sets each
# run's status by the decision's confidence (policy.json) beside the status the per-row gates gave before
# (diagnostics.row_gates) and writes OUT/summary.json. About 25 minutes on 2 cores.
# Usage: bash scripts/experiments/confidence_host.sh [OUT]   (QUIET and LOADED set the counts)
set -euo pipefail
case "${1:-}" in -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0;; esac
command="bash scripts/experiments/confidence_host.sh${*:+$(printf ' %q' "$@")}"
cd "$(dirname "$0")/../.."
out=${1:-results/confidence-host}
mkdir -p "$out"
bash scripts/setup.sh > /dev/null
profile() {  # profile NAME: the default profile into OUT/NAME, its wall time beside it
  rm -rf "${out:?}/$1"
  local start=$SECONDS
  .venv/bin/ppprof profile --out "$out/$1" 2> "$out/$1.log" || echo "profile $1 failed" >&2
  echo $((SECONDS - start)) > "$out/$1.wall_s"
}
for i in $(seq 1 "${QUIET:-3}"); do profile "quiet-$i"; done
.venv/bin/python -c "while True: pass" &
busy=$!
trap 'kill $busy 2> /dev/null || true' EXIT
for i in $(seq 1 "${LOADED:-6}"); do profile "loaded-$i"; done
kill $busy
.venv/bin/python scripts/experiments/confidence_host.py "$out" -o "$out/summary.json"
.venv/bin/python -m ppprof.manifest "$out" --command "$command" > /dev/null

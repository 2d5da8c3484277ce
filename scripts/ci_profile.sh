#!/usr/bin/env bash
# The profile CI job: set up, profile, validate the policy, compare it with a baseline, and leave the run folder and
# the comparison as artifacts in the folder it prints.
#   bash scripts/ci_profile.sh [CONFIG [BASELINE]] [-- PROFILE_OPTIONS...]
# CONFIG    a profile YAML (`ppprof profile --config`); empty or absent: the built-in default (tiny-hybrid, CPU, 2
#           ranks). Also $PPPROF_CONFIG.
# BASELINE  a run folder or policy file to compare with; default: the committed default profile of this CPU model
#           (results/baseline*/ whose run.json names it), else results/baseline;
#           also $PPPROF_BASELINE. `none` profiles and validates without comparing (to make a first baseline: commit
#           the run folder it leaves, `git add -f`, since results/*/ is ignored).
# PROFILE_OPTIONS  more `ppprof profile` options, e.g. -- --nproc-per-node 8 (flags win over CONFIG). Without
#           --design (or --max-requests / --max-seconds, which choose the adaptive one) here or in CONFIG, the
#           profile runs the baseline's design (its run.json's; grid if it has none, or for a first baseline).
# $PPPROF_ARTIFACTS  the artifacts folder (default ci-artifacts/<UTC time>): run/ (samples.csv, run.json,
#           policy.json, plots, rank logs), compare.txt, compare.json, compare.png.
# $PPPROF_TOLERANCE  `ppprof compare --tolerance` items, e.g. pace=1.5,ttft=0.1,samples=0.1 (.ci/run passes
#                    pace=1.5,samples=0.3,ttft=0.4; level=, the old name of pace, is still read).
# $PPPROF_CI_ATTEMPTS  profiles a drift must show in, one after the other, to fail (default 3: a shared machine has
#           noisy runs; a real drift shows in both). Later attempts leave run-N/ and compare-N.* beside the first.
# $PPPROF_CI_SETUP=0 skips scripts/setup.sh (an environment already set up).
# Exit: 0 within tolerance; 1 drift beyond tolerance, or a profile or policy that failed; 2 bad input.
set -euo pipefail
caller=$PWD
cd "$(dirname "$0")/.."
bad_input() { echo "ci_profile: $*" >&2; exit 2; }
failed() { echo "ci_profile: $*" >&2; exit 1; }
positional=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do positional+=("$1"); shift; done
[ $# -gt 0 ] && shift  # the "--"
extra=("$@")
[ ${#positional[@]} -le 2 ] \
  || bad_input "too many arguments (${positional[*]}): use [CONFIG [BASELINE]] [-- PROFILE_OPTIONS]"
config=${positional[0]:-${PPPROF_CONFIG:-}}
# The default baseline is the committed profile of this kind of machine: the results/baseline*/ whose run.json names
# this host's CPU model (a profile's latencies, and so its policy, are those of its CPU), else results/baseline.
machine_baseline() {
  local cpu dir
  cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1)
  for dir in results/baseline*/; do
    if [ -n "$cpu" ] && grep -qF "\"device_name\": \"$cpu\"" "$dir/run.json" 2>/dev/null; then
      echo "${dir%/}"; return
    fi
  done
  echo results/baseline
}
baseline=${positional[1]:-${PPPROF_BASELINE:-$(machine_baseline)}}
attempts=${PPPROF_CI_ATTEMPTS:-3}
# Paths the caller gives are relative to where it ran, else to the repository root (where the defaults are).
from_caller() {
  case $1 in
    /*|none|"") echo "$1" ;;
    *) if [ -e "$caller/$1" ]; then echo "$caller/$1"; else echo "$1"; fi ;;
  esac
}
config=$(from_caller "$config")
baseline=$(from_caller "$baseline")
[ -z "$config" ] || [ -f "$config" ] || bad_input "CONFIG $config does not exist: pass a profile YAML" \
  "(e.g. configs/profile-default.yaml) or nothing for the default"
[ "$baseline" = none ] || [ -e "$baseline" ] || bad_input "BASELINE $baseline does not exist: pass a run folder" \
  "or policy file, or 'none' to profile without comparing"
[[ "$attempts" =~ ^[1-9][0-9]*$ ]] || bad_input "PPPROF_CI_ATTEMPTS $attempts is invalid: use a positive integer"
artifacts=${PPPROF_ARTIFACTS:-ci-artifacts/$(date -u +%Y%m%d-%H%M%S)}
if [ -n "${PPPROF_ARTIFACTS:-}" ] && [[ "$artifacts" != /* ]]; then artifacts="$caller/$artifacts"; fi
mkdir -p "$artifacts"
echo "ci_profile: artifacts in $artifacts; baseline $baseline"

[ "${PPPROF_CI_SETUP:-1}" = 0 ] || bash scripts/setup.sh
ppprof() { .venv/bin/python -m ppprof "$@"; }
profile_options=(${config:+--config "$config"} "${extra[@]}")
# The profile is compared cell by cell with the baseline, so it runs the baseline's probe design (its run.json's
# design; grid where it records none) unless the options or CONFIG choose one: the default adaptive design picks its
# cells from its own rows and shares a handful with a grid baseline (6 of its 197 cells in one try, one or two a
# prefix length), where the grid shares them all: the pace and the drift at each prefix length rest on those cells.
baseline_design() {
  local run_json=$1
  [ -d "$1" ] && run_json="$1/run.json" || run_json="$(dirname "$1")/run.json"
  .venv/bin/python - "$run_json" <<'PY'
import json, sys
try:
    design = json.load(open(sys.argv[1])).get("design")
except (OSError, ValueError):
    design = None
print(design.get("design", "grid") if isinstance(design, dict) else "grid")
PY
}
# The design to add: none where the options or CONFIG choose one (--design, or the adaptive design's budgets
# --max-requests / --max-seconds, which choose it); else the baseline's, and grid for a first baseline (`none`), so
# that the profiles later compared with it share its cells.
chosen_design() {
  local word
  for word in "${extra[@]}"; do
    case $word in --design|--design=*|--max-requests|--max-requests=*|--max-seconds|--max-seconds=*) return ;; esac
  done
  if [ -n "$config" ] && grep -qE '^[[:space:]]*(design|max[-_]requests|max[-_]seconds)[[:space:]]*:' "$config"; then
    return
  fi
  if [ "$baseline" = none ]; then echo grid; else baseline_design "$baseline"; fi
}
design=$(chosen_design)
[ -z "$design" ] || profile_options+=(--design "$design")
tolerance=(${PPPROF_TOLERANCE:+--tolerance "$PPPROF_TOLERANCE"})

for attempt in $(seq 1 "$attempts"); do
  suffix=$([ "$attempt" = 1 ] && echo "" || echo "-$attempt")
  run="$artifacts/run$suffix"
  log="$artifacts/profile$suffix.log"
  echo "ci_profile: profiling into $run (attempt $attempt of $attempts): ppprof profile ${profile_options[*]}"
  ppprof profile "${profile_options[@]}" --out "$run" > "$log" 2>&1 \
    || { tail -n 20 "$log" >&2; failed "the profile failed (log: $log)"; }
  for f in samples.csv run.json policy.json fit.png chunks.png rank0.log; do
    test -s "$run/$f" || failed "the profile did not write $run/$f"
  done
  ppprof validate "$run/policy.json" || failed "the policy $run/policy.json is not valid"
  if [ "$baseline" = none ]; then
    echo "ci_profile: no baseline given; to make this run the baseline:" \
      "cp -r $run results/<name> && git add -f results/<name>"
    exit 0
  fi
  set +e
  ppprof compare "$baseline" "$run" "${tolerance[@]}" --out "$artifacts/compare$suffix.json" \
    --plot "$artifacts/compare$suffix.png" > "$artifacts/compare$suffix.txt" 2>&1
  rc=$?
  set -e
  cat "$artifacts/compare$suffix.txt"
  [ "$rc" = 1 ] || break
  [ "$attempt" = "$attempts" ] \
    || echo "ci_profile: drift beyond tolerance; profiling again to tell a drift from a noisy run"
done
case $rc in
  0) echo "ci_profile: ok: $run is within tolerance of $baseline (artifacts in $artifacts)" ;;
  1) echo "ci_profile: drift beyond tolerance of $baseline in $attempts profile(s) in a row" \
       "(artifacts in $artifacts)" >&2 ;;
  *) echo "ci_profile: ppprof compare failed (exit $rc)" >&2 ;;
esac
exit "$rc"

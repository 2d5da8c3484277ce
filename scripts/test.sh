#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite. Exits non-zero when a test fails or when none ran.
#   bash scripts/test.sh [PYTEST_ARGS...]   (the arguments go to both phases, e.g. tests/fit -k compare)
# Two phases, side by side:
# - the tests that start real ranks (marked multirank), one at a time at normal priority: each already runs two or
#   more processes, and some judge a deadline; their ranks wait on one another and on their launcher so much that
#   the phase alone kept 1.05 of 2 cores busy (283 s of CPU in 267 s, 2026-12-05). Their output is shown when they end.
# - the tests that run in this process (most of them), beside them at nice 10, on $PPPROF_TEST_WORKERS pytest-xdist
#   workers (default 2, one a core; 1 runs them in this process), a test file a worker at a time (--dist loadfile:
#   a module's fixtures are made once, not on both workers; pytest-xdist's xdist_group marks do not group under
#   pytest 9): they take the cores the ranks leave idle and give them back at once when a rank wants one.
# PPPROF_TEST_SERIAL=1 runs the two phases one after the other, as before. Each phase prints its 25 slowest tests; the
# last line gives each phase's time and the whole run's.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
workers=${PPPROF_TEST_WORKERS:-2}
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || { echo "test.sh: PPPROF_TEST_WORKERS $workers is invalid: use a positive integer" >&2; exit 2; }
serial=${PPPROF_TEST_SERIAL:-0}
[[ "$serial" =~ ^[01]$ ]] || { echo "test.sh: PPPROF_TEST_SERIAL $serial is invalid: use 0 or 1" >&2; exit 2; }
parallel=()
[ "$workers" = 1 ] || parallel=(-n "$workers" --dist loadfile)
took() { printf '%d min %02d s' $(($1 / 60)) $(($1 % 60)); }
start=$SECONDS
multirank_phase() {
  .venv/bin/python -m pytest -m multirank -p no:cacheprovider --durations=25 "$@"
}
if [ "$serial" = 1 ]; then
  .venv/bin/python -m pytest -m "not multirank" "${parallel[@]}" --durations=25 "$@"
  in_process=$?
  in_process_s=$((SECONDS - start))
  multirank_phase "$@"
  multirank=$?
  multirank_s=$((SECONDS - start - in_process_s))
else
  out=$(mktemp -d)
  # The multirank phase in its own process group (job control on), so that an interrupt ends its ranks too.
  set -m
  (
    multirank_phase "$@" >"$out/log" 2>&1
    echo $? >"$out/rc"
    echo $((SECONDS - start)) >"$out/s"
  ) &
  ranks=$!
  set +m
  trap 'kill -- -$ranks 2>/dev/null; rm -rf "$out"; exit 130' INT TERM
  nice -n 10 .venv/bin/python -m pytest -m "not multirank" "${parallel[@]}" --durations=25 "$@"
  in_process=$?
  in_process_s=$((SECONDS - start))
  [ -s "$out/rc" ] || echo "test.sh: the tests that start ranks are still running; their output follows when they end"
  wait "$ranks"
  trap - INT TERM
  cat "$out/log"
  multirank=$(cat "$out/rc" 2>/dev/null || echo 1)
  multirank_s=$(cat "$out/s" 2>/dev/null || echo $((SECONDS - start)))
  rm -rf "$out"
fi
echo "test.sh: in-process phase $(took "$in_process_s"), multirank phase $(took "$multirank_s")," \
  "$([ "$serial" = 1 ] && echo "one after the other" || echo "side by side"), whole run $(took $((SECONDS - start)))"
# pytest exits 5 when a phase collected no test: fine while the other phase ran some.
if [ "$in_process" -eq 5 ] && [ "$multirank" -eq 5 ]; then
  echo "test.sh: pytest collected no tests" >&2
  exit 5
fi
for rc in "$in_process" "$multirank"; do
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 5 ]; then
    exit "$rc"
  fi
done
exit 0

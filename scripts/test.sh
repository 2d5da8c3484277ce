#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite. Exits non-zero when a test fails or when none ran.
#   bash scripts/test.sh [PYTEST_ARGS...]   (the arguments go to both phases, e.g. tests/fit -k compare)
# Two phases: the tests that run in this process (most of them) on $PPPROF_TEST_WORKERS pytest-xdist workers
# (default 2, one a core; 1 runs them in this process), then the tests that start real ranks (marked multirank) one
# at a time, alone on the machine: each of those already runs two or more processes, and some judge a deadline.
# Each phase prints its 25 slowest tests; the last line gives each phase's time.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
workers=${PPPROF_TEST_WORKERS:-2}
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || { echo "test.sh: PPPROF_TEST_WORKERS $workers is invalid: use a positive integer" >&2; exit 2; }
parallel=()
[ "$workers" = 1 ] || parallel=(-n "$workers")
start=$SECONDS
.venv/bin/python -m pytest -m "not multirank" "${parallel[@]}" --durations=25 "$@"
in_process=$?
middle=$SECONDS
.venv/bin/python -m pytest -m multirank --durations=25 "$@"
multirank=$?
took() { printf '%d min %02d s' $(($1 / 60)) $(($1 % 60)); }
echo "test.sh: in-process phase $(took $((middle - start))), multirank phase $(took $((SECONDS - middle)))"
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

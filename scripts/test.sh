#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite. Exits non-zero when a test fails or when none ran.
#   bash scripts/test.sh [PYTEST_ARGS...]   (the arguments go to both phases, e.g. tests/fit -k compare)
# Two phases: the tests that run in this process (most of them) on $PPPROF_TEST_WORKERS pytest-xdist workers
# (default 2, one a core; 1 runs them in this process), then the tests that start real ranks (marked multirank): two
# at a time on as many workers (a pipeline's ranks wait on each other in lockstep, and every launch starts with
# seconds of imports in one process, so one launch leaves a core idle most of the time), then those that judge a
# deadline (marked alone as well) one at a time, alone on the machine.
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
.venv/bin/python -m pytest -m "multirank and not alone" "${parallel[@]}" --durations=25 "$@"
together=$?
.venv/bin/python -m pytest -m "multirank and alone" --durations=25 "$@"
alone=$?
# pytest exits 5 when a part collected no test: the multirank phase ran none only when both parts ran none.
if [ "$together" -eq 5 ] && [ "$alone" -eq 5 ]; then multirank=5
elif [ "$together" -ne 0 ] && [ "$together" -ne 5 ]; then multirank=$together
elif [ "$alone" -ne 0 ] && [ "$alone" -ne 5 ]; then multirank=$alone
else multirank=0; fi
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

#!/usr/bin/env bash
# Set up (scripts/setup.sh) and run the whole test suite. Exits non-zero when a test fails or when none ran.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
.venv/bin/python -m pytest "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test.sh: pytest collected no tests" >&2
fi
exit "$rc"

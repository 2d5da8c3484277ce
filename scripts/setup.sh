#!/usr/bin/env bash
# Set up ppprof in ./.venv: keeps a torch the Python environment already has (the venv then sees it), otherwise
# installs torch==2.13.0 (never an unpinned torch, which would pull a multi-GB CUDA build), then ppprof itself
# (editable) with its test extras. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: keeping the torch of $("$PY" -c 'import sys; print(sys.executable)')"
    "$PY" -m venv --system-site-packages .venv
    # --system-site-packages shows the base interpreter's packages only: where "$PY" is itself a virtual
    # environment's Python, a .pth file makes that environment's packages (its torch) visible too.
    parent=$("$PY" -c 'import sys, sysconfig; print(sysconfig.get_path("purelib") if sys.prefix != sys.base_prefix else "")')
    if [ -n "$parent" ]; then
      echo "$parent" > "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/ppprof-parent-env.pth"
    fi
  else
    "$PY" -m venv .venv
  fi
fi
if ! .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  echo "setup: installing torch==2.13.0"
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -e ".[test]"
.venv/bin/python -c "import torch, ppprof; print(f'setup: ppprof {ppprof.__version__}, torch {torch.__version__}')"

"""Helpers of the tests that start real ranks: a free port, the CLI in a subprocess with a timeout, tiny settings."""

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
"""The checkout this file is in (whatever its folder is named): the subprocesses of the tests run there."""
TIMEOUT_S = 180
TINY_RUN = REPO / "tests" / "runs" / "tiny-hybrid"
"""A committed run folder: a profile of tiny-hybrid at B = 256, context 4096, two stages, its policy dynamic
(tests/runs/README.md)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_cli(
    *args: str, timeout: float = TIMEOUT_S, cwd: Path | None = None, launcher=None, env: dict | None = None
) -> subprocess.CompletedProcess:
    """Run `python -m ppprof ...` (or `launcher ...`) in a subprocess with a timeout, so a hang fails the test; `env`:
    variables added to this process's environment."""
    cmd = (launcher or [sys.executable, "-m", "ppprof"]) + list(args)
    env = {**os.environ, "PPPROF_DIST_TIMEOUT": "120", "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=cwd or REPO, env=env)


# Small enough for a 2-core machine: tiny model, few short requests, no fit; the grid design, whose probes these
# tests name (the default adaptive design plans dynamic chunks, which needs B of at least the alignment, 64).
TINY = (
    "--base-chunk-size",
    "32",
    "--requests-per-probe",
    "8",
    "--prefix-lens",
    "32,64",
    "--warmup",
    "1",
    "--no-fit",
    "--design",
    "grid",
)

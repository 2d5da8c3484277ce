"""SGLang's code for tests on a CPU: the release's wheel and requirements-cpu.txt, installed once with
`pip install --no-deps --target` into a cache folder (never into the venv, whose torch stays the one in use) and used
from there by a fresh interpreter (tests/sglang/scheduler_run.py); the tests skip, with pip's reason, where the
registry cannot be reached, as the contract test does."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .wheel import wheel

REQUIREMENTS = Path(__file__).with_name("requirements-cpu.txt")
CACHE = Path(os.environ.get("PPPROF_SGLANG_CPU", Path.home() / ".cache" / "ppprof" / "sglang-cpu"))
DONE = "installed.json"
"""Written last into an install's folder: what went in and what it took; a folder without it is installed again."""


def size_of(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


@functools.cache
def installed(version: str) -> tuple[Path | None, str]:
    """(the folder holding sglang `version` and its CPU requirements, "") or (None, why it could not be had). The
    folder is named by the requirements file's content, so a changed list installs afresh."""
    whl, why = wheel(version)
    if whl is None:
        return None, why
    reqs = REQUIREMENTS.read_text()
    key = f"{version}-{hashlib.sha256(reqs.encode()).hexdigest()[:12]}"
    target = CACHE / key
    if (target / DONE).is_file():
        return target, ""
    start = time.perf_counter()
    CACHE.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f"{key}.partial-", dir=CACHE))  # one a process: two sessions may install
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--retries",
        "1",
        "--timeout",
        "30",
        "-q",
        "--target",
        str(partial),
        str(whl),
        "-r",
        str(REQUIREMENTS),
    ]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except (OSError, subprocess.TimeoutExpired) as e:
        shutil.rmtree(partial, ignore_errors=True)
        return None, f"pip install --no-deps sglang=={version} and {REQUIREMENTS.name} did not finish ({e})"
    if r.returncode:
        shutil.rmtree(partial, ignore_errors=True)
        lines = [x for x in r.stderr.strip().splitlines() if not x.startswith("WARNING")] or ["no reason given"]
        return None, f"pip install --no-deps of {REQUIREMENTS.name} failed (registry unreachable?): {lines[-1]}"
    seconds = time.perf_counter() - start
    record = {"sglang": version, "wheel": whl.name, "seconds": round(seconds, 1), "bytes": size_of(partial)}
    (partial / DONE).write_text(json.dumps(record))
    try:
        partial.rename(target)
    except OSError:  # another process installed it first (or left a folder without DONE: it goes)
        if not (target / DONE).is_file():
            shutil.rmtree(target, ignore_errors=True)
            partial.rename(target)
    shutil.rmtree(partial, ignore_errors=True)
    return target, ""

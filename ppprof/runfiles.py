"""The files of a run folder, shared by the writers (ppprof/run) and the readers (ppprof/fit): names, run.json
(written and read here, one schema) and the per-stage latency columns of samples.csv. Pure: no torch."""

from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import re
import socket
import threading
from pathlib import Path

from ppprof.io import atomic_write_json

SAMPLES_FILE = "samples.csv"
RUN_FILE = "run.json"
LOCK_FILE = ".ppprof.lock"
LOCK_HELD_ENV = "PPPROF_LOCK_HELD"
"""Set by ppprof's launcher for its ranks when it took the run folder's lock (else rank 0 takes it)."""
RUN_SCHEMA_VERSION = 3
"""2: dist_backend (was backend), attention_backend, attention_kernel, mamba_kernel, torch_threads.
3: status (RUNNING, COMPLETE, INTERRUPTED, "failed: <reason>"); run.json is written when the run starts."""
READABLE_SCHEMA_VERSIONS = (2, RUN_SCHEMA_VERSION)
"""Versions read_run_json reads; a version-2 file (written at the end of a run) reads as status COMPLETE."""
RUNNING, COMPLETE, INTERRUPTED, FAILED = "running", "complete", "interrupted", "failed"
STAGE_COLUMN = re.compile(r"^stage(\d+)_latency_ms$")


def stage_column(stage: int) -> str:
    """samples.csv column of one stage's latency: stage{i}_latency_ms."""
    return f"stage{stage}_latency_ms"


def write_run_json(path: str | Path, *, config: dict, **fields) -> Path:
    """run.json: the schema version, the creation time, the resolved `config`, the status (COMPLETE unless given)
    and whatever else the run records (model, hardware, torch_version, dist_backend, world_size, layer_partition, git_revision, the kernels that ran,
    wall times, token counts)."""
    doc = {"schema_version": RUN_SCHEMA_VERSION,
           "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "config": config,
           "status": COMPLETE}
    doc.update(fields)
    return atomic_write_json(path, doc)


def read_run_json(path: str | Path) -> dict:
    """A run.json as written by write_run_json; ValueError (one line) when it is unreadable or of another schema."""
    path = Path(path)
    try:
        run = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"run file {path} is not readable JSON ({e}): fix or remove it") from None
    if not isinstance(run, dict) or run.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
        version = run.get("schema_version") if isinstance(run, dict) else None
        raise ValueError(f"run file {path} has schema_version {version!r}: this ppprof reads "
                         f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}")
    if not isinstance(run.get("config"), dict):
        raise ValueError(f"run file {path} lacks its 'config' object: regenerate it with `ppprof profile`")
    if run["schema_version"] < 3:  # written once, at the end of a run that completed
        run.setdefault("status", COMPLETE)
    if not isinstance(run.get("status"), str):
        raise ValueError(f"run file {path} has status {run.get('status')!r}: regenerate it with `ppprof profile`")
    return run


class RunRecord:
    """run.json of a run in progress: written when the run starts (status RUNNING) and again whenever its status
    changes, atomically. `lock` serialises every write into the run folder, so that a thread recording an interrupt
    never lands between a probe's rows."""

    def __init__(self, path: str | Path, *, config: dict, **fields) -> None:
        self.path = Path(path)
        self.config, self.fields = config, {"status": RUNNING, **fields}
        self.lock = threading.RLock()

    def write(self, **fields) -> Path:
        """Update the recorded fields (status among them) and rewrite run.json."""
        with self.lock:
            self.fields.update(fields)
            return write_run_json(self.path, config=self.config, **self.fields)


def lock_owner(folder: str | Path) -> str | None:
    """'pid N on HOST' of the live run that holds `folder`'s lock; None when it is free or its holder died."""
    path = Path(folder) / LOCK_FILE
    try:
        pid_text, _, host = path.read_text().strip().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    if host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None  # stale: its run died without releasing it
        except PermissionError:
            pass
    return f"pid {pid} on {host}"


def check_lock(folder: str | Path) -> None:
    """ValueError naming the holder when a live ppprof run holds the folder's lock file."""
    owner = lock_owner(folder)
    if owner is not None:
        raise ValueError(f"--out {folder} is in use by another ppprof run ({owner}, lock {Path(folder) / LOCK_FILE}): "
                         "wait for it to end or choose another --out")


def take_lock(folder: str | Path) -> Path:
    """Take the run folder's lock file (O_EXCL: one taker wins), replacing a stale one (its pid is dead on this
    host); ValueError naming the holder when a live run holds it. Returns the lock's path."""
    path = Path(folder) / LOCK_FILE
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            check_lock(folder)
            path.unlink(missing_ok=True)
            continue
        except OSError as e:
            raise OSError(e.errno, e.strerror, str(path)) from None
        with os.fdopen(fd, "w") as f:
            f.write(f"{os.getpid()} {socket.gethostname()}\n")
        return path
    raise OSError(errno.EEXIST, "the lock file keeps reappearing", str(path))


def release_lock(folder: str | Path) -> None:
    """Remove the lock file when this process holds it."""
    path = Path(folder) / LOCK_FILE
    try:
        if path.read_text().split()[0] == str(os.getpid()):
            path.unlink()
    except (OSError, IndexError):
        pass

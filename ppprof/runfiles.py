"""The files of a run folder, shared by the writers (ppprof/run) and the readers (ppprof/fit): their names and
paths (RunFolder), run.json (written and read here, one schema), the lock and the per-stage latency columns of
samples.csv. Pure: no torch."""

from __future__ import annotations

import datetime as _dt
import errno
import fcntl
import json
import os
import re
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ppprof.checks import is_int
from ppprof.io import atomic_write_json, parse_json, read_small_text

SAMPLES_FILE = "samples.csv"
PACKED_FILE = "packed.csv"
RUN_FILE = "run.json"
POLICY_FILE = "policy.json"
LOCK_FILE = ".ppprof.lock"
LOCK_HELD_ENV = "PPPROF_LOCK_HELD"
"""Set by ppprof's launcher for its ranks when it took the run folder's lock (else rank 0 takes it)."""
RUN_DIR_NOTE_ENV = "PPPROF_RUN_DIR_NOTE"
"""Set by ppprof's launcher, where no --out names the run folder: a file rank 0 writes the folder it chose into, so
that the launcher can record in its run.json a failure rank 0 could not."""
RUN_SCHEMA_VERSION = 3
"""2: dist_backend (was backend), attention_backend, attention_kernel, mamba_kernel, torch_threads.
3: status (RUNNING, COMPLETE, INTERRUPTED, "failed: <reason>"); run.json is written when the run starts."""
READABLE_SCHEMA_VERSIONS = (2, RUN_SCHEMA_VERSION)
"""Versions read_run_json reads; a version-2 file (written at the end of a run) reads as status COMPLETE."""
RUNNING, COMPLETE, INTERRUPTED, FAILED = "running", "complete", "interrupted", "failed"
STAGE_COLUMN = re.compile(r"^stage(\d+)_latency_ms$")


@dataclass(frozen=True, slots=True)
class RunFolder:
    """A run folder's paths, each file's name written once: samples.csv, packed.csv, run.json and policy.json (what a
    profile writes), the rank logs, and the lock a live run holds. (Its manifest.json is ppprof.manifest's:
    write_manifest names it, as in any result folder.) Paths only: nothing is read or created."""

    path: Path

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))

    @classmethod
    def of(cls, file: str | Path) -> RunFolder:
        """The run folder a file of it lies in (the policy.json or samples.csv a user names)."""
        return cls(Path(file).parent)

    @property
    def samples(self) -> Path:
        return self.path / SAMPLES_FILE

    @property
    def packed(self) -> Path:
        """The packed forwards' rows (ppprof.probe.packed), beside the samples."""
        return self.path / PACKED_FILE

    @property
    def run_json(self) -> Path:
        return self.path / RUN_FILE

    @property
    def policy(self) -> Path:
        return self.path / POLICY_FILE

    @property
    def lock(self) -> Path:
        return self.path / LOCK_FILE

    def rank_log(self, rank: int) -> Path:
        """What rank `rank` logs (and torch's C++ messages of it)."""
        return self.path / f"rank{rank}.log"

    def read_run(self) -> dict | None:
        """Its run.json (read_run_json), None where it has none."""
        return read_run_json(self.run_json) if self.run_json.is_file() else None


def recorded_stages(run: dict | None) -> int | None:
    """The pipeline stages a run record says: its layer partition's, else its pp_size, else (a run.json of before
    pp_size, one rank a stage) its world_size; None where it says none."""
    run = run or {}
    if isinstance(run.get("layer_partition"), list) and run["layer_partition"]:
        return len(run["layer_partition"])
    stages = run.get("pp_size", run.get("world_size"))
    return stages if is_int(stages) and stages > 0 else None


def stage_column(stage: int) -> str:
    """samples.csv column of one stage's latency: stage{i}_latency_ms."""
    return f"stage{stage}_latency_ms"


def write_run_json(path: str | Path, *, config: dict, **fields) -> Path:
    """run.json: the schema version, the creation time, the resolved `config`, the status (COMPLETE unless given)
    and whatever else the run records (model, hardware, torch_version, dist_backend, world_size, layer_partition, git_revision, the kernels that ran,
    wall times, token counts)."""
    return atomic_write_json(path, run_document(config, **fields))


def run_document(config: dict, **fields) -> dict:
    """run.json's document (write_run_json)."""
    doc = {
        "schema_version": RUN_SCHEMA_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "config": config,
        "status": COMPLETE,
    }
    doc.update(fields)
    return doc


def read_run_json(path: str | Path) -> dict:
    """A run.json as written by write_run_json; ValueError (one line) when it is unreadable or of another schema."""
    path = Path(path)
    fix = "fix or remove it"
    try:
        run = parse_json(read_small_text(path, "run file", fix), f"run file {path}")
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"run file {path} is not readable JSON ({e}): {fix}") from None
    if not isinstance(run, dict) or run.get("schema_version") not in READABLE_SCHEMA_VERSIONS:
        version = run.get("schema_version") if isinstance(run, dict) else None
        raise ValueError(
            f"run file {path} has schema_version {version!r}: this ppprof reads "
            f"{', '.join(map(str, READABLE_SCHEMA_VERSIONS))}"
        )
    if not isinstance(run.get("config"), dict):
        raise ValueError(f"run file {path} lacks its 'config' object: regenerate it with `ppprof profile`")
    if run["schema_version"] < 3:  # written once, at the end of a run that completed
        run.setdefault("status", COMPLETE)
    if not isinstance(run.get("status"), str):
        raise ValueError(f"run file {path} has status {run.get('status')!r}: regenerate it with `ppprof profile`")
    return run


def mark_failed(path: str | Path, reason: str, *, replace_failure: bool = False) -> bool:
    """Set run.json's status to "failed: REASON" where it still says RUNNING (its rank 0 died before it could say
    so), or, with `replace_failure`, where it says another failure (what a rank that died left the others to say);
    everything else in it kept. True when it wrote."""
    try:
        run = read_run_json(path)
    except ValueError:
        return False
    if not (run["status"] == RUNNING or (replace_failure and run["status"].startswith(FAILED))):
        return False
    run["status"] = f"{FAILED}: {reason}"
    atomic_write_json(path, run)
    return True


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

    def document(self) -> dict:
        """run.json's document as last written, as the JSON values read_run gives back, without reading the file:
        the profile's fit reads the record it wrote from here."""
        with self.lock:
            return json.loads(json.dumps(run_document(self.config, **self.fields)))


def lock_owner(folder: str | Path) -> str | None:
    """'pid N on HOST' of the live run that holds `folder`'s lock; None when it is free or its holder died (a lock
    is held while its holder keeps it flock()ed: the kernel lets go of it when the holder dies, however it dies)."""
    path = RunFolder(folder).lock
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _holder(fd)
        except OSError:  # a file system without flock: judge by the pid it names
            return _holder(fd, alive_only=True)
        return None
    finally:
        os.close(fd)


def _holder(fd: int, alive_only: bool = False) -> str | None:
    """'pid N on HOST' that the lock file `fd` names ("a run that is starting" while its holder writes it); with
    `alive_only`, None when that pid is dead on this host."""
    try:
        pid_text, _, host = os.pread(fd, 4096, 0).decode(errors="replace").strip().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return None if alive_only else "a run that is starting"
    if alive_only and host == socket.gethostname():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
    return f"pid {pid} on {host}"


def check_lock(folder: str | Path) -> None:
    """ValueError naming the holder when a live ppprof run holds the folder's lock file."""
    owner = lock_owner(folder)
    if owner is not None:
        raise _in_use(folder, owner)


def _in_use(folder: str | Path, owner: str) -> ValueError:
    return ValueError(
        f"--out {folder} is in use by another ppprof run ({owner}, lock {RunFolder(folder).lock}): "
        "wait for it to end or choose another --out"
    )


_HELD: dict[str, tuple[int, int]] = {}
"""The locks this process holds: the lock's path -> (pid that took it, its open descriptor, kept flock()ed)."""
LOCK_TRIES = 5
"""How often take_lock tries again when the lock's holder released it between take_lock's open and flock."""
CHECK_WAIT_S = 0.002
"""How long take_lock waits, once, before it names a held lock's holder: check_lock holds the lock shared for an
instant."""


def take_lock(folder: str | Path) -> Path:
    """Take the run folder's lock: open (or create) the lock file, flock() it exclusively and keep it open until
    release_lock. One taker wins even where two take over a stale lock at once (the flock is atomic; a stale lock,
    whose holder died, is no longer flocked); ValueError naming the holder when a live run holds it. A symbolic link
    there is refused, not followed. Returns the lock's path."""
    path = RunFolder(folder).lock
    waited = False
    for _ in range(LOCK_TRIES):
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            reason = "is a symbolic link; remove it" if e.errno == errno.ELOOP else e.strerror
            raise OSError(e.errno, reason, str(path)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _holder(fd)
            os.close(fd)
            if not waited:  # a check_lock may hold it shared for an instant
                waited = True
                time.sleep(CHECK_WAIT_S)
                continue
            raise _in_use(folder, owner) from None
        except OSError:  # a file system without flock: take it unless the pid it names is alive
            owner = _holder(fd, alive_only=True)
            if owner is not None:
                os.close(fd)
                raise _in_use(folder, owner) from None
        if not _same_file(fd, path):  # its holder released (unlinked) it between our open and flock: again
            os.close(fd)
            continue
        text = f"{os.getpid()} {socket.gethostname()}\n".encode()
        try:
            os.pwrite(fd, text, 0)
            os.ftruncate(fd, len(text))
        except OSError as e:  # a full disk: leave no lock behind
            path.unlink(missing_ok=True)
            os.close(fd)
            raise OSError(e.errno, e.strerror, str(path)) from None
        _HELD[os.path.abspath(path)] = (os.getpid(), fd)
        return path
    raise OSError(errno.EEXIST, "the lock file keeps being replaced", str(path))


def _same_file(fd: int, path: Path) -> bool:
    try:
        a, b = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def release_lock(folder: str | Path) -> None:
    """Remove the lock file when this process holds it (unlinked before it is let go, so that no taker flocks a
    file that is about to vanish unseen: take_lock checks that the file it locked is still the lock)."""
    path = RunFolder(folder).lock
    pid, fd = _HELD.get(os.path.abspath(path), (None, None))
    if pid != os.getpid():  # not taken here (a forked child sees its parent's table)
        return
    del _HELD[os.path.abspath(path)]
    try:
        if _same_file(fd, path):
            path.unlink()
    except OSError:
        pass
    finally:
        os.close(fd)

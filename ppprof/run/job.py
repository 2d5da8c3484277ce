"""Starting a distributed job once its settings are resolved: under torchrun this process is one rank; otherwise
check what the ranks need once, take the run folder's lock and launch this node's ranks."""

from __future__ import annotations

import ctypes
import functools
import json
import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ppprof.config import ProfileConfig
from ppprof.distributed.launch import Outcome, in_worker, launch, num_nodes
from ppprof.run.prelaunch import check_before_launch, warnings
from ppprof.runfiles import LOCK_HELD_ENV, RUN_DIR_NOTE_ENV, RunFolder, mark_failed, release_lock, take_lock

RESOLVED_CONFIG = "--resolved-config"
"""The hidden flag by which the launcher hands each rank the resolved settings (ppprof.commands.options)."""


@dataclass(frozen=True, slots=True)
class JobFlags:
    """What a command's line says of its job beyond the settings: `resolved`, this process is a rank the launcher
    started with the settings resolved (--resolved-config); `fault`, a deliberate fault (--inject-fault, testing
    only); `overwrite`, --out may hold files; `resume`, finish the run there (--resume); `world_check(world_size)`,
    what depends on the ranks."""

    resolved: bool = False
    fault: str | None = None
    overwrite: bool = False
    resume: bool = False
    world_check: Callable[[int], None] | None = None


def start(command: str, rank_main: Callable, settings, torchrun: dict, flags: JobFlags = JobFlags()) -> int:
    """Run `ppprof COMMAND` as a job: under torchrun this process is one rank (each rank checks the input before it
    joins the group, so each exits 2 alike and none waits); otherwise check once, print the profile settings'
    warnings, take the run folder's lock and launch this node's ranks, each running `ppprof COMMAND
    --resolved-config JSON`. `settings` is the job's config: a ProfileConfig, or a config with its profile settings
    in `profile` (BenchConfig, ServeBenchConfig). Returns the exit code."""
    profile = settings if isinstance(settings, ProfileConfig) else settings.profile
    fault, overwrite, resume = flags.fault, flags.overwrite, flags.resume
    world_check = flags.world_check or (lambda n: None)
    if in_worker():
        if not flags.resolved:
            world_size = int(os.environ["WORLD_SIZE"])
            world_check(world_size)
            local = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
            # Across nodes a rank may start after rank 0 wrote into --out: rank 0 checks it (ppprof.run.profile_job).
            check_before_launch(profile, world_size, local, torchrun, overwrite, resume, folder=world_size == local)
        leave(rank_main(settings, fault))
    world_size = num_nodes(torchrun.get("nnodes")) * profile.parallelism.nproc_per_node
    one_node = world_size == profile.parallelism.nproc_per_node
    world_check(world_size)
    check_before_launch(
        profile, world_size, profile.parallelism.nproc_per_node, torchrun, overwrite, resume, folder=one_node
    )
    print("".join(f"warning: {line}\n" for line in warnings(profile)), end="", file=sys.stderr)
    worker_args = (
        [command, RESOLVED_CONFIG, json.dumps(settings.to_dict())]
        + (["--inject-fault", fault] if fault else [])
        + (["--resume", profile.job.out] if resume else [])
        + (["--overwrite"] if overwrite else [])
    )
    ranks = functools.partial(launch, profile.parallelism.nproc_per_node, torchrun, worker_args, job=command)
    started = time.time()  # a rank log older than this was not written by this launch (a resumed run's)
    if not one_node:  # rank 0 checks and locks the folder for every node
        return record_outcome(profile.job.out, ranks(), started)
    if not profile.job.out:  # rank 0 names a new folder, and tells which
        with tempfile.NamedTemporaryFile("r", prefix="ppprof-run-dir.") as note:
            os.environ[RUN_DIR_NOTE_ENV] = note.name
            outcome = ranks()
            return record_outcome(Path(note.name).read_text().strip() or None, outcome, started)
    created = claim_out(profile.job.out)
    os.environ[LOCK_HELD_ENV] = "1"  # the ranks inherit it: their launcher holds the lock
    try:
        return record_outcome(profile.job.out, ranks(), started)
    finally:
        release_lock(profile.job.out)
        if created:
            remove_if_empty(profile.job.out)


def leave(code: int) -> NoReturn:
    """End a rank that ran its job and left its process group: flush its logs and streams, then exit with `code`
    without the interpreter's finalization. The watchdog's daemon threads and the C++ objects of gloo and of the
    launcher's store are still alive then, and tearing them down at exit can abort the process after its run was
    written (a rank of a CI run died of SIGABRT there)."""
    logging.shutdown()
    try:  # what C and C++ code left in stdio's buffers (NCCL_DEBUG writes to stdout), which os._exit drops
        ctypes.CDLL(None).fflush(None)
    except (OSError, AttributeError):
        pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed, or its reader is gone
            pass
    os._exit(code)


def claim_out(out: str) -> bool:
    """Create --out where needed and take its lock; True when it created the folder. On an error (a full disk, no
    permission) the folder it created is removed again: an exit 2 leaves nothing behind."""
    path = Path(out)
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        take_lock(path)
    except BaseException:
        if created:
            remove_if_empty(path)
        raise
    return created


def remove_if_empty(folder: str | Path) -> None:
    try:
        Path(folder).rmdir()
    except OSError:  # it holds the run's files, or is gone
        pass


def record_outcome(out: str | None, outcome: Outcome, since: float = 0.0) -> int:
    """The launch's exit code, after recording a failure rank 0 could not record (it died) in --out's run.json; a rank
    that died of a signal is the failure's cause, not what the others said after it. A rank that crashed (CRASHES)
    left its reason in its log, where its C++ messages go: its last lines are printed after the launcher's line, where
    this launch (which began at `since`, time.time()) wrote the log."""
    if out and outcome.failure is not None:
        mark_failed(RunFolder(out).run_json, outcome.failure, replace_failure="died of" in outcome.failure)
        for line in last_words(RunFolder(out), outcome.failure, since):
            print(f"error: {line}", file=sys.stderr)
    return outcome.code


CRASHES = ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL")
"""The signals a rank raises on itself (a C++ abort, a bad access): its log says why, unlike a SIGKILL from outside."""
LAST_LINES, LAST_BYTES = 3, 8192
OPENING = re.compile(r"terminate called|Fatal Python error")
"""A line that opens a crash's reason: a C++ abort's, or Python's fatal error (a backtrace may follow it)."""
REASON = re.compile(r"what\(\):|Error")
"""A line of a reason, where no line opens one."""


def last_words(folder: RunFolder, failure: str, since: float = 0.0) -> list[str]:
    """For each rank that `failure` says crashed ("rank 0 died of SIGABRT (pid 1)"), LAST_LINES lines of its log in
    `folder`, as "rank 0's log ends: ...": from the last line of its tail that opens a reason (OPENING, else REASON),
    so that a backtrace's frames after it are left out; else its last lines. None for a rank whose log this node
    lacks, or that was last written before `since`."""
    out = []
    for rank, signal in re.findall(r"rank (\d+) died of (SIG[A-Z]+)", failure):
        path = folder.rank_log(int(rank))
        try:
            if signal not in CRASHES or path.stat().st_mtime < since:
                continue
            with open(path, "rb") as f:
                f.seek(max(0, f.seek(0, os.SEEK_END) - LAST_BYTES))
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        lines = [line.strip()[:300] for line in text.splitlines() if line.strip()]
        first = max(len(lines) - LAST_LINES, 0)
        for pattern in (OPENING, REASON):
            hits = [i for i, line in enumerate(lines) if pattern.search(line)]
            if hits:
                first = hits[-1]
                break
        out.extend(f"rank {rank}'s log ends: {line}" for line in lines[first : first + LAST_LINES])
    return out

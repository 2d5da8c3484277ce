"""Start the ranks of a distributed job through torch's elastic launcher (what torchrun runs), with torchrun's options.

Job-agnostic: the caller gives the arguments each rank runs after `python -m ppprof`."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import signal
import sys
import tempfile
from dataclasses import dataclass

from ppprof.distributed.rendezvous import LOOPBACK, bound_stores, single_node_argv
from ppprof.distributed.stop import EXIT_FAILED, SIGNAL_EXIT, STOP_NOTE_ENV, write_stop_note

# torchrun options `ppprof profile` accepts and passes to the launcher unchanged: (option, takes a value).
TORCHRUN_OPTIONS = (
    ("nnodes", True),
    ("node_rank", True),
    ("rdzv_backend", True),
    ("rdzv_endpoint", True),
    ("rdzv_id", True),
    ("rdzv_conf", True),
    ("standalone", False),
    ("max_restarts", True),
    ("master_addr", True),
    ("master_port", True),
    ("local_addr", True),
    ("log_dir", True),
    ("start_method", True),
)


SHUTDOWN_TIMEOUT_S = 5
"""After forwarding SIGINT/SIGTERM to the ranks, how long the launcher waits before it SIGKILLs one."""


def num_nodes(nnodes: str | None) -> int:
    """--nnodes as a count. Elastic ranges (MIN:MAX) are refused: the pipeline needs a fixed number of stages."""
    if nnodes is None:
        return 1
    try:
        lo, _, hi = str(nnodes).partition(":")
        n = int(lo)
        if hi and int(hi) != n:
            raise ValueError
    except ValueError:
        raise ValueError(
            f"--nnodes {nnodes!r} must be a fixed node count such as 2 (the pipeline has one stage per "
            "rank, so elastic ranges are not supported)"
        ) from None
    if n < 1:
        raise ValueError(f"--nnodes {nnodes} must be >= 1")
    return n


def in_worker() -> bool:
    """True when started by torchrun or torch's elastic launcher (the rank's environment is set)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


SINGLE_NODE_SET = ("standalone", "rdzv_backend", "rdzv_id", "local_addr")
"""The options a single-node run sets itself (ppprof.distributed.rendezvous.single_node_argv)."""


def single_node(torchrun: dict) -> bool:
    """True for a run on this node only: neither --nnodes above 1, nor --rdzv-endpoint, nor --master-port."""
    return not (num_nodes(torchrun.get("nnodes")) > 1 or torchrun.get("rdzv_endpoint") or torchrun.get("master_port"))


def launcher_argv(nproc_per_node: int, torchrun: dict, worker_args: list[str]) -> list[str]:
    """torchrun's argument list for starting `python -m ppprof WORKER_ARGS...` on every rank of this node."""
    argv = ["--nproc-per-node", str(nproc_per_node)]
    single = single_node(torchrun)
    if single:
        argv += single_node_argv()  # --standalone's rendezvous, on loopback
    for name, takes_value in TORCHRUN_OPTIONS:
        value = torchrun.get(name)
        if value is None or value is False or (single and name in SINGLE_NODE_SET):
            continue
        flag = "--" + name.replace("_", "-")
        argv += [flag, str(value)] if takes_value else [flag]
    # Ranks end within a second of SIGINT/SIGTERM (ppprof.distributed.watchdog); a stopped one gets SIGKILL soon after
    # (where this torch's torchrun has the flag: 2.11's has not, and refuses the whole command line).
    if torchrun_takes("--shutdown-timeout"):
        argv += ["--shutdown-timeout", str(SHUTDOWN_TIMEOUT_S)]
    return argv + ["--module", "ppprof", *worker_args]


@functools.cache
def torchrun_takes(flag: str) -> bool:
    """True when this torch's torchrun parses `flag` (a flag that takes a value)."""
    from torch.distributed.run import get_args_parser

    _, unknown = get_args_parser().parse_known_args([flag, "1", "script.py"])
    return not unknown


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a launch ended: the exit code and, where ranks failed, why in a few words ("rank 1 died of SIGKILL")."""

    code: int
    failure: str | None = None


def launch(nproc_per_node: int, torchrun: dict, worker_args: list[str], job: str) -> Outcome:
    """Run `python -m ppprof WORKER_ARGS...` on this node's ranks; returns the exit code (1 when any rank failed,
    said in one line naming a rank that died; 130 / 143 when SIGINT / SIGTERM stopped the job: the launcher
    forwards it to the ranks, which stop within seconds, rank 0 saying in one line what the run folder keeps)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(launcher_argv(nproc_per_node, torchrun, worker_args))
    if "OMP_NUM_THREADS" not in os.environ:  # share the cores among this node's ranks (torchrun would pick 1)
        os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc_per_node))
    quiet_launcher_logs()
    # A single node's stores listen on loopback only; across nodes, the rendezvous store on the interface
    # --rdzv-endpoint / --master-addr names, the one the ranks share on --local-addr's (every interface without it).
    single = single_node(torchrun)
    try:
        with (
            bound_stores(LOOPBACK if single else torchrun.get("local_addr"), single),
            stop_note() as note,
            bounded_close(note),
            cheap_event_names(),
        ):
            run(args)
    except ChildFailedError as e:
        failure = failed_ranks(e.failures)
        print(f"error: the {job} failed: {failure}", file=sys.stderr)
        return Outcome(EXIT_FAILED, failure)
    except SignalException as e:
        return Outcome(SIGNAL_EXIT.get(e.sigval, 128 + int(e.sigval)))
    return Outcome(0)


def failed_ranks(failures: dict) -> str:
    """Which ranks failed, a rank that died of a signal first (the others failed after it: a closed connection),
    from torch's ProcessFailure of each failed rank: "rank 1 died of SIGKILL (pid 123); rank 0 stopped after it".
    Only the failures the launcher saw first (within a second of the first) are causes: torch also lists the ranks
    its own shutdown ended, SIGKILLed SHUTDOWN_TIMEOUT_S later when they took no SIGTERM (a stopped rank)."""
    first = min(getattr(f, "timestamp", 0) for f in failures.values())
    causes = {r: f for r, f in failures.items() if getattr(f, "timestamp", 0) <= first + 1}
    dead = {r: f for r, f in causes.items() if f.exitcode is not None and f.exitcode < 0}
    if not dead:
        return f"rank {', '.join(map(str, sorted(causes)))} failed; the [rank N] lines above say why"
    after = sorted(r for r in failures if r not in dead)
    died = "; ".join(f"rank {r} died of {signal_name(-f.exitcode)} (pid {f.pid})" for r, f in sorted(dead.items()))
    return died + (f"; rank {', '.join(map(str, after))} stopped after it" if after else "")


@contextlib.contextmanager
def stop_note():
    """A file for the launcher's note to this node's ranks on why it stops them (ppprof.distributed.stop), named to
    them in STOP_NOTE_ENV; removed when the launch ends."""
    folder = tempfile.mkdtemp(prefix="ppprof-launch-")
    path, before = os.path.join(folder, "stop"), os.environ.get(STOP_NOTE_ENV)
    os.environ[STOP_NOTE_ENV] = path  # the ranks inherit the launcher's environment
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(STOP_NOTE_ENV, None)
        else:
            os.environ[STOP_NOTE_ENV] = before
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def bounded_close(note: str | None = None):
    """The launcher ends the other ranks within SHUTDOWN_TIMEOUT_S of a failure too, as on a signal: torch's own
    close after a failed rank waits 30 s (PContext.close's default, which --shutdown-timeout does not reach) before it
    SIGKILLs a rank that takes no SIGTERM, so a rank stopped while it started held the run 30 s after it had failed.
    Before it signals a rank, it writes in `note` why: torch closes the ranks inside its `except SignalException`
    where a signal reached the launcher, and outside it after a rank ended first. A rank cannot tell the two from
    what it sees: a forwarded SIGTERM may reach one rank after the other rank has already left."""
    from torch.distributed.elastic.multiprocessing.api import PContext, SignalException

    close = PContext.close

    def bounded(self, death_sig=None, timeout=SHUTDOWN_TIMEOUT_S):
        if note is not None:
            handled = sys.exc_info()[1]
            write_stop_note(note, handled.sigval if isinstance(handled, SignalException) else None)
        return close(self, death_sig, min(timeout, SHUTDOWN_TIMEOUT_S))

    PContext.close = bounded
    try:
        yield
    finally:
        PContext.close = close


@contextlib.contextmanager
def cheap_event_names():
    """torch's dynamic rendezvous names each event it records after the method that recorded it, found through
    inspect.stack(), which reads the source lines of every frame: 9 events, 0.56 s of the launcher's CPU a launch
    before any rank starts (2026-12-05, 2 cores). While open, the same name comes from the frame itself."""
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous
    except ImportError:
        yield
        return
    original = getattr(dynamic_rendezvous, "get_method_name", None)

    def method_name(depth: int = 2) -> str:
        try:
            return sys._getframe(depth).f_code.co_name  # inspect.stack()[depth]: frame 0 is this function's
        except ValueError:
            return "no_method_name"

    if original is None:
        yield
        return
    dynamic_rendezvous.get_method_name = method_name
    try:
        yield
    finally:
        dynamic_rendezvous.get_method_name = original


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def quiet_launcher_logs() -> None:
    """Only the elastic launcher's errors: its warnings on stopping the ranks ("Closing process ... via signal") would
    bury the one line that says what happened."""
    import torch.distributed.elastic  # noqa: F401  (creates its loggers)

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed.elastic") or name.startswith("torch.distributed.run"):
            logging.getLogger(name).setLevel(logging.ERROR)
    # its "failed (exitcode: -9) local_rank: 1 ..." says again, at length, what failed_ranks says in one line
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").setLevel(logging.CRITICAL)

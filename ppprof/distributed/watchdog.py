"""Bounded time for one rank: a monitor thread puts a deadline on every wait of this rank on another (a transfer or a
collective), ends the rank in one line when a rank does not answer, on SIGINT/SIGTERM, and when its launcher dies.

The deadline is the larger of --timeout and REQUEST_FACTOR x the slowest request measured so far. A heartbeat thread
publishes, through the launcher's store, that this rank is alive and what it waits on, so that a rank that is stopped
(SIGSTOP, a paused VM, a dead host) is told apart from one that is busy (a cold first forward, a JIT compile): in a
phase that has measured a request (the warm-up, the probes, the bench's prompts: every rank runs the same requests),
a wait past the deadline ends the run whatever the heartbeats say (a stuck kernel beats but never answers); in the
others (building a stage, fitting) it ends the run at the deadline only when the rank waited on stopped beating, and
otherwise after LENIENT_FACTOR deadlines (at least LENIENT_MIN_S)."""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ppprof.distributed.board import Board
from ppprof.distributed.procfs import local_rank_gone, stopped_ranks
from ppprof.distributed.rankstate import WORKING, RankState, culprit
from ppprof.distributed.stop import EXIT_FAILED, INTERRUPTED, SIGNAL_EXIT, Stop, StopCallback, read_stop_note

DEFAULT_TIMEOUT_S = 60.0
"""--timeout: the least time any wait is given."""
REQUEST_FACTOR = 20
"""A wait may take this many times the slowest request (or bench prompt) measured so far."""
LENIENT_FACTOR = 10
LENIENT_MIN_S = 300.0
"""In a phase that has measured no request, a rank that still beats is given LENIENT_FACTOR deadlines, at least
LENIENT_MIN_S: a fit or a large stage's build takes what it takes, whatever --timeout says."""
HEARTBEAT_S = 0.5
STALE_S = 2.0
"""A rank whose heartbeat has not changed for this long does not answer."""
TICK_S = 0.1
SIGTERM_GRACE_S = 3.0
"""How long a SIGTERM that came after a rank of this node was gone waits for the main thread to report its failed
wait (which names the rank) before the rank ends as a failure on its own words; the launcher SIGKILLs a rank only
5 s after its SIGTERM."""


class Watchdog:
    """The deadlines, heartbeat, signals and parent watch of one rank. `waiting(peer)` around every blocking wait,
    `measured()` after every request, `phase` names what the run does (a new phase has measured nothing yet)."""

    def __init__(
        self, rank: int, world_size: int, timeout_s: float = DEFAULT_TIMEOUT_S, lenient_min_s: float = LENIENT_MIN_S
    ) -> None:
        self.rank, self.world_size, self.timeout_s = rank, world_size, float(timeout_s)
        self.board: Board | None = None  # attach() gives it, once the launcher's store answers
        self.lenient_min_s = lenient_min_s
        self._phase = "start"
        self._phase_measured = False
        self.slowest_s = 0.0
        self.on_stop: list[StopCallback] = []
        self._wait: tuple[float, int] | None = None
        self._beat = 0
        self._host = socket.gethostname()
        self._parent = os.getppid()
        self._signum: int | None = None
        self._signal_at = 0.0
        self._after_death = False  # the SIGTERM came after a rank of this node was gone: the launcher's, not a user's
        self._broken: int | None = None
        self._failing = False
        self._signal_fd: int | None = None
        self._exit_lock = threading.Lock()
        self._watched: tuple[float, int] | None = None  # the wait observed
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (heartbeat, when it last changed), in that wait
        self._states: dict[int, RankState] = {}
        self._states_read = False  # the heartbeat thread has read the others' states in the wait observed
        self._watch = threading.Event()  # a wait nears its deadline: the heartbeat thread reads the others
        self._closing = threading.Event()
        self._heartbeat_thread: threading.Thread | None = None

    # --- what the main thread calls -------------------------------------------------------------------------------

    @property
    def deadline_s(self) -> float:
        return max(self.timeout_s, REQUEST_FACTOR * self.slowest_s)

    @property
    def phase(self) -> str:
        return self._phase

    @phase.setter
    def phase(self, what: str) -> None:
        self._phase, self._phase_measured = what, False

    def measured(self, seconds: float) -> None:
        """One request (or bench prompt) took `seconds` on this rank: later waits may take REQUEST_FACTOR times it,
        and in this phase, every rank running the same requests, a wait past the deadline is a fault."""
        self.slowest_s = max(self.slowest_s, seconds)
        self._phase_measured = True

    @contextmanager
    def waiting(self, peer: int) -> Iterator[None]:
        """Inside: this rank waits on `peer` (EVERY_RANK: a collective)."""
        previous, self._wait = self._wait, (time.monotonic(), peer)
        try:
            yield
        except Exception:
            self._broken = peer  # the wait failed (a rank that died closes its connections)
            raise
        finally:
            self._wait = previous

    def start(self) -> Watchdog:
        """Take SIGINT and SIGTERM (from the main thread) and start the monitor and heartbeat threads."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        for sig in SIGNAL_EXIT:
            signal.signal(sig, self._note_signal)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        self._signal_fd = read_fd
        threading.Thread(target=self._monitor, name="ppprof-watchdog", daemon=True).start()
        return self

    def attach(self, store) -> None:
        """Publish this rank's heartbeat through the launcher's `store` (ppprof.distributed.board) and read the
        others'."""
        self.board = Board(store, self.rank, self.world_size)
        self._heartbeat_thread = threading.Thread(target=self._heartbeat, name="ppprof-heartbeat", daemon=True)
        self._heartbeat_thread.start()

    def close(self) -> None:
        """Stop the heartbeat and let go of the store before the process leaves: a store call still in flight while
        the interpreter finalizes would abort the process ("terminate called without an active exception")."""
        self._closing.set()
        if self._heartbeat_thread is not None:
            self._heartbeat_thread.join(timeout=10)
        self.board = None

    def failed(self, message: str) -> None:
        """The main thread met an error it cannot agree on (a broken transfer): end this rank in one line, naming the
        agreed verdict where another rank found one, the signal that stopped the run (SIGINT, or one that came before
        the error: the ranks it reached first broke the transfer), or the rank whose connection broke. Does not
        return."""
        error_at, self._failing = time.monotonic(), True
        time.sleep(2 * TICK_S)  # a SIGINT forwarded to every rank breaks the transfers of the others too
        note = read_stop_note()
        if note is not None and note[0] == INTERRUPTED:  # the launcher's SIGTERM reached another rank first
            self._stop_on_signal(note[1])
        if self._signum is not None and (
            self._signum == signal.SIGINT or (self._signal_at <= error_at and not self._after_death)
        ):
            self._stop_on_signal(self._signum)
        verdict = self._read_verdict()
        if verdict is None and self._broken is not None and self._broken >= 0:
            message = f"the connection to rank {self._broken} broke during {self.phase}: {message}"
        self._exit(verdict or message, EXIT_FAILED)

    def publish(self, message: str) -> None:
        """A failure this rank met alone while others may wait on it inside a collective they cannot leave (a TP
        rank whose forward raised while its TP peers wait in the layer's all-reduce): `message` becomes the run's
        verdict, unless another came first, so that every rank, at its deadline, ends with it rather than with
        "rank N did not answer"."""
        self._publish_verdict(message)

    # --- the threads ----------------------------------------------------------------------------------------------

    def _note_signal(self, signum, frame) -> None:
        if self._signum is None:
            at = time.monotonic()
            # Judged when the signal is noted: the launcher stops the other ranks only after it saw one end, while a
            # user's SIGTERM reaches every rank at once, before any of them is gone. Judged before the signal is
            # set: the monitor thread acts on a set signal at once, and would take it for a user's meanwhile.
            self._after_death = signum == signal.SIGTERM and self._launcher_stops_a_failure()
            self._signal_at, self._signum = at, signum
        # the monitor thread acts: the main thread may be inside a wait that ignores signals

    def _launcher_stops_a_failure(self) -> bool:
        """Whether a SIGTERM is the launcher ending this rank after another ended: its note says so (ppprof's
        launcher writes one before it signals), else (plain torchrun) a rank of this node is gone."""
        note = read_stop_note()
        return local_rank_gone(self._parent) if note is None else note[0] != INTERRUPTED

    def _monitor(self) -> None:
        while True:
            ready, _, _ = select.select([self._signal_fd], [], [], TICK_S)
            if ready:
                for signum in os.read(self._signal_fd, 64):
                    if signum in SIGNAL_EXIT.keys():
                        self._note_signal(signum, None)
            # A SIGTERM that finds the main thread failing is most often the launcher stopping the ranks after one
            # died: the main thread tells which (failed()).
            # The launcher's SIGTERM can also come before the main thread's wait on the dead rank has failed (it
            # may be inside a forward): a SIGTERM that came after a rank of this node was gone waits up to
            # SIGTERM_GRACE_S for that failure, then ends the rank as a failure, never as an interrupt.
            if self._signum is not None and not (self._failing and self._signum != signal.SIGINT):
                if not self._after_death:
                    self._stop_on_signal(self._signum)
                elif time.monotonic() - self._signal_at >= SIGTERM_GRACE_S:
                    self._exit(
                        self._read_verdict()
                        or f"stopped by the launcher during {self.phase}: a rank of this node ended first",
                        EXIT_FAILED,
                    )
            if os.getppid() != self._parent:
                self._stop_on_signal(signal.SIGTERM)
            self._check_wait()

    def _check_wait(self) -> None:
        wait = self._wait
        if wait != self._watched:  # another wait: its observations start afresh
            self._watch.clear()
            self._watched, self._seen, self._states, self._states_read = wait, {}, {}, False
        if wait is None:
            return
        start, peer = wait
        now, deadline = time.monotonic(), self.deadline_s
        elapsed = now - start
        if elapsed < deadline - STALE_S:
            return
        self._watch.set()
        for r, state in self._states.items():
            if r not in self._seen or self._seen[r][0] != state.beat:
                self._seen[r] = (state.beat, now)
        if elapsed < deadline:
            return
        others = [r for r in range(self.world_size) if r != self.rank]
        unstarted = self._unstarted(others)
        if unstarted:
            who, pid = min(unstarted.items())
            # The launcher stops it (SIGKILL: a stopped process takes nothing else) once this rank has ended.
            self._exit(
                self._publish_verdict(
                    f"rank {who} did not start within {round(deadline, 1):g} s: its process (pid {pid}) is stopped"
                ),
                EXIT_FAILED,
            )
        stale = {r for r in others if r in self._seen and now - self._seen[r][1] >= STALE_S}
        strict = self._phase_measured
        lenient = max(LENIENT_FACTOR * deadline, self.lenient_min_s)
        if not (stale or strict or elapsed >= lenient):
            return
        who = culprit(self.rank, peer, self.world_size, dict(self._states), stale)
        within = deadline if (stale or strict) else lenient
        message = f"rank {who} did not answer within {round(within, 1):g} s during {self.phase}"
        verdict = self._publish_verdict(message)
        state = self._states.get(who)
        if state is not None and state.host == self._host:
            # A stopped rank takes SIGTERM only once continued (the launcher would wait 30 s, then SIGKILL it); so
            # continued, it records the verdict and ends like the others.
            for sig in (signal.SIGTERM, signal.SIGCONT):
                try:
                    os.kill(state.pid, sig)
                except OSError:
                    pass
        self._exit(verdict, EXIT_FAILED)

    def _unstarted(self, others: list[int]) -> dict[int, int]:
        """{rank: pid} of the ranks of this node that never published a heartbeat and whose process is stopped: they
        were stopped while they started (before their watchdog ran). One that starts slowly (a loaded host) still
        runs, and is judged as any rank that beats."""
        if self.board is None or not self._states_read:
            return {}
        stopped = stopped_ranks(self._parent)
        return {r: stopped[r] for r in others if r not in self._states and r in stopped}

    def _heartbeat(self) -> None:
        while not self._closing.is_set():
            self._beat += 1
            wait = self._wait
            state = RankState(self._beat, self._host, os.getpid(), WORKING if wait is None else wait[1], self.phase)
            try:
                self.board.post_state(state)
                if self._watch.is_set():
                    self._states, self._states_read = self.board.states(), True
            except Exception:  # the store went away with the launcher: the parent watch ends this rank
                pass
            self._closing.wait(HEARTBEAT_S)

    # --- ending the rank ------------------------------------------------------------------------------------------

    def _publish_verdict(self, message: str) -> str:
        """The first verdict any rank published (this one's when it is the first), so that every rank says the same."""
        board = self.board
        return message if board is None else board.publish_verdict(message)

    def _read_verdict(self) -> str | None:
        board = self.board
        return None if board is None else board.verdict()

    def _stop_on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        verdict = self._read_verdict()  # the launcher stops the others when one rank found a rank not answering
        if verdict:
            self._exit(verdict, EXIT_FAILED)
        self._exit(None, SIGNAL_EXIT[signal.Signals(signum)], signal_name=name)

    def _exit(self, message: str | None, code: int, signal_name: str | None = None) -> None:
        """Tell the callbacks (rank 0 records the run's status), print the one line, leave now: no destroy of the
        process group, which would wait on the rank that does not answer."""
        if not self._exit_lock.acquire(blocking=False):
            time.sleep(3600)  # another thread is ending this rank
        stop = Stop(message)
        for callback in self.on_stop:
            try:
                callback(stop, signal_name)
            except Exception as e:  # the line below still tells what happened
                print(f"error: [rank {self.rank}] could not record the run's status: {e}", file=sys.stderr)
        if message is not None:
            print(f"error: [rank {self.rank}] {message}", file=sys.stderr, flush=True)
        sys.stderr.flush()
        os._exit(code)

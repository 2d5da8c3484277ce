"""Taking a new policy while serving: a watch on the policy file that notices it changed (a stat at most every
`interval_s`, off the per-chunk path), reads it once, checks it as at start-up, and votes; `decide` turns every rank's
vote into one decision that every rank reaches alike, so that they switch at the same batch or none does. Pure: the
ranks' votes come from the caller's gather (SGLang's world group, ppprof.distributed's pipe)."""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ppprof.io import MAX_INPUT_BYTES

CHECK_ENV = "PPPROF_POLICY_CHECK_S"
"""Seconds between two looks at the policy file (its stat; it is read only when that changed)."""
DEFAULT_CHECK_S = 5.0
MAX_CHECK_S = 3600.0
NO_VOTE = (None, None)
"""A rank that noticed no new file: (sha256, problem) both None."""


def check_interval_s(environ=os.environ) -> tuple[float, str | None]:
    """CHECK_ENV's seconds (DEFAULT_CHECK_S where unset), and the one line where its value was not taken."""
    text = environ.get(CHECK_ENV)
    if text is None or not text.strip():
        return DEFAULT_CHECK_S, None
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value <= MAX_CHECK_S:
        return DEFAULT_CHECK_S, (
            f"{CHECK_ENV}={text!r} is not a number of seconds in [0, {MAX_CHECK_S:g}]: checking every "
            f"{DEFAULT_CHECK_S:g} s"
        )
    return value, None


@dataclass(frozen=True, slots=True)
class Decision:
    """What the ranks' votes decide, the same on every rank: `switch` to `digest`, `refuse` it (it failed a check on
    some rank: it never replaces the policy in use), `wait` (the ranks read different files, or not all have read the
    new one yet: the old policy stays), or `none` (no rank noticed a change). `line`: what to log, None where
    nothing needs saying (a disagreement already said)."""

    action: str
    digest: str | None = None
    line: str | None = None


class PolicyWatch:
    """One rank's watch on its policy file. `poll()` looks (at most every `interval_s`); `vote()` is this rank's
    (sha256, problem) of a new file, NO_VOTE without one; `decide(votes)` is every rank's decision; `take()` the new
    policy after a `switch`. `check(text) -> (policy, problem)` checks a file's text as at start-up (and against
    this server)."""

    def __init__(
        self,
        path: str,
        digest: str,
        check: Callable[[str], tuple[object | None, str | None]],
        interval_s: float = DEFAULT_CHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path, self.digest, self.check, self.interval_s, self.clock = path, digest, check, interval_s, clock
        self.looked_at = clock()
        self.stat: tuple | None = None  # the first look reads the file: a change since start-up is seen
        self.candidate: tuple[str, object | None, str | None] | None = None
        """(sha256, policy, problem) of the new file this rank read; None: none new."""
        self.voted: tuple[str, object | None, str | None] | None = None
        """The candidate this rank last voted for: the one a switch takes, though a look since found another."""
        self.refused: set[str] = set()
        self.said: set[tuple] = set()
        self.lock = threading.Lock()
        """poll() may run on a thread of its own (the SGLang sizer's), vote, decide and take on the scheduler's."""

    def _stat(self) -> tuple | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def poll(self, force: bool = False) -> bool:
        """Look at the file where `interval_s` has passed (or `force`): read it when its stat changed, check it when
        its sha256 is new. True where this rank's vote changed. Never raises."""
        with self.lock:
            return self._poll(force)

    def _poll(self, force: bool) -> bool:
        now = self.clock()
        if not force and now - self.looked_at < self.interval_s:
            return False
        self.looked_at = now
        stat = self._stat()
        if stat == self.stat:
            return False
        self.stat = stat
        try:
            with open(self.path, "rb") as f:
                data = f.read(MAX_INPUT_BYTES + 1)
        except OSError:  # missing or unreadable for now (being replaced): no vote; a later look reads it
            before, self.candidate = self.candidate, None
            return before is not None
        digest = hashlib.sha256(data).hexdigest()
        if digest == self.digest or digest in self.refused:
            before, self.candidate = self.candidate, None
            return before is not None
        if self.candidate is not None and self.candidate[0] == digest:
            return False
        try:
            if len(data) > MAX_INPUT_BYTES:
                raise ValueError(f"policy file {self.path} holds more than {MAX_INPUT_BYTES // 2**20} MiB")
            policy, problem = self.check(data.decode("utf-8"))
        except UnicodeDecodeError as e:
            policy, problem = None, f"policy file {self.path} is not UTF-8 text (byte {e.start})"
        except Exception as e:  # noqa: BLE001 - the check's one line, or the error named
            policy, problem = None, str(e) if isinstance(e, ValueError) else repr(e)
        self.candidate = (digest, policy if problem is None else None, problem)
        return True

    def vote(self) -> tuple[str | None, str | None]:
        with self.lock:
            self.voted = self.candidate
            return NO_VOTE if self.voted is None else (self.voted[0], self.voted[2])

    def decide(self, votes: list[tuple[str | None, str | None]]) -> Decision:
        """Every rank's decision from every rank's vote (in rank order): the same votes give the same decision on
        every rank, and each rank's watch keeps the same record of refused files."""
        with self.lock:
            return self._decide(votes)

    def _decide(self, votes: list[tuple[str | None, str | None]]) -> Decision:
        digests = [d for d, _ in votes]
        if all(d is None for d in digests):
            return Decision("none")
        bad = [(rank, d, problem) for rank, (d, problem) in enumerate(votes) if problem is not None]
        if bad:
            rank, digest, problem = bad[0]
            self.refused.add(digest)
            if self.candidate is not None and self.candidate[0] == digest:
                self.candidate = None
            where = f"rank {rank}: " if len(votes) > 1 else ""
            return Decision(
                "refuse",
                digest,
                f"policy file {self.path} (sha256 {digest[:12]}) refused, the policy in use (sha256 "
                f"{self.digest[:12]}) kept: {where}{problem}",
            )
        if len(set(digests)) == 1:
            return Decision("switch", digests[0], None)
        key = tuple(digests)
        line = None
        if key not in self.said:
            self.said.add(key)
            by_rank = ", ".join(f"rank {r} {d[:12] if d else 'not read yet'}" for r, d in enumerate(digests))
            line = (
                f"policy file {self.path}: the ranks do not agree on its sha256 ({by_rank}): the policy in use "
                f"(sha256 {self.digest[:12]}) kept until every rank reads the same file"
            )
        return Decision("wait", None, line)

    def take(self, decision: Decision) -> object:
        """After a `switch` decision: the new policy (the one this rank voted for), now the one in use."""
        with self.lock:
            digest, policy, _ = self.voted
            if decision.action != "switch" or digest != decision.digest:
                raise RuntimeError(f"take({decision}) after a vote for {digest}: call it after a switch")
            self.digest = digest
            if self.candidate is not None and self.candidate[0] == digest:
                self.candidate = None
            return policy

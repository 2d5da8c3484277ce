"""How a rank stops, in this package's own words: the exit codes, and the Stop that the watchdog tells its callbacks
(a signal interrupted the run, or it failed, and why). Pure: no torch. What a run folder records of it is the
caller's (ppprof.run maps a Stop onto run.json's status)."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

EXIT_FAILED = 1
SIGNAL_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143}
INTERRUPTED, FAILED = "interrupted", "failed"
"""A Stop in words: "interrupted", or "failed: <reason>"."""


@dataclass(frozen=True, slots=True)
class Stop:
    """Why a rank ends before its job does: `reason`, the one line it prints, where it failed; None where a signal
    (or its launcher's death) interrupted it."""

    reason: str | None = None

    @property
    def interrupted(self) -> bool:
        return self.reason is None

    def __str__(self) -> str:
        return INTERRUPTED if self.reason is None else f"{FAILED}: {self.reason}"


StopCallback = Callable[[Stop, str | None], None]
"""Called before the rank exits: (the Stop, the signal's name or None)."""


STOP_NOTE_ENV = "PPPROF_STOP_NOTE"
"""The file in which ppprof's launcher says, before it stops this node's ranks, why: "interrupted SIGTERM" (a signal
reached the launcher: every rank was interrupted) or "failed" (a rank ended first). A rank reads it on a SIGTERM, and
when a transfer breaks, rather than guess from which ranks are still alive; plain torchrun sets none."""


def write_stop_note(path: str, signum: int | None) -> None:
    """Before the launcher signals the ranks: `signum` the signal that reached it, None where a rank ended first."""
    text = FAILED if signum is None else f"{INTERRUPTED} {signal.Signals(signum).name}"
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)  # whole or not at all: a rank may read it at any moment


def read_stop_note() -> tuple[str, int | None] | None:
    """(INTERRUPTED, the signal) or (FAILED, None) where the launcher wrote its note; None where there is none
    (plain torchrun, or a signal sent to the rank itself)."""
    path = os.environ.get(STOP_NOTE_ENV)
    if not path:
        return None
    try:
        with open(path) as f:
            word, _, name = f.read().strip().partition(" ")
    except OSError:
        return None
    if word == INTERRUPTED and name in signal.Signals.__members__:
        return INTERRUPTED, int(signal.Signals[name])
    return (FAILED, None) if word == FAILED else None

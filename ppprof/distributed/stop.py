"""How a rank stops, in this package's own words: the exit codes, and the Stop that the watchdog tells its callbacks
(a signal interrupted the run, or it failed, and why). Pure: no torch. What a run folder records of it is the
caller's (ppprof.run maps a Stop onto run.json's status)."""

from __future__ import annotations

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

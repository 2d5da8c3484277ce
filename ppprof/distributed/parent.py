"""A rank goes when its launcher does: Linux's parent-death signal (the monitor thread watches the parent too)."""

from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Ask Linux to send this process SIGTERM when its parent (the launcher) dies; the monitor thread also watches
    the parent, so that elsewhere, or where the parent died before this call, the rank goes too."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        except (OSError, AttributeError):
            pass

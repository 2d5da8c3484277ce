"""Agreement between ranks before going on: every rank says whether it failed, and if any did, every rank stops with
the same message. A failed rank that simply left would leave the others waiting in their next collective."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ppprof.distributed.pipe import Pipe


class RunError(RuntimeError):
    """The run cannot go on; raised on every rank with the same message."""


def stop_if_any_failed(pipe: Pipe, error: str | None) -> None:
    """Every rank says whether it failed; if any did, every rank raises RunError with all the messages."""
    if pipe.any_true(error is not None):
        errors = [f"rank {r}: {e}" for r, e in enumerate(pipe.all_gather_ranks(error)) if e is not None]
        raise RunError("; ".join(errors) or "a rank failed without a message")


@contextmanager
def agreed(pipe: Pipe, what: str) -> Iterator[None]:
    """`with agreed(pipe, "build the stage"): ...` runs the body on every rank, then agrees: an exception in the body
    on any rank becomes RunError on every rank ("rank N: <what>: <Type>: <message>"). A RunError raised inside the
    body was already agreed on and passes through. Every phase of a distributed job runs inside one."""
    error = None
    try:
        yield
    except RunError:
        raise
    except Exception as e:
        error = f"{what}: {type(e).__name__}: {e}"
    stop_if_any_failed(pipe, error)

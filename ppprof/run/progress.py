"""Rank 0's progress bar (tqdm) on a terminal: how far the run is, its elapsed and remaining time, and what the run
reports as it goes (the profile's current decision). Never drawn where stderr is not a terminal (CI, a file, a pipe:
the log's plain lines say the same), nor on another rank. While it is drawn, the log's console lines go above it."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm


@contextlib.contextmanager
def progress(rank: int, total: int, desc: str, unit: str) -> Iterator[tqdm | None]:
    """A bar of `total` `unit`s on rank 0's terminal, or None (another rank, or stderr not a terminal)."""
    if rank != 0:
        yield None
        return
    bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, disable=None, dynamic_ncols=True)
    if bar.disable:
        yield None
        return
    try:
        with logging_redirect_tqdm(loggers=[logging.getLogger("ppprof")], tqdm_class=tqdm):
            yield bar
    finally:
        bar.close()

"""The forward trace's writer: the serving loop hands each forward over without waiting (a bounded queue, put without
blocking); a thread of its own turns them into lines. Bounded: at most `max_records` forwards, the rest counted as
dropped, as are those that find the queue full. A trace that cannot be written turns itself off with one log line;
the loop goes on. Pure: no torch (a CUDA forward's time comes as a callable the thread calls, e.g. reading a pair of
CUDA events, so the loop never waits for the device)."""

from __future__ import annotations

import json
import logging
import math
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path

from ppprof.forwards.format import end, forward

log = logging.getLogger("ppprof")
QUEUE_SIZE = 4096
"""Forwards handed over and not yet written; one more finds the queue full and is dropped, never waited for."""
DEFAULT_MAX_RECORDS = 1_000_000
"""A trace's cap of forwards (about 100 MB): every one past it is dropped and counted."""
FLUSH_EVERY = 256
"""Lines the thread writes between flushes."""
_STOP = object()


class ForwardTraceWriter:
    """`w = ForwardTraceWriter(path, header)`; `w.record(...)` from the serving loop; `w.close()` at the end. The
    file must not exist (nothing is overwritten). Never raises after construction: a failure turns it off."""

    def __init__(self, path: str | os.PathLike, head: dict, max_records: int = DEFAULT_MAX_RECORDS) -> None:
        self.path, self.max_records = Path(path), max_records
        self.accepted = self.dropped = self.written = 0
        self.off = False
        self._queue: queue.Queue = queue.Queue(QUEUE_SIZE)
        self._file = None
        self._thread: threading.Thread | None = None
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
            self._file = os.fdopen(fd, "w", encoding="utf-8")
            self._file.write(json.dumps(head | {"max_records": max_records}) + "\n")
            self._file.flush()
        except OSError as e:
            self._turn_off(e)
            return
        self._thread = threading.Thread(target=self._run, name="ppprof-forward-trace", daemon=True)
        self._thread.start()

    def record(self, stage: int, tp_rank: int, pieces, latency_ms: float | Callable[[], float], time_s: float) -> None:
        """Hand one forward over: its pieces ((prefix_len, chunk_size) pairs), its time in ms (or a callable giving
        it, called later by the writer's thread) and when it started (Unix seconds). Never blocks, never raises."""
        if self.off:
            return
        if self.accepted >= self.max_records:
            self.dropped += 1
            return
        try:
            self._queue.put_nowait((stage, tp_rank, tuple(pieces), latency_ms, time_s))
            self.accepted += 1
        except queue.Full:
            self.dropped += 1

    def close(self) -> None:
        """Write what is queued and the end record (the forwards written and dropped), then close the file."""
        if self._thread is not None:
            self._queue.put(_STOP)
            self._thread.join()
            self._thread = None
        if self._file is None:
            return
        try:
            if not self.off:
                self._file.write(json.dumps(end(self.written, self.dropped + self.accepted - self.written)) + "\n")
            self._file.close()
        except OSError as e:
            self._turn_off(e)
        self._file = None

    def _run(self) -> None:
        since_flush = 0
        while (item := self._queue.get()) is not _STOP:
            if self.off:
                continue
            stage, tp_rank, pieces, latency, time_s = item
            try:
                ms = float(latency() if callable(latency) else latency)
            except Exception as e:  # a device that failed the forward: that forward has no time
                log.debug("forward trace: no time for a forward of stage %s: %s", stage, e)
                continue
            if not math.isfinite(ms) or ms <= 0:
                continue
            try:
                self._file.write(json.dumps(forward(stage, tp_rank, pieces, round(ms, 6), round(time_s, 6))) + "\n")
                self.written += 1
                since_flush += 1
                if since_flush >= FLUSH_EVERY:
                    self._file.flush()
                    since_flush = 0
            except OSError as e:
                self._turn_off(e)
        if not self.off and self._file is not None:
            try:
                self._file.flush()
            except OSError as e:
                self._turn_off(e)

    def _turn_off(self, error: OSError) -> None:
        if not self.off:
            self.off = True
            log.warning(
                "forward trace %s cannot be written (%s): tracing is off, serving goes on",
                self.path,
                error.strerror or error,
            )

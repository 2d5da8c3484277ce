"""Reading forward traces, bounded: a file past MAX_TRACE_BYTES, a line past MAX_LINE_BYTES or more than MAX_RECORDS
forwards in all is refused before it fills memory; every record is checked (ppprof.forwards.format); traces of two
servers or models are never read as one. Bad input: ValueError, one line naming the file, the line and the fix.
Pure: no torch."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ppprof.forwards.format import END, FORMAT, FORWARD, HEADER, IDENTITY, forward_problem, header_problem
from ppprof.io import special_kind

MAX_TRACE_BYTES = 2**30
"""The largest trace read (about 10^7 forwards): the writer's default cap makes about 100 MB."""
MAX_LINE_BYTES = 2**20
MAX_RECORDS = 4_000_000
"""Forwards read from all the traces of one command together."""
WRITE_FIX = "write it with `ppprof serve-bench --forward-trace` or a server's trace hook"


@dataclass(slots=True)
class Forwards:
    """The forwards of one or more traces of one server and model, in file order: per forward its stage, TP rank,
    pieces ((prefix_len, chunk_size) pairs), time (ms) and start (Unix seconds)."""

    header: dict
    stage: list[int] = field(default_factory=list)
    tp_rank: list[int] = field(default_factory=list)
    pieces: list[tuple[tuple[int, int], ...]] = field(default_factory=list)
    latency_ms: list[float] = field(default_factory=list)
    time_s: list[float] = field(default_factory=list)
    files: list[dict] = field(default_factory=list)
    """Per trace: its path, sha256, forwards read and forwards its writer dropped (its end records)."""

    def __len__(self) -> int:
        return len(self.latency_ms)

    @property
    def dropped_by_writer(self) -> int:
        return sum(f["dropped_by_writer"] for f in self.files)

    @property
    def time_span_s(self) -> tuple[float, float]:
        return (min(self.time_s), max(self.time_s))


def identity(head: dict) -> dict:
    return {k: head.get(k) for k in IDENTITY}


def differences(a: dict, b: dict) -> str:
    """The identity fields where two headers differ, as `field a != b`."""
    return ", ".join(f"{k} {a.get(k)!r} != {b.get(k)!r}" for k in IDENTITY if a.get(k) != b.get(k))


def read_forwards(paths) -> Forwards:
    """The forwards of every trace in `paths`, which must all be of one server and model (IDENTITY)."""
    out: Forwards | None = None
    first_path = None
    for path in map(Path, paths):
        out = read_one(path, out, first_path)
        first_path = first_path or path
    if out is None:
        raise ValueError(f"no forward trace given: {WRITE_FIX}")
    return out


def read_one(path: Path, out: Forwards | None, first_path: Path | None) -> Forwards:
    """Append the forwards of trace `path` to `out` (None: a new Forwards under this trace's header)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise ValueError(f"forward trace {path} cannot be read ({e.strerror}): give the path of a trace") from None
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"forward trace {path} is {special_kind(mode)}, not a file: {WRITE_FIX}")
        size = os.fstat(fd).st_size
        if size > MAX_TRACE_BYTES:
            raise ValueError(
                f"forward trace {path} holds {size / 2**30:.3g} GiB, more than the {MAX_TRACE_BYTES // 2**30} GiB "
                "read: trace with a smaller cap (the writer's max_records) or split it by time"
            )
        if size == 0:
            raise ValueError(f"forward trace {path} is empty: {WRITE_FIX}")
        return read_lines(f, path, out, first_path)


def read_lines(f, path: Path, out: Forwards | None, first_path: Path | None) -> Forwards:
    digest, head, read, dropped, line_no = hashlib.sha256(), None, 0, 0, 0
    while line := f.readline(MAX_LINE_BYTES + 1):
        line_no += 1
        digest.update(line)
        where = f"forward trace {path} line {line_no}"
        if len(line) > MAX_LINE_BYTES:
            raise ValueError(f"{where} is longer than {MAX_LINE_BYTES // 2**20} MiB: not a trace record; {WRITE_FIX}")
        try:
            data = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            if not line.endswith(b"\n"):
                raise ValueError(
                    f"{where} ends mid-record (the writer stopped while writing it): delete that last line"
                ) from None
            raise ValueError(f"{where} is not a JSON record: {WRITE_FIX}") from None
        kind = data.get("kind") if isinstance(data, dict) else None
        if kind == HEADER:
            problem = header_problem(data)
            if problem:
                raise ValueError(f"{where}: {problem}: {WRITE_FIX}")
            if head is not None and identity(data) != identity(head):
                raise ValueError(
                    f"{where} starts the trace of another server or model ({differences(head, data)}): two "
                    "servers' traces mixed in one file; give each server's trace on its own"
                )
            if out is not None and identity(data) != identity(out.header):
                raise ValueError(
                    f"{where} is the trace of another server or model than {first_path} "
                    f"({differences(out.header, data)}): calibrate with the traces of one server at a time"
                )
            head = data
            out = out or Forwards(data)
        elif head is None:
            raise ValueError(f"{where} is not the header record a trace starts with: {WRITE_FIX}")
        elif kind == FORWARD:
            problem = forward_problem(data, head)
            if problem:
                raise ValueError(f"{where}: {problem}: fix or delete that record")
            if len(out) >= MAX_RECORDS:
                raise ValueError(
                    f"{where} is past the {MAX_RECORDS} forwards read in all: give fewer traces, or trace with a "
                    "smaller cap"
                )
            out.stage.append(data["stage"])
            out.tp_rank.append(data["tp_rank"])
            out.pieces.append(tuple((p, x) for p, x in data["pieces"]))
            out.latency_ms.append(float(data["latency_ms"]))
            out.time_s.append(float(data["time_s"]))
            read += 1
        elif kind == END:
            n = data.get("dropped")
            dropped += n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else 0
        else:
            raise ValueError(f"{where} has kind {kind!r}, not one of {HEADER}, {FORWARD}, {END}: {WRITE_FIX}")
    if not read:
        raise ValueError(f"forward trace {path} holds no forwards (a header alone): serve some requests first")
    out.files.append({"path": str(path), "sha256": digest.hexdigest(), "forwards": read, "dropped_by_writer": dropped})
    return out


def is_trace(path) -> bool:
    """Whether `path` is given as a forward trace: named *.jsonl, or a regular file whose first line names the
    format (so that `ppprof compare POLICY TRACE` tells a trace from a policy or a run folder)."""
    path = Path(path)
    if path.suffix == ".jsonl":
        return True
    try:
        if not path.is_file():
            return False
        with open(path, "rb") as f:
            return FORMAT.encode() in f.readline(4096)
    except OSError:
        return False

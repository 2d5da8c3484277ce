"""The forward trace's format (docs/forwards.md): JSONL, a header record, then one record per forward per stage (and TP
rank), and an end record with the count of records the writer dropped. The record builders and the one check of each
record, shared by the writer and the reader. Pure: no torch."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ppprof.bounds import MAX_STAGES, MAX_TOKENS
from ppprof.checks import is_int, is_number

FORMAT = "ppprof-forward-trace"
VERSION = 1
HEADER, FORWARD, END = "header", "forward", "end"
"""The records' `kind`s."""
IDENTITY = ("model_shape", "pp_size", "tp_size", "device", "dtype", "server", "server_version", "context_len")
"""The header's fields that say which server and model wrote the forwards: traces fitted together agree on every one."""
CLOCKS = ("perf_counter", "cuda_events")
"""How a forward's time was taken: the host clock around the stage's forward (CPU), or CUDA events around it read back
later, off the serving loop."""
MAX_PIECES = 4096
"""The most pieces one forward carries: a server's batch holds at most its running requests."""
MAX_FORWARD_MS = 3.6e6
"""One forward of an hour is no measurement of a prefill."""


@dataclass(frozen=True, slots=True)
class TraceIdentity:
    """Which server and model wrote the forwards: the header's IDENTITY fields, which traces fitted together agree on."""

    model_shape: dict | None
    """The model's shape (provenance.model_shape), None where unknown."""
    pp_size: int
    tp_size: int
    """The pipeline's stages and each stage's TP ranks."""
    device: str
    dtype: str
    """Where the forwards ran, and in which dtype."""
    server: str
    server_version: str
    context_len: int
    """The server that wrote them, its version, and the context length it served."""


def header(identity: TraceIdentity, *, clock: str, max_records: int, started_at: str) -> dict:
    """The header record: what wrote the forwards (IDENTITY), the clock and the writer's cap."""
    return {
        "kind": HEADER,
        "format": FORMAT,
        "version": VERSION,
        **{name: getattr(identity, name) for name in IDENTITY},
        "clock": clock,
        "max_records": max_records,
        "started_at": started_at,
    }


def forward(stage: int, tp_rank: int, pieces, latency_ms: float, time_s: float) -> dict:
    """One forward of one stage's TP rank: its pieces as [prefix_len, chunk_size] pairs in batch order, its time on
    the device's clock (ms) and when it started (Unix seconds)."""
    return {
        "kind": FORWARD,
        "stage": stage,
        "tp_rank": tp_rank,
        "pieces": [[int(p), int(x)] for p, x in pieces],
        "latency_ms": latency_ms,
        "time_s": time_s,
    }


def end(records: int, dropped: int) -> dict:
    """The end record: the forwards written and those dropped (past the cap, or while the queue was full)."""
    return {"kind": END, "records": records, "dropped": dropped}


def header_problem(data: dict) -> str | None:
    """What is wrong with a header record, in words naming the field and its value; None where it is sound."""
    if data.get("format") != FORMAT or data.get("version") != VERSION:
        return f"format {data.get('format')!r} version {data.get('version')!r} is not {FORMAT} version {VERSION}"
    for name, high in (("pp_size", MAX_STAGES), ("tp_size", 1024), ("context_len", MAX_TOKENS)):
        if not is_int(data.get(name)) or not 1 <= data[name] <= high:
            return f"header field {name} is {data.get(name)!r}, not an integer in 1..{high}"
    for name in ("device", "dtype", "server", "server_version"):
        if not isinstance(data.get(name), str) or not data[name]:
            return f"header field {name} is {data.get(name)!r}, not a non-empty string"
    if data.get("clock") not in CLOCKS:
        return f"header field clock is {data.get('clock')!r}, not one of {', '.join(CLOCKS)}"
    if data.get("model_shape") is not None and not isinstance(data["model_shape"], dict):
        return f"header field model_shape is {data['model_shape']!r}, not a mapping or null"
    return None


def forward_problem(data: dict, head: dict) -> str | None:
    """What is wrong with a forward record under its header `head`, in words naming the field and its value; None
    where it is sound."""
    if not is_int(data.get("stage")) or not 0 <= data["stage"] < head["pp_size"]:
        return f"stage {data.get('stage')!r} is not an integer in 0..{head['pp_size'] - 1} (the header's pp_size)"
    if not is_int(data.get("tp_rank")) or not 0 <= data["tp_rank"] < head["tp_size"]:
        return f"tp_rank {data.get('tp_rank')!r} is not an integer in 0..{head['tp_size'] - 1} (the header's tp_size)"
    ms = data.get("latency_ms")
    if not is_number(ms) or not math.isfinite(ms) or not 0 < ms <= MAX_FORWARD_MS:
        return f"latency_ms {ms!r} is not a finite time in (0, {MAX_FORWARD_MS:g}] ms"
    t = data.get("time_s")
    if not is_number(t) or not math.isfinite(t) or t < 0:
        return f"time_s {t!r} is not a finite time >= 0 (Unix seconds)"
    pieces = data.get("pieces")
    if not isinstance(pieces, list) or not 1 <= len(pieces) <= MAX_PIECES:
        return f"pieces is not a list of 1..{MAX_PIECES} [prefix_len, chunk_size] pairs"
    for piece in pieces:
        if not (isinstance(piece, list) and len(piece) == 2 and all(is_int(v) for v in piece)):
            return f"piece {piece!r} is not a [prefix_len, chunk_size] pair of integers"
        prefix_len, chunk_size = piece
        if prefix_len < 0 or chunk_size < 1 or prefix_len + chunk_size > head["context_len"]:
            return (
                f"piece [{prefix_len}, {chunk_size}] reaches token {prefix_len + chunk_size}, beyond the header's "
                f"context_len {head['context_len']} (or a negative prefix or an empty chunk)"
            )
    return None

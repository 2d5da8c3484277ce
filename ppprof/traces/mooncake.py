"""Mooncake's request trace (JSONL), read bounded and checked: one JSON object a line, `{"timestamp": ms,
"input_length": tokens, "output_length": tokens, "hash_ids": [...]}`, each hash id naming one BLOCK_TOKENS-token block
of the input, requests that share a leading run of ids sharing that prefix (SGLang's bench_serving, AIPerf, GuideLLM
and Dynamo's replay read the same format). A part of it is taken (a window of the trace's time, the first N requests),
its clock stretched (time_scale) and its lengths scaled (length_scale, the block with them: a GPU-sized trace on a
small CPU model). Only the prefill is replayed: output_length is checked and kept, the decode belongs to a decode
instance. Bad input: ValueError, one line naming the file, the line and the fix; nothing past the part taken is read.
Pure: no torch."""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ppprof.io import special_kind

BLOCK_TOKENS = 512
"""Tokens a hash id names in Mooncake's traces."""
MAX_REQUESTS = 200_000
"""The most requests one replay takes (the conversation trace has 12,031); a longer part is refused, naming the flags
that take less of it."""
MAX_LINE_BYTES = 2**20
MAX_HASH_IDS = 2**16
FORMAT = '{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [ints]}'


@dataclass(frozen=True, slots=True)
class TraceRequest:
    """One request of a trace as replayed: its arrival (ms after the part's first), its prompt length and the ids of
    its blocks (block_tokens each, the last one partial), all scaled."""

    arrival_ms: float
    prompt_len: int
    blocks: tuple[int, ...]
    output_len: int
    line: int


@dataclass(frozen=True, slots=True)
class Trace:
    """The part of a trace a replay serves."""

    path: str
    requests: tuple[TraceRequest, ...]
    block_tokens: int
    time_scale: float
    length_scale: float
    window_s: tuple[float, float] | None
    lines_read: int

    @property
    def input_tokens(self) -> int:
        return sum(r.prompt_len for r in self.requests)

    def shared_prefix_tokens(self) -> int:
        """Input tokens an earlier request of the part already brought, with a cache that forgets nothing: each
        request's longest leading run of blocks seen before, in blocks, at most its prompt less one token."""
        seen: set[int] = set()
        shared = 0
        for r in self.requests:
            run = 0
            for block in r.blocks:
                if block not in seen:
                    break
                run += 1
            shared += min(run * self.block_tokens, r.prompt_len - 1)
            seen.update(r.blocks)
        return shared

    def to_dict(self) -> dict:
        return {
            "path": self.path,
            "requests": len(self.requests),
            "input_tokens": self.input_tokens,
            "shared_prefix_tokens": self.shared_prefix_tokens(),
            "block_tokens": self.block_tokens,
            "time_scale": self.time_scale,
            "length_scale": self.length_scale,
            "window_s": list(self.window_s) if self.window_s else None,
            "span_s": (self.requests[-1].arrival_ms - self.requests[0].arrival_ms) / 1e3 if self.requests else 0.0,
        }


def parse_window(text: str | None) -> tuple[float, float] | None:
    """--trace-window START:END (seconds of the trace's own clock from its first request) as a pair; ValueError."""
    if text is None:
        return None
    start, sep, end = text.partition(":")
    try:
        window = (float(start), float(end))
    except ValueError:
        window = None
    if not sep or window is None or not all(math.isfinite(x) for x in window) or not 0 <= window[0] < window[1]:
        raise ValueError(f"--trace-window {text!r} is invalid: give START:END in seconds, 0 <= START < END, e.g. 0:300")
    return window


def is_count(value) -> bool:
    return type(value) is int and value >= 0


def record_of(raw: bytes, where: str) -> tuple[float, int, int, list[int]]:
    """One line's (timestamp, input_length, output_length, hash_ids), each checked; ValueError naming `where`."""
    if len(raw) > MAX_LINE_BYTES:
        raise ValueError(f"{where}: longer than {MAX_LINE_BYTES} bytes: one request a line, {FORMAT}")
    try:
        record = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{where}: not JSON ({e.__class__.__name__}): each line is one {FORMAT}") from None
    if not isinstance(record, dict):
        raise ValueError(f"{where}: not a JSON object: each line is one {FORMAT}")
    ts, n, out, ids = (record.get(k) for k in ("timestamp", "input_length", "output_length", "hash_ids"))
    for name, value in (("timestamp", ts), ("input_length", n), ("output_length", out), ("hash_ids", ids)):
        if value is None:
            raise ValueError(f"{where}: no {name}: each line is one {FORMAT}")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
        raise ValueError(f"{where}: timestamp {ts!r} is not a time: give milliseconds >= 0")
    if not is_count(n) or n == 0:
        raise ValueError(f"{where}: input_length {n!r} is not a prompt: give its tokens, at least 1")
    if not is_count(out):
        raise ValueError(f"{where}: output_length {out!r} is not a count: give its tokens, 0 or more")
    if not isinstance(ids, list) or not all(is_count(i) for i in ids) or len(ids) > MAX_HASH_IDS:
        raise ValueError(f"{where}: hash_ids is not a list of block ids (integers >= 0): {FORMAT}")
    if len(ids) > math.ceil(n / BLOCK_TOKENS):
        raise ValueError(
            f"{where}: {len(ids)} hash_ids for {n} input tokens, more than its {math.ceil(n / BLOCK_TOKENS)} "
            f"blocks of {BLOCK_TOKENS}: one id a block of the input"
        )
    return float(ts), n, out, ids


def checked_options(path: Path, time_scale: float, length_scale: float, num_prompts: int | None) -> None:
    for name, value in (("--time-scale", time_scale), ("--length-scale", length_scale)):
        if not isinstance(value, (int, float)) or not math.isfinite(value) or not 0 < value <= 1e6:
            raise ValueError(f"{name} {value!r} is invalid: give a positive factor, e.g. 0.5")
    if num_prompts is not None and (type(num_prompts) is not int or not 1 <= num_prompts <= MAX_REQUESTS):
        raise ValueError(f"--num-prompts {num_prompts!r} is invalid: give 1..{MAX_REQUESTS} requests")
    if not path.exists():
        raise ValueError(f"trace {path} does not exist: give a Mooncake JSONL file, one {FORMAT} a line")
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise ValueError(f"trace {path} is {special_kind(mode)}: give a Mooncake JSONL file")


def read_trace(
    path: str | Path,
    *,
    window_s: tuple[float, float] | None = None,
    num_prompts: int | None = None,
    time_scale: float = 1.0,
    length_scale: float = 1.0,
    context_len: int | None = None,
) -> Trace:
    """The part of the trace at `path` a replay serves: the requests whose timestamp lies in `window_s` (seconds from
    the trace's first request; None: all), the first `num_prompts` of them (None: all, at most MAX_REQUESTS),
    arrivals re-based on the part's first and times `time_scale`, lengths and blocks times `length_scale` (each
    prompt at least 1 token); a prompt beyond `context_len` after scaling is refused, naming the scale that fits."""
    path = Path(path)
    checked_options(path, time_scale, length_scale, num_prompts)
    requests: list[TraceRequest] = []
    first_ts = last_ts = part_start = None
    lines = 0
    with open(path, "rb") as f:
        for lines, raw in enumerate(f, start=1):
            if not raw.strip():
                continue
            where = f"trace {path} line {lines}"
            ts, n, out, ids = record_of(raw, where)
            if last_ts is not None and ts < last_ts:
                raise ValueError(
                    f"{where}: timestamp {ts:g} goes back from {last_ts:g}: a trace is in arrival order; sort it by "
                    "timestamp"
                )
            first_ts = ts if first_ts is None else first_ts
            last_ts = ts
            at_s = (ts - first_ts) / 1e3
            if window_s is not None and at_s < window_s[0]:
                continue
            if window_s is not None and at_s >= window_s[1]:
                break
            prompt_len = max(1, round(n * length_scale))
            if context_len is not None and prompt_len > context_len:
                raise ValueError(
                    f"{where}: input_length {n} x --length-scale {length_scale:g} = {prompt_len} tokens is beyond the "
                    f"policy's context of {context_len}: give --length-scale {context_len / n:.3g} or less, or a "
                    "--trace-window without it"
                )
            part_start = ts if part_start is None else part_start
            requests.append(TraceRequest((ts - part_start) * time_scale, prompt_len, tuple(ids), out, lines))
            if num_prompts is not None and len(requests) == num_prompts:
                break
            if len(requests) > MAX_REQUESTS:
                raise ValueError(
                    f"trace {path} has more than {MAX_REQUESTS} requests in the part taken: take less with "
                    "--trace-window START:END or --num-prompts N"
                )
    if not requests:
        span = "" if first_ts is None else f" (its requests span 0..{(last_ts - first_ts) / 1e3:.0f} s)"
        what = f"in --trace-window {window_s[0]:g}:{window_s[1]:g}" if window_s else "in it"
        raise ValueError(f"trace {path} has no request {what}{span}: give a window the trace covers")
    block = max(1, round(BLOCK_TOKENS * length_scale))
    return Trace(str(path), tuple(requests), block, float(time_scale), float(length_scale), window_s, lines)

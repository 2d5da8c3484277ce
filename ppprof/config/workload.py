"""The workload (--prompt-lens, part of the settings tree): the prompt lengths a policy's rules and status are chosen
on and `ppprof tune` plans for, with their weights, from a list or a file (one length a line, or a CSV with a
prompt-length column, such as a request trace), grouped into at most MAX_LENGTHS weighted quantiles. Parsed once,
where the context length is known; a policy file carries it parsed (`to_dict`, `from_dict`)."""

from __future__ import annotations

import csv
import math
import re
import stat
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from ppprof.bounds import MAX_TOKENS
from ppprof.checks import short
from ppprof.io import special_kind

MAX_LENGTHS = 32  # distinct prompt lengths planned; a trace with more is grouped into this many weighted quantiles
PROMPT_COLUMNS = (
    "prompt_len",
    "prompt_lens",
    "prompt_length",
    "prompt_tokens",
    "num_prompt_tokens",
    "input_len",
    "input_length",
    "input_tokens",
    "isl",
)
WEIGHT_COLUMNS = ("weight", "count", "frequency")
LIST_SPEC = re.compile(r"^\s*\d+(\s*:\s*[^,:\s]+)?(\s*,\s*\d+(\s*:\s*[^,:\s]+)?)*\s*,?\s*$")


@dataclass(frozen=True, slots=True)
class Workload:
    """Distinct prompt lengths with their weights (summing to 1) and a note when a trace was grouped."""

    prompt_lens: tuple[int, ...]
    weights: tuple[float, ...]
    note: str | None = None
    source: str = "default"
    """Where it came from: the --prompt-lens SPEC it was parsed from, or "default" (lengths spread over the domain)."""

    def to_dict(self) -> dict:
        """The policy file's `workload`."""
        return {"prompt_lens": list(self.prompt_lens), "weights": list(self.weights), "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> Workload:
        """A policy file's `workload` (to_dict), as it was chosen on."""
        return cls(tuple(d["prompt_lens"]), tuple(d["weights"]), source=d.get("source", "default"))


def check_prompt_spec(spec: object) -> None:
    """What a --prompt-lens SPEC is before it is read (a profile's settings check it; the fit reads it): text, not
    blank."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"--prompt-lens {short(spec)} is invalid: give lengths like 8192,32768 or a file of them")


def parse_prompt_spec(spec: str, context_len: int | None = None) -> Workload:
    """A list ("8192,32768,131072", weights as "8192:3,32768:1") or a file: one length a line (optionally
    "length,weight"), or a CSV whose header names a prompt-length column (PROMPT_COLUMNS) and optionally a weight
    column (WEIGHT_COLUMNS); a trace's rows count once each. ValueError (one line) naming what is wrong."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("--prompt-lens is empty: give lengths like 8192,32768 or a file of them")
    path = Path(spec)
    tally = Tally(context_len)
    try:
        mode = path.stat().st_mode
    except (OSError, ValueError):  # absent, or a list too long to be a file name
        mode = None
    if mode is not None and not stat.S_ISREG(mode):  # /dev/zero would be read for ever
        raise ValueError(f"--prompt-lens file {path} is {special_kind(mode)}, not a file: give a text or CSV file")
    if mode is not None:
        read_prompt_file(path, tally)
    elif LIST_SPEC.match(spec):
        for item in spec.split(","):
            if not item.strip():
                continue
            length, _, weight = item.partition(":")
            tally.add(length.strip(), weight.strip() or "1", lambda item=item: f"--prompt-lens item {item.strip()!r}")
    else:
        raise ValueError(
            f"--prompt-lens {spec!r} is neither a list of token counts (8192,32768) nor an existing file: give one"
        )
    if not tally.num_rows:
        raise ValueError(f"--prompt-lens {spec!r} holds no prompt length: give at least one")
    return replace(group(*tally.sums()), source=spec)


BLOCK_ROWS = 1 << 16
"""Rows a Tally holds before it folds them into its sums: what bounds its memory, whatever the trace's length."""
MAX_LINE_CHARS = 1 << 16
"""The longest line of a prompt-length file: a trace's row is a few hundred characters."""


class Tally:
    """Weights summed by prompt length as rows come: a block of rows at a time is folded into the sorted distinct
    lengths and their summed weights, so that memory grows with the distinct lengths (at most the context length),
    not with the rows (a 10^7-row trace)."""

    def __init__(self, context_len: int | None) -> None:
        self.context_len, self.num_rows = context_len, 0
        self.lengths: list[int] = []
        self.weights: list[float] = []
        self.uniq, self.summed = np.empty(0, dtype=np.int64), np.empty(0)

    def add(self, length: str, weight: str, where: Callable[[], str]) -> None:
        """One row; `where()` names it in an error (built only then: a trace has millions of rows)."""
        fast = length.isascii() and length.isdigit() and len(length) < 10 and length != "0"  # most rows: no checks
        n = int(length) if fast else to_length(length, where())
        if self.context_len is not None and n > self.context_len:
            raise ValueError(
                f"{where()}: prompt length {n} is beyond the policy's context length {self.context_len}: "
                f"profile with a larger --context-len or drop it"
            )
        self.lengths.append(n)
        self.weights.append(1.0 if weight == "1" else to_weight(weight, where()))
        self.num_rows += 1
        if len(self.lengths) >= BLOCK_ROWS:
            self.fold()

    def fold(self) -> None:
        uniq, inverse = np.unique(
            np.concatenate([self.uniq, np.asarray(self.lengths, dtype=np.int64)]), return_inverse=True
        )
        self.summed = np.bincount(inverse, weights=np.concatenate([self.summed, self.weights]), minlength=len(uniq))
        self.uniq = uniq
        self.lengths, self.weights = [], []

    def sums(self) -> tuple[np.ndarray, np.ndarray]:
        """(distinct lengths, summed weights)."""
        self.fold()
        return self.uniq, self.summed


def read_prompt_file(path: Path, tally: Tally) -> None:
    """Each row of a prompt-length file (see parse_prompt_spec) into `tally`, a line at a time."""
    what = f"--prompt-lens file {path}"
    try:
        with open(path, encoding="utf-8", newline="") as f:
            read_prompt_lines(f, what, tally)
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{what} is not readable text ({e.__class__.__name__}): give a text or CSV file") from None
    if not tally.num_rows:
        raise ValueError(f"{what} holds no prompt length: one a line, or a CSV with a {PROMPT_COLUMNS[0]} column")


def read_prompt_lines(f, what: str, tally: Tally) -> None:
    length_col, weight_col, first, line_idx = 0, 1, True, 0
    while line := f.readline(MAX_LINE_CHARS + 1):
        line_idx += 1
        if len(line) > MAX_LINE_CHARS:
            raise ValueError(
                f"{what} line {line_idx} is longer than {MAX_LINE_CHARS} characters: give one prompt "
                "length (and its weight) a line"
            )
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        row = [c.strip() for c in next(csv.reader([text]))] if ("," in text or '"' in text) else [text]
        if first:
            first = False
            header = [c.lower() for c in row]
            if not all(re.fullmatch(r"[0-9.eE+-]+", c) for c in header):
                found = [i for i, c in enumerate(header) if c in PROMPT_COLUMNS]
                if not found:
                    raise ValueError(
                        f"{what} has columns {', '.join(row)} but no prompt-length column: name one "
                        f"{' or '.join(PROMPT_COLUMNS[:3])}"
                    )
                length_col = found[0]
                weights = [i for i, c in enumerate(header) if c in WEIGHT_COLUMNS]
                weight_col = weights[0] if weights else None
                continue
        if length_col >= len(row) or not row[length_col]:
            raise ValueError(f"{what} line {line_idx} has no prompt length: give one in every row")
        weight = row[weight_col] if weight_col is not None and weight_col < len(row) and row[weight_col] else "1"
        tally.add(row[length_col], weight, lambda line_idx=line_idx: f"{what} line {line_idx}")


def to_length(text: str, where: str) -> int:
    if not re.fullmatch(r"\d+", text):
        raise ValueError(f"{where}: prompt length {text!r} is not a whole number of tokens: give one like 8192")
    if len(text) > 10 or int(text) > MAX_TOKENS:  # bounded before numpy's int64 sees it
        raise ValueError(
            f"{where}: prompt length {short(text)} is beyond {MAX_TOKENS} tokens: give a prompt length a server takes"
        )
    n = int(text)
    if n < 1:
        raise ValueError(f"{where}: prompt length {n} must be at least 1 token")
    return n


def to_weight(text: str, where: str) -> float:
    try:
        w = float(text)
    except ValueError:
        raise ValueError(f"{where}: weight {text!r} is not a number: give a positive number") from None
    if not math.isfinite(w) or w <= 0:
        raise ValueError(f"{where}: weight {text} must be a positive finite number")
    return w


def group(lengths: np.ndarray, weights: np.ndarray) -> Workload:
    """Distinct lengths with summed weights; more than MAX_LENGTHS are grouped into weighted quantiles, each
    represented by its weighted mean length."""
    uniq, inverse = np.unique(lengths, return_inverse=True)
    summed = np.bincount(inverse, weights=weights)
    note = None
    if len(uniq) > MAX_LENGTHS:
        cum = np.cumsum(summed) / summed.sum()
        bins = np.minimum((cum * MAX_LENGTHS - 1e-12).astype(int), MAX_LENGTHS - 1)
        reps, ws = [], []
        for b in np.unique(bins):
            sel = bins == b
            reps.append(int(round(float(np.average(uniq[sel], weights=summed[sel])))))
            ws.append(float(summed[sel].sum()))
        note = f"{len(uniq)} distinct prompt lengths grouped into {len(reps)} weighted quantiles"
        uniq, summed = np.asarray(reps), np.asarray(ws)
    total = summed.sum()
    return Workload(tuple(int(v) for v in uniq), tuple(float(w / total) for w in summed), note)

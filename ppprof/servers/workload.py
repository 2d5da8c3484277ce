"""The workload `ppprof tune` plans for: prompt lengths and their weights, from a list or a file (one length a line,
or a CSV with a prompt-length column, such as a request trace), grouped into at most MAX_LENGTHS weighted quantiles."""

from __future__ import annotations

import csv
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAX_LENGTHS = 32  # distinct prompt lengths planned; a trace with more is grouped into this many weighted quantiles
PROMPT_COLUMNS = ("prompt_len", "prompt_lens", "prompt_length", "prompt_tokens", "num_prompt_tokens", "input_len",
                  "input_length", "input_tokens", "isl")
WEIGHT_COLUMNS = ("weight", "count", "frequency")
LIST_SPEC = re.compile(r"^\s*\d+(\s*:\s*[^,:\s]+)?(\s*,\s*\d+(\s*:\s*[^,:\s]+)?)*\s*,?\s*$")


@dataclass(frozen=True, slots=True)
class Workload:
    """Distinct prompt lengths with their weights (summing to 1) and a note when a trace was grouped."""

    prompt_lens: tuple[int, ...]
    weights: tuple[float, ...]
    note: str | None = None


def parse_prompt_spec(spec: str, context_len: int | None = None) -> Workload:
    """A list ("8192,32768,131072", weights as "8192:3,32768:1") or a file: one length a line (optionally
    "length,weight"), or a CSV whose header names a prompt-length column (PROMPT_COLUMNS) and optionally a weight
    column (WEIGHT_COLUMNS); a trace's rows count once each. ValueError (one line) naming what is wrong."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError("--prompt-lens is empty: give lengths like 8192,32768 or a file of them")
    path = Path(spec)
    if path.is_file():
        pairs = read_prompt_file(path)
    elif LIST_SPEC.match(spec):
        pairs = []
        for item in spec.split(","):
            if not item.strip():
                continue
            length, _, weight = item.partition(":")
            pairs.append((length.strip(), weight.strip() or "1", f"--prompt-lens item {item.strip()!r}"))
    else:
        raise ValueError(f"--prompt-lens {spec!r} is neither a list of token counts (8192,32768) nor an existing file: "
                         f"give one")
    lengths, weights = [], []
    for length, weight, where in pairs:
        n, w = to_length(length, where), to_weight(weight, where)
        if context_len is not None and n > context_len:
            raise ValueError(f"{where}: prompt length {n} is beyond the policy's context length {context_len}: "
                             f"profile with a larger --context-len or drop it")
        lengths.append(n)
        weights.append(w)
    if not lengths:
        raise ValueError(f"--prompt-lens {spec!r} holds no prompt length: give at least one")
    return group(np.asarray(lengths, dtype=np.int64), np.asarray(weights, dtype=float))


def read_prompt_file(path: Path) -> list[tuple[str, str, str]]:
    """(length, weight, where) of each row of a prompt-length file (see parse_prompt_spec)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--prompt-lens file {path} is not readable text ({e.__class__.__name__}): give a text "
                         f"or CSV file") from None
    numbered = [(i, line) for i, line in enumerate(text.splitlines(), start=1)
                if line.strip() and not line.lstrip().startswith("#")]
    rows = [(i, [c.strip() for c in next(csv.reader([line]))]) for i, line in numbered]
    if not rows:
        raise ValueError(f"--prompt-lens file {path} holds no prompt length: one a line, or a CSV with a "
                         f"{PROMPT_COLUMNS[0]} column")
    header = [c.lower() for c in rows[0][1]]
    length_col, weight_col = 0, (1 if any(len(r) > 1 for _, r in rows) else None)
    if not all(re.fullmatch(r"[0-9.eE+-]+", c) for c in header):
        found = [i for i, c in enumerate(header) if c in PROMPT_COLUMNS]
        if not found:
            raise ValueError(f"--prompt-lens file {path} has columns {', '.join(rows[0][1])} but no prompt-length "
                             f"column: name one {' or '.join(PROMPT_COLUMNS[:3])}")
        length_col = found[0]
        weights = [i for i, c in enumerate(header) if c in WEIGHT_COLUMNS]
        weight_col = weights[0] if weights else None
        rows = rows[1:]
    out = []
    for line, row in rows:
        where = f"--prompt-lens file {path} line {line}"
        if length_col >= len(row) or not row[length_col]:
            raise ValueError(f"{where} has no prompt length: give one in every row")
        weight = row[weight_col] if weight_col is not None and weight_col < len(row) and row[weight_col] else "1"
        out.append((row[length_col], weight, where))
    return out


def to_length(text: str, where: str) -> int:
    if not re.fullmatch(r"\d+", text):
        raise ValueError(f"{where}: prompt length {text!r} is not a whole number of tokens: give one like 8192")
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

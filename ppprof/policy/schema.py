"""The policy file: versioned JSON (schema, load, save, deep validation) and the server-facing Policy object."""

from __future__ import annotations

import json
from bisect import bisect_right
from pathlib import Path

from ppprof.checks import is_int
from ppprof.io import atomic_write_json
from ppprof.policy.rule import ChunkSettings, LatencyModel, build_table, check_rule, next_chunk_size

SCHEMA_VERSION = 2  # 2: the table's prefix column is named prefix_len
STATUSES = ("dynamic", "static")
REQUIRED_KEYS = ("schema_version", "status", "reason", "latency_model", "settings", "target_latency_ms", "table")
RULE_TEXT = (
    "L == 0: B; else x = positive root of a*x^2 + (2*a*L + b)*x + (g*L - T) = 0 (none: B; g*L >= T: x = 0), "
    "size = max(int(B + s*(x - B)), min_chunk_size), aligned down (at least one unit), "
    "capped at min(context_len - L - context_margin, max_chunk_size), aligned down again (0: B)"
)


class Policy:
    """A loaded policy. `next_chunk_size(prefix_len)` is one bisect in the precomputed breakpoint table."""

    __slots__ = ("data", "status", "reason", "model", "settings", "target_ms", "_starts", "_sizes", "base_chunk_size")

    def __init__(self, data: dict):
        self.data = data
        self.status = data["status"]
        self.reason = data["reason"]
        self.model = None if data["latency_model"] is None else LatencyModel.from_dict(data["latency_model"])
        self.settings = ChunkSettings(**data["settings"])
        self.target_ms = data["target_latency_ms"]
        self.base_chunk_size = self.settings.base_chunk_size
        table = data["table"]
        self._starts = list(table["prefix_len"])
        self._sizes = list(table["chunk_size"])

    def next_chunk_size(self, prefix_len: int | None = None, *, history_len: int | None = None) -> int:
        """Size of the next prefill chunk of a prompt whose first `prefix_len` tokens are already in the cache.

        history_len: alias kept for servers written against ppprof 0.1 / SGLang's name. Give exactly one of the two
        (TypeError otherwise).
        """
        if history_len is not None:
            if prefix_len is not None:
                raise TypeError("next_chunk_size() takes prefix_len or its alias history_len, not both")
            prefix_len = history_len
        elif prefix_len is None:
            raise TypeError("next_chunk_size() missing the prefix_len argument")
        if prefix_len < 0:
            raise ValueError(f"prefix_len {prefix_len} is negative: use the number of tokens already prefilled")
        return self._sizes[bisect_right(self._starts, prefix_len) - 1]

    def plan(self, prompt_len: int) -> list[int]:
        """The whole chunk list of a `prompt_len`-token prompt under this policy (the last chunk takes the rest)."""
        if prompt_len < 1:
            raise ValueError(f"--prompt-len {prompt_len} is invalid: use a positive number of tokens")
        chunks, done = [], 0
        while done < prompt_len:
            size = min(self.next_chunk_size(done), prompt_len - done)
            chunks.append(size)
            done += size
        return chunks

    def rule(self, prefix_len: int) -> int:
        """The rule evaluated directly from the coefficients (slow path; equals next_chunk_size)."""
        if self.status == "static":
            return self.base_chunk_size
        return next_chunk_size(self.model, self.settings, self.target_ms, prefix_len)


def extrapolation(policy: Policy, prompt_len: int, chunk_sizes: list[int] | None = None) -> str | None:
    """A one-line note when a prompt's chunks lie outside what the profile measured (policy["domain"]): how far past
    the largest profiled prefix (or chunk) the latency model is asked; None inside the domain or without one."""
    dom = policy.data.get("domain")
    if not isinstance(dom, dict) or not dom.get("prefix_len") or not dom.get("chunk_size"):
        return None
    chunks = chunk_sizes or policy.plan(prompt_len)
    deepest, largest = prompt_len - chunks[-1], max(chunks)
    (_, max_prefix), (_, max_chunk) = dom["prefix_len"], dom["chunk_size"]
    notes = []
    if deepest > max_prefix:
        notes.append(f"prefixes up to {deepest}, {deepest / max(max_prefix, 1):.2f}x the largest profiled prefix "
                     f"({max_prefix})")
    if largest > max_chunk:
        notes.append(f"chunks up to {largest}, {largest / max_chunk:.2f}x the largest profiled chunk ({max_chunk})")
    if not notes:
        return None
    return (f"prompt {prompt_len} reaches " + " and ".join(notes) + ": the latency model is extrapolated there; "
            "profile with --prefix-lens (or --context-len) covering it")


def static_table(base_chunk_size: int) -> dict:
    """The one-entry table of a static policy: B from prefix 0 on."""
    return {"prefix_len": [0], "chunk_size": [base_chunk_size]}


def make_table(model: LatencyModel | None, settings: ChunkSettings, target_ms: float | None, status: str) -> dict:
    """The policy's breakpoint table {"prefix_len": starts, "chunk_size": sizes}."""
    if status == "static":
        return static_table(settings.base_chunk_size)
    starts, sizes = build_table(model, settings, target_ms)
    return {"prefix_len": starts, "chunk_size": sizes}


def check_schema(data) -> None:
    """Raise ValueError (one line) unless `data` has the policy schema."""
    if not isinstance(data, dict):
        raise ValueError("policy must be a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ValueError(f"policy lacks {', '.join(missing)}: regenerate it with `ppprof fit`")
    if data["schema_version"] != SCHEMA_VERSION:
        raise ValueError(
            f"policy schema_version {data['schema_version']!r} is not supported: this ppprof reads {SCHEMA_VERSION}; "
            f"regenerate it with `ppprof fit`"
        )
    if data["status"] not in STATUSES:
        raise ValueError(f"policy status {data['status']!r} is invalid: use 'dynamic' or 'static'")
    if not isinstance(data["reason"], str) or not data["reason"]:
        raise ValueError("policy reason must be a non-empty string")
    if not isinstance(data["settings"], dict):
        raise ValueError("policy settings must be an object")
    if data["status"] == "dynamic":
        if data["latency_model"] is None or not isinstance(data["target_latency_ms"], (int, float)):
            raise ValueError("dynamic policy needs a latency_model and a numeric target_latency_ms")
        if not data["target_latency_ms"] > 0:
            raise ValueError(f"target_latency_ms {data['target_latency_ms']} must be positive")
    table = data["table"]
    if not isinstance(table, dict) or set(table) != {"prefix_len", "chunk_size"}:
        raise ValueError("policy table must be {'prefix_len': [...], 'chunk_size': [...]}")
    starts, sizes = table["prefix_len"], table["chunk_size"]
    if not isinstance(starts, list) or not isinstance(sizes, list) or len(starts) != len(sizes) or not starts:
        raise ValueError("policy table columns must be non-empty lists of equal length")
    if not all(is_int(v) for v in starts + sizes):
        raise ValueError("policy table entries must be integers")
    if starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])):
        raise ValueError("policy table prefix_len must start at 0 and increase strictly")
    if any(v < 1 for v in sizes):
        raise ValueError("policy table chunk sizes must be positive")
    design = data.get("design")
    if design is not None and not (isinstance(design, dict) and isinstance(design.get("design"), str)
                                   and isinstance(design.get("stopping_reason"), str)):
        raise ValueError("policy design must be an object with 'design' and 'stopping_reason' strings")
    dom = data.get("domain")
    if dom is not None:
        pairs = [dom.get(k) if isinstance(dom, dict) else None for k in ("prefix_len", "chunk_size")]
        if not all(isinstance(p, list) and len(p) == 2 and all(is_int(v) for v in p) and p[0] <= p[1] for p in pairs):
            raise ValueError("policy domain must be {'prefix_len': [min, max], 'chunk_size': [min, max]} of integers")


def from_dict(data) -> Policy:
    """A Policy from a parsed policy file; ValueError (one line) unless it has the schema."""
    check_schema(data)
    return Policy(data)


def load(path: str | Path) -> Policy:
    """Read a policy file; raise ValueError with one line if it is missing, not JSON or not a policy."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"policy file {path} does not exist: run `ppprof fit` first") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"policy file {path} is not readable JSON ({e})") from None
    try:
        return from_dict(data)
    except (ValueError, TypeError) as e:
        raise ValueError(f"policy file {path}: {e}") from None


def save(path: str | Path, data: dict) -> Path:
    """Check and write a policy atomically."""
    check_schema(data)
    Policy(data)
    return atomic_write_json(path, data)


def validate(policy: Policy) -> str:
    """Deep sanity check; returns a one-line summary or raises ValueError with the reason."""
    B = policy.base_chunk_size
    if policy.status == "static":
        if policy._starts != [0] or policy._sizes != [B]:
            raise ValueError(f"static policy table must be one entry (0 -> {B})")
        return f"static (base chunk {B}): {policy.reason}{domain_text(policy)}"
    check_rule(policy.model, policy.settings, policy.target_ms)
    expected = make_table(policy.model, policy.settings, policy.target_ms, "dynamic")
    if expected != {"prefix_len": policy._starts, "chunk_size": policy._sizes}:
        raise ValueError("policy table does not match the rule recomputed from its coefficients: refit")
    align = policy.settings.alignment
    for L, size in zip(policy._starts[1:], policy._sizes[1:]):
        if size != B and size % align:
            raise ValueError(f"table chunk size {size} at prefix_len {L} is not a multiple of alignment {align}")
    smallest = min(policy._sizes)
    return (f"dynamic ({policy.model.name}), {len(policy._sizes)} table entries, chunk {B} -> {smallest}"
            f"{domain_text(policy)}")


def domain_text(policy: Policy) -> str:
    dom = policy.data.get("domain")
    if not isinstance(dom, dict):
        return ""
    (p0, p1), (c0, c1) = dom["prefix_len"], dom["chunk_size"]
    return f"; profiled prefixes {p0}-{p1}, chunks {c0}-{c1}"

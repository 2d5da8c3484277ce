"""The tables a policy stores: the prompt-aware rule (`PromptRule`, the file's prompt_table) and the history-only
table (`HistoryTable`, the file's table), their lookups and plans. Pure Python; no numpy at lookup."""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass

from ppprof.chunks import walk
from ppprof.policy.optimum import Domain

RULE_TEXT = (
    "a bounded rule: after L cached tokens the largest multiple of the unit <= the cap whose predicted latency "
    "t(L, x) + overhead is <= the bound, at least one unit. prompt_table: per band of prompt lengths, the bounded rule "
    "that plans within 1% of the DP optimum; the whole rest when it is at most the chunk + merge_len. table: the "
    "bounded rule with the least mean TTFT on the workload (no bound: fixed chunks of the cap)"
)
"""The rules behind the tables, in words: the policy file's `rule`."""


def table_chunk_size(starts: list[int], sizes: list[int], prefix_len: int) -> int:
    """The breakpoint table's chunk size after `prefix_len` tokens: sizes[i] for the last i with starts[i] <= it
    (Policy.next_chunk_size without a prompt length, less its argument checks)."""
    return sizes[bisect_right(starts, prefix_len) - 1]


def table_plan(starts: list[int], sizes: list[int], prompt_len: int) -> list[int]:
    """The chunk list of a `prompt_len`-token prompt under a breakpoint table (the last chunk takes the rest)."""
    return walk(lambda done: table_chunk_size(starts, sizes, done), prompt_len)


@dataclass(frozen=True, slots=True)
class HistoryTable:
    """The history-only table as it is stored: after L cached tokens the next chunk is chunk_size[i] for the last i
    with prefix_len[i] <= L (the caller cuts the last chunk)."""

    prefix_len: list[int]
    chunk_size: list[int]

    def next_chunk_size(self, prefix_len: int) -> int:
        return self.chunk_size[bisect_right(self.prefix_len, prefix_len) - 1]

    def plan(self, prompt_len: int) -> list[int]:
        return table_plan(self.prefix_len, self.chunk_size, prompt_len)

    @classmethod
    def from_dict(cls, d: dict) -> HistoryTable:
        return cls(list(d["prefix_len"]), list(d["chunk_size"]))


@dataclass(frozen=True, slots=True)
class PromptRule:
    """The prompt-aware rule as it is stored: band i holds the prompts of prompt_len[i] .. prompt_len[i+1] - 1
    tokens; after L cached tokens of such a prompt of N tokens, the next chunk is x = chunk_size[i][j] for the last j
    with prefix_len[i][j] <= L, or the whole rest N - L where that is at most x + merge_len[i] and largest_chunk."""

    prompt_len: list[int]
    bound_ms: list[float]
    merge_len: list[int]
    prefix_len: list[list[int]]
    chunk_size: list[list[int]]
    largest_chunk: int

    def next_chunk_size(self, prefix_len: int, prompt_len: int) -> int:
        i = bisect_right(self.prompt_len, prompt_len) - 1
        x = self.chunk_size[i][bisect_right(self.prefix_len[i], prefix_len) - 1]
        rest = prompt_len - prefix_len
        return rest if rest <= min(x + self.merge_len[i], self.largest_chunk) else x

    def plan(self, prompt_len: int) -> list[int]:
        return walk(lambda done: self.next_chunk_size(done, prompt_len), prompt_len)

    def to_dict(self, dom: Domain) -> dict:
        """The policy's prompt_table (a bound of None: no bound), with the domain's unit, largest chunk and longest
        prompt."""
        return {
            "prompt_len": self.prompt_len,
            "bound_ms": [b if math.isfinite(b) else None for b in self.bound_ms],
            "merge_len": self.merge_len,
            "prefix_len": self.prefix_len,
            "chunk_size": self.chunk_size,
            "unit": dom.unit,
            "largest_chunk": self.largest_chunk,
            "max_prompt_len": dom.max_prompt_len,
        }

    @classmethod
    def from_dict(cls, d: dict) -> PromptRule:
        bounds = [math.inf if b is None else float(b) for b in d["bound_ms"]]
        return cls(
            list(d["prompt_len"]),
            bounds,
            list(d["merge_len"]),
            [list(v) for v in d["prefix_len"]],
            [list(v) for v in d["chunk_size"]],
            int(d["largest_chunk"]),
        )

    @classmethod
    def fixed(cls, chunk_size: int) -> PromptRule:
        """One band of one entry: every chunk `chunk_size` (a static policy)."""
        return cls([1], [math.inf], [0], [[0]], [[chunk_size]], chunk_size)


@dataclass(frozen=True, slots=True)
class LoadRule:
    """The under-load rule as it is stored (the file's `load`): while at least pending_requests[0] other requests have
    prefill work with at least handover_tokens tokens left between them (the handover), level i is the last with
    pending_requests[i] <= the requests pending, and after L cached tokens the next chunk is chunk_size[i][j] for the
    last j with prefix_len[i][j] <= L: the bounded rule (bound_ms[i], chunk_cap[i]) as a breakpoint table. Below the
    handover, the idle rules answer. The chunk is a batch's token budget: the scheduler packs the other requests'
    tokens into what the chunked request's rest leaves of it."""

    pending_requests: list[int]
    bound_ms: list[float]
    chunk_cap: list[int]
    prefix_len: list[list[int]]
    chunk_size: list[list[int]]
    handover_tokens: int = 0

    def next_chunk_size(self, prefix_len: int, pending_requests: int, pending_tokens: int) -> int | None:
        """The under-load chunk at this load; None below the handover (the idle rules answer)."""
        if pending_requests < self.pending_requests[0] or pending_tokens < self.handover_tokens:
            return None
        i = bisect_right(self.pending_requests, pending_requests) - 1
        return self.chunk_size[i][bisect_right(self.prefix_len[i], prefix_len) - 1]

    def to_dict(self) -> dict:
        return {
            "pending_requests": self.pending_requests,
            "bound_ms": [b if math.isfinite(b) else None for b in self.bound_ms],
            "chunk_cap": self.chunk_cap,
            "prefix_len": self.prefix_len,
            "chunk_size": self.chunk_size,
            "handover_tokens": self.handover_tokens,
        }

    @classmethod
    def from_dict(cls, d: dict | None) -> LoadRule | None:
        """The rule of a policy's `load` (None where the file has none: the idle rules answer at every load)."""
        if d is None:
            return None
        return cls(
            list(d["pending_requests"]),
            [math.inf if b is None else float(b) for b in d["bound_ms"]],
            list(d["chunk_cap"]),
            [list(v) for v in d["prefix_len"]],
            [list(v) for v in d["chunk_size"]],
            int(d["handover_tokens"]),
        )

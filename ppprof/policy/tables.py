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
LOAD_RULE_VERSION = 5
"""The schema whose `load` is the full-pipeline rule (LoadRule); schema 4's (a count of pending requests tuned to one
workload) is kept in the file but not read."""


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
    """The under-load rule as it is stored (the file's `load`, schema 5): whether the pipeline is full, read from the
    work present, and chunks of one latency while it is. While other requests have prefill work (pending_tokens > 0),
    the work is the prompt being sized (its length, or its rest where the length is unknown) and the others' tokens
    not yet scheduled, and its share the work over `fill` times the pipeline's `slots` micro-batch slots (pp_size
    plus the async depth). The bound is the predicted latency of a first chunk of the share, at least that of the idle
    rules' chunk and at most the full pipeline's bound (full.bound_ms); the chunk after L cached tokens is the
    bounded rule's (the largest multiple of the unit <= full.chunk_cap whose predicted latency at L is within the
    bound), never below the idle rules' chunk. Where the work would not give every slot a batch of the idle rules'
    latency, the idle rules answer: the handover is the share's latency crossing the idle chunk's, not a count of
    requests. One bound for the whole prompt while the load holds keeps the stages' batches even (a batch much longer
    than its neighbours idles the stages behind it). The chunk is a batch's token budget: the scheduler packs the
    other requests' tokens into what the chunked request's rest leaves of it."""

    slots: int
    fill: float
    unit: int
    bound_ms: float
    chunk_cap: int
    floor: int | None = None
    """None: the idle rules' chunk is the least (the rule only grows chunks); a chunk size: the least bound is a
    first chunk of it, so that a share below the idle chunk splits the work over more of the slots."""

    def share(self, work: int, slots: int | None = None) -> int:
        """`work` tokens over fill x slots (the server's slots where given), aligned down to the unit, one at least."""
        return max(self.unit, int(work / (self.fill * (slots or self.slots))) // self.unit * self.unit)

    def to_dict(self) -> dict:
        return {
            "slots": self.slots,
            "fill": self.fill,
            "unit": self.unit,
            "floor": self.floor,
            "full": {"bound_ms": self.bound_ms if math.isfinite(self.bound_ms) else None, "chunk_cap": self.chunk_cap},
        }

    @classmethod
    def from_dict(cls, d: dict | None, schema_version: int = LOAD_RULE_VERSION) -> LoadRule | None:
        """The rule of a policy's `load`; None where the file has none, or has a schema 4 rule (a count of pending
        requests, not read since schema 5: the idle rules answer at every load, as with none)."""
        if d is None or schema_version < LOAD_RULE_VERSION:
            return None
        full = d["full"]
        bound = math.inf if full["bound_ms"] is None else float(full["bound_ms"])
        floor = None if d.get("floor") is None else int(d["floor"])
        return cls(int(d["slots"]), float(d["fill"]), int(d["unit"]), bound, int(full["chunk_cap"]), floor)

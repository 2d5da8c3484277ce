"""Breakpoint tables by their columns (a lookup, a plan) and the rules behind a policy's tables in words; the stored
tables themselves (`PromptRule`, `HistoryTable`, `LoadRule`) are the contract's (ppprof.policy.contract)."""

from __future__ import annotations

from bisect import bisect_right

from ppprof.chunks import walk
from ppprof.policy.contract import LOAD_RULE_VERSION, HistoryTable, LoadRule, PromptRule

__all__ = ["LOAD_RULE_VERSION", "RULE_TEXT", "HistoryTable", "LoadRule", "PromptRule", "table_chunk_size", "table_plan"]

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

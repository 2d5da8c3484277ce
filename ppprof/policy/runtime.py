"""The loaded policy a server asks (`Policy`): a frozen value of the document read and its typed parts, with the
next-chunk lookup and the plans of a prompt."""

from __future__ import annotations

from dataclasses import dataclass

from ppprof.chunks import walk
from ppprof.config import ChunkSettings
from ppprof.policy.arguments import check_prompt_len, checked_prompt_len, token_count
from ppprof.policy.bounded import bounded_chunk
from ppprof.policy.rule import NO_CALIBRATION, LatencyModel, build_table
from ppprof.policy.tables import HistoryTable, LoadRule, PromptRule, table_plan


@dataclass(frozen=True, slots=True)
class Policy:
    """A loaded policy: `data`, the document as read (every field; the parts below are typed from it once), the
    latency model as fitted and as planned with (the calibration and the per-chunk overhead applied), the settings,
    the two tables and the under-load rule (None where the file has none). `next_chunk_size(prefix_len, prompt_len)`
    is two bisects in the prompt-aware rule's tables; without the prompt length, one bisect in the history-only table;
    with others waiting, one bisect more in the under-load rule. Built by Policy.of from a checked document
    (ppprof.policy.policy_file)."""

    data: dict
    latency_model: LatencyModel | None
    settings: ChunkSettings
    planning_model: LatencyModel | None
    history_table: HistoryTable
    prompt_rule: PromptRule
    load_rule: LoadRule | None = None

    @classmethod
    def of(cls, data: dict) -> Policy:
        """The Policy of a document whose structure is checked (ppprof.policy.structure); ValueError naming the
        latency model or the settings where they are not sound."""
        try:
            model = None if data["latency_model"] is None else LatencyModel.from_dict(data["latency_model"])
        except ValueError as e:
            raise ValueError(f"$.latency_model: {e}") from None
        try:
            settings = ChunkSettings(**data["settings"])
        except ValueError as e:
            raise ValueError(f"$.settings: {e}") from None
        overhead_ms = float(data["overhead"]["ms_per_chunk"])
        planning = None if model is None else model.planning(data.get("calibration") or NO_CALIBRATION, overhead_ms)
        tables = HistoryTable.from_dict(data["table"]), PromptRule.from_dict(data["prompt_table"])
        return cls(
            data, model, settings, planning, *tables, LoadRule.from_dict(data.get("load"), data["schema_version"])
        )

    @property
    def status(self) -> str:
        return self.data["status"]

    @property
    def reason(self) -> str:
        return self.data["reason"]

    @property
    def target_ms(self) -> float | None:
        return self.data["target_latency_ms"]

    @property
    def overhead_ms(self) -> float:
        return float(self.data["overhead"]["ms_per_chunk"])

    @property
    def extra_piece_ms(self) -> float:
        """d: what a packed forward of n pieces costs beyond the additive form, d (n - 1), as the profile's packed
        forwards measured it (0, the additive form, where it timed none or the form held)."""
        return float((self.data.get("packed_forwards") or {}).get("extra_piece_ms", 0.0))

    @property
    def calibration(self) -> dict:
        return self.data.get("calibration") or NO_CALIBRATION

    @property
    def fixed_best_chunk(self) -> int | None:
        """The best fixed chunk on the policy's workload, where its rules were chosen (None for a static policy)."""
        return (self.data.get("predicted") or {}).get("fixed_best_chunk")

    @property
    def pp_size(self) -> int:
        return self.data.get("num_stages") or 1

    @property
    def provenance(self) -> dict:
        """Where the numbers come from ({} where not recorded)."""
        return self.data.get("provenance") or {}

    @property
    def tp_size(self) -> int:
        """The TP degree of each profiled stage."""
        return self.provenance.get("tp_size") or 1

    @property
    def base_chunk_size(self) -> int:
        return self.settings.base_chunk_size

    def next_chunk_size(
        self,
        prefix_len: int | None = None,
        prompt_len: int | None = None,
        *,
        history_len: int | None = None,
        pending_requests: int = 0,
        pending_tokens: int = 0,
        slots: int | None = None,
    ) -> int:
        """Size of the next prefill chunk of a prompt whose first `prefix_len` tokens are already in the cache.

        prompt_len: the prompt's length in tokens, where the server knows it: the chunk of the prompt-aware rule (the
        last chunk is the rest). Without it, the history-only table's chunk (the caller cuts the last chunk).
        history_len: alias of prefix_len kept for servers written against ppprof 0.1 / SGLang's name. Give exactly
        one of the two (TypeError otherwise).
        pending_requests, pending_tokens: the load the scheduler sees, the other requests with prefill work (waiting
        or partly prefilled) and their tokens not yet scheduled. While any wait, the under-load rule's chunk (a
        batch's token budget; the caller cuts it to the rest and packs the others into what is left): the answer
        above raised to the work's share of the pipeline's slots where the pipeline is full (LoadRule); without an
        under-load rule, or with nothing else waiting, the answer above, as with no load.
        slots: the server's micro-batch slots (pp_size plus its async depth) where they differ from the rule's.
        """
        if history_len is not None:
            if prefix_len is not None:
                raise TypeError("next_chunk_size() takes prefix_len or its alias history_len, not both")
            prefix_len = history_len
        elif prefix_len is None:
            raise TypeError("next_chunk_size() missing the prefix_len argument")
        if type(prefix_len) is not int:  # the fast path is a plain int; numpy ints are taken, floats and bools not
            prefix_len = token_count("prefix_len", prefix_len)
        if prefix_len < 0:
            raise ValueError(f"prefix_len {prefix_len} is negative: use the number of tokens already prefilled")
        if prompt_len is not None:
            if type(prompt_len) is not int:
                prompt_len = token_count("prompt_len", prompt_len)
            if prompt_len <= prefix_len:
                raise ValueError(
                    f"prefix_len {prefix_len} leaves nothing of prompt_len {prompt_len} to prefill: ask only "
                    "while tokens are left"
                )
        if prompt_len is None:
            idle = self.history_table.next_chunk_size(prefix_len)
        else:
            idle = self.prompt_rule.next_chunk_size(prefix_len, prompt_len)
        if pending_requests or pending_tokens:
            own = prompt_len if prompt_len is not None else prefix_len + idle
            return self.under_load(prefix_len, idle, own, pending_requests, pending_tokens, slots)
        return idle

    def under_load(
        self, prefix_len: int, idle: int, own: int, pending_requests: int, pending_tokens: int, slots: int | None
    ) -> int:
        """The under-load rule's chunk after `prefix_len` tokens at this load (the counts checked; LoadRule), where
        the idle rules give `idle` and the prompt being sized has `own` tokens; `idle` without an under-load rule or
        with nothing else waiting."""
        if type(pending_requests) is not int or type(pending_tokens) is not int:
            pending_requests = token_count("pending_requests", pending_requests)
            pending_tokens = token_count("pending_tokens", pending_tokens)
        if pending_requests < 0 or pending_tokens < 0:
            raise ValueError(
                f"pending_requests {pending_requests}, pending_tokens {pending_tokens}: a load is never negative; "
                "count the other requests with prefill work and their tokens left"
            )
        if slots is not None and (type(slots) is not int or slots < 1):
            raise ValueError(f"slots {slots!r}: give the server's micro-batch slots, pp_size plus its async depth")
        rule, model = self.load_rule, self.planning_model
        if rule is None or model is None or pending_tokens == 0:
            return idle
        share = model.one_chunk_ms(0, rule.share(own + pending_tokens, slots))
        if rule.floor is not None:
            bound = min(rule.bound_ms, max(model.one_chunk_ms(0, rule.floor), share))
            return bounded_chunk(model, bound, rule.chunk_cap, prefix_len, rule.unit)
        bound = min(rule.bound_ms, share)
        if bound <= model.one_chunk_ms(prefix_len, idle):
            return idle
        return max(idle, bounded_chunk(model, bound, rule.chunk_cap, prefix_len, rule.unit))

    def plan(self, prompt_len: int) -> list[int]:
        """The whole chunk list of a `prompt_len`-token prompt under the prompt-aware rule. ValueError beyond the
        policy's context length (no prompt is longer; the list stays bounded)."""
        return self.prompt_rule.plan(self.checked_prompt_len(prompt_len))

    def plan_at_load(self, prompt_len: int, pending_requests: int = 0, pending_tokens: int = 0) -> list[int]:
        """The chunks of a `prompt_len`-token prompt asked of next_chunk_size with a load that stays the same while
        it prefills (the last chunk takes the rest). With no load, `plan`'s chunks."""
        prompt_len = self.checked_prompt_len(prompt_len)
        return walk(
            lambda done: self.next_chunk_size(
                done, prompt_len, pending_requests=pending_requests, pending_tokens=pending_tokens
            ),
            prompt_len,
        )

    def plan_history(self, prompt_len: int) -> list[int]:
        """The chunk list under the history-only table (the last chunk takes the rest)."""
        return self.history_table.plan(self.checked_prompt_len(prompt_len))

    def sglang_plan(self, prompt_len: int) -> list[int]:
        """The chunks of SGLang's equal-latency rule (target, smoothing, B // 4 floor, first chunk B) on the policy's
        fitted model and settings; fixed chunks of B without a model."""
        prompt_len = self.checked_prompt_len(prompt_len)
        if self.latency_model is None or not self.target_ms:
            return walk(lambda _: self.base_chunk_size, prompt_len)
        starts, sizes = build_table(self.latency_model, self.settings, self.target_ms)
        return table_plan(starts, sizes, prompt_len)

    def checked_prompt_len(self, prompt_len) -> int:
        """`prompt_len` as an int, positive, within the context length and a bounded plan (ppprof.policy.arguments);
        TypeError or ValueError (one line) otherwise."""
        return checked_prompt_len(prompt_len, self.settings.context_len, min(self.history_table.chunk_size))

    def check_prompt_len(self, prompt_len: int) -> None:
        """ValueError when an integer prompt length is beyond the context length or a bounded plan."""
        check_prompt_len(prompt_len, self.settings.context_len, min(self.history_table.chunk_size))


def largest_chunk(policy: Policy) -> int:
    """The largest chunk any of the policy's rules gives (the prompt-aware rule's whole rest included, and the
    under-load rule's cap): what a server's chunk cap (SGLang's --max-prefill-tokens) must allow."""
    prompt_rule = policy.prompt_rule
    bands = (x for band in prompt_rule.chunk_size for x in band)
    load = [policy.load_rule.chunk_cap] if policy.load_rule is not None else []
    return max([prompt_rule.largest_chunk, *policy.history_table.chunk_size, *bands, *load])

"""The policy a server reads (`Policy`): the contract's typed parts (ppprof.policy.contract) with the settings and
the status, and the report beside them (`Report`: what the file holds for people and for `validate`, `compare`,
`plan` and the serving simulation, its own object from schema 6 on; no server sizes a chunk from it), read from
policy.json's text and checked across its parts as `ppprof validate` checks it, a file of schema 3 to 5 in schema
6's layout (`upgraded`); and its answers, the next chunk and the plans of a prompt. Standard library and the ground
floors only, as the contract."""

from __future__ import annotations

import json
import numbers
from dataclasses import dataclass
from pathlib import Path

from ppprof.checks import short
from ppprof.chunks import ChunkSettings, walk
from ppprof.io import TooDeep, parse_json, read_small_text
from ppprof.policy.contract import (
    FIX,
    LATENCY,
    OPTIONAL,
    RENAMED,
    REPORT_ORDER,
    SETTINGS_TOKENS,
    STAGES,
    STATUSES,
    TOKENS,
    Calibration,
    HistoryTable,
    LatencyModel,
    LoadRule,
    Overhead,
    PromptRule,
    bounded_chunk,
    check_optional,
    nested_layout,
)


@dataclass(frozen=True, slots=True)
class Report:
    """The report, each field as the file holds it: the fitted model's whole predicted chunk latency, the rule's
    words, what the fit found and why (diagnostics), where the numbers come from (provenance), the profiled domain,
    the workload the rules were chosen on, what they are predicted to give (with the gain interval and the best fixed
    chunk; None for a static or parity policy), the parity rule's name, and where recorded, the probe design and the
    packed forwards' score."""

    target_chunk_latency_ms: float | None
    rule: str
    diagnostics: dict
    provenance: dict
    domain: dict | None
    workload: dict | None
    predicted: dict | None
    parity: str | None
    design: dict | None = None
    packed_forwards: dict | None = None

    def to_dict(self) -> dict:
        """The report's object in the file, in REPORT_ORDER (design and packed_forwards absent where None)."""
        return {k: getattr(self, k) for k in REPORT_ORDER if getattr(self, k) is not None or k not in OPTIONAL}

    @classmethod
    def from_dict(cls, report: dict) -> Report:
        """The report of a schema 6 file's `report` object (the schema checked it; a field it lacks reads None)."""
        return cls(**{k: report.get(k) for k in REPORT_ORDER})

    @property
    def fixed_best_chunk(self) -> int | None:
        """The best fixed chunk on the policy's workload, where its rules were chosen (None for a static policy)."""
        return (self.predicted or {}).get("fixed_best_chunk")

    @property
    def extra_piece_ms(self) -> float:
        """d: what a packed forward of n pieces costs beyond the additive form, d (n - 1), as the profile's packed
        forwards measured it (0, the additive form, where it timed none or the form held)."""
        return float((self.packed_forwards or {}).get("extra_piece_ms", 0.0))


def nested(flat: dict) -> dict:
    """A document whose report's fields stand beside the contract's (schema 3 to 5, or the fit's working form) in
    schema 6's layout: the contract's fields in their order, then `report` with the report's in REPORT_ORDER."""
    contract = {k: v for k, v in flat.items() if k not in REPORT_ORDER}
    return contract | {"report": {k: flat[k] for k in REPORT_ORDER if k in flat}}


def flattened(data: dict) -> dict:
    """A policy of any version read with its report's fields beside the contract's (the fit's working form; `nested`
    undoes it), under their new names."""
    doc = upgraded(data)
    return {k: v for k, v in doc.items() if k != "report"} | doc["report"]


def upgraded(data: dict) -> dict:
    """`data` (a policy the schema of its version took) in schema 6's layout, its schema_version kept (a schema 4
    under-load rule stays unread): a schema 6 document as it is; one of schema 3 to 5 nested (`nested`) with its
    renamed fields under their new names (RENAMED)."""
    if nested_layout(data) or is_nested(data):
        return data
    out = nested(data)
    report = out["report"] = dict(out["report"])
    for part, old, new in RENAMED:
        if isinstance(report.get(part), dict) and old in report[part]:
            report[part] = {(new if k == old else k): v for k, v in report[part].items()}
    return out


def is_nested(data: dict) -> bool:
    """Whether `data` is in schema 6's layout already (a `report` object and none of its fields beside it): an older
    file's document once upgraded (Policy.data), which keeps its schema_version."""
    return isinstance(data.get("report"), dict) and not any(k in data for k in REPORT_ORDER)


def report_of(data: dict) -> dict:
    """The report object of a policy document of any version read (`upgraded`'s)."""
    return upgraded(data)["report"]


MAX_PLAN_CHUNKS = 1_000_000
"""The most chunks a plan holds (Policy.plan, `ppprof plan`): its lists stay a few MB whatever the prompt."""


@dataclass(frozen=True, slots=True)
class Policy:
    """A loaded policy: `data`, the document as read in schema 6's layout (ppprof.policy.runtime.upgraded), the
    contract's parts typed from it once: the latency model as fitted and as planned with (the calibration and the
    per-chunk overhead applied), the settings, the two tables, the under-load rule (None where the file has none or
    one of schema 4), the status; and the `report` beside them. `next_chunk_size(prefix_len, prompt_len)` is
    two bisects in the prompt-aware rule's tables; without the prompt length, one bisect in the history-only table;
    with others waiting, the under-load rule's bounded chunk. Built by Policy.of (from_dict checks it whole)."""

    data: dict
    latency_model: LatencyModel | None
    settings: ChunkSettings
    planning_model: LatencyModel | None
    history_table: HistoryTable
    prompt_rule: PromptRule
    load_rule: LoadRule | None
    status: str
    reason: str
    target_ms: float | None
    overhead: Overhead
    calibration: Calibration
    pp_size: int
    report: Report

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"$.status: {short(self.status)} is not dynamic or static; {FIX}")
        check_optional("$.target_latency_ms", self.target_ms, LATENCY)
        STAGES.check("$.num_stages", self.pp_size)

    @classmethod
    def of(cls, data: dict) -> Policy:
        """The Policy of a document the schema of its version takes (ppprof.policy.schema), read in schema 6's
        layout (`upgraded`); ValueError (one line naming the field) where a part is not sound."""
        data = upgraded(data)
        try:
            model = None if data["latency_model"] is None else LatencyModel.from_dict(data["latency_model"])
        except ValueError as e:
            raise ValueError(str(e) if str(e).startswith("$.") else f"$.latency_model: {e}") from None
        for key in (*SETTINGS_TOKENS, "context_margin"):
            check_optional(f"$.settings.{key}", data["settings"].get(key), TOKENS)
        try:
            settings = ChunkSettings(**data["settings"])
        except ValueError as e:
            raise ValueError(f"$.settings: {e}") from None
        overhead, calibration = Overhead.from_dict(data["overhead"]), Calibration.from_dict(data.get("calibration"))
        planning = None if model is None else model.planning(calibration, overhead.ms_per_chunk)
        table, rule = HistoryTable.from_dict(data["table"]), PromptRule.from_dict(data["prompt_table"])
        load = LoadRule.from_dict(data.get("load"), data["schema_version"])
        pp_size = data.get("num_stages") or 1
        parts = (data["status"], data["reason"], data["target_latency_ms"], overhead, calibration, pp_size)
        return cls(data, model, settings, planning, table, rule, load, *parts, Report.from_dict(data["report"]))

    @property
    def overhead_ms(self) -> float:
        return float(self.overhead.ms_per_chunk)

    @property
    def fixed_best_chunk(self) -> int | None:
        """The report's best fixed chunk on the policy's workload (None for a static policy)."""
        return self.report.fixed_best_chunk

    @property
    def extra_piece_ms(self) -> float:
        """The report's d, a packed forward's cost per piece beyond the additive form (Report.extra_piece_ms)."""
        return self.report.extra_piece_ms

    @property
    def provenance(self) -> dict:
        """Where the numbers come from ({} where not recorded)."""
        return self.report.provenance or {}

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
        Allocates nothing but its answer on plain ints (the per-chunk path of a server).
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
        from ppprof.policy.rule import build_table  # SGLang's rule: not a server's per-chunk path

        prompt_len = self.checked_prompt_len(prompt_len)
        if self.latency_model is None or not self.target_ms:
            return walk(lambda _: self.base_chunk_size, prompt_len)
        starts, sizes = build_table(self.latency_model, self.settings, self.target_ms)
        return walk(HistoryTable(starts, sizes).next_chunk_size, prompt_len)

    def checked_prompt_len(self, prompt_len) -> int:
        """`prompt_len` as an int (token_count), positive, within the context length and a bounded plan
        (check_prompt_len); TypeError or ValueError (one line) otherwise."""
        prompt_len = token_count("prompt_len", prompt_len)
        if prompt_len < 1:
            raise ValueError(f"--prompt-len {prompt_len} is invalid: use a positive number of tokens")
        self.check_prompt_len(prompt_len)
        return prompt_len

    def check_prompt_len(self, prompt_len: int) -> None:
        """ValueError when a prompt is longer than the policy's context length (its tables end there), or could take
        more than MAX_PLAN_CHUNKS chunks of its smallest."""
        context_len, smallest = self.settings.context_len, min(self.history_table.chunk_size)
        if prompt_len > context_len:
            raise ValueError(
                f"--prompt-len {prompt_len} exceeds the policy's context_len {context_len}: no prompt is "
                f"longer than the model's context; use a prompt of at most {context_len} tokens or a policy "
                "profiled with a larger --context-len"
            )
        if prompt_len > smallest * MAX_PLAN_CHUNKS:
            raise ValueError(
                f"--prompt-len {prompt_len} could take {-(-prompt_len // smallest)} chunks of the policy's "
                f"smallest, {smallest} tokens: a plan holds at most {MAX_PLAN_CHUNKS}; use a prompt of at "
                f"most {smallest * MAX_PLAN_CHUNKS} tokens"
            )


def token_count(name: str, value) -> int:
    """`value` as a Python int if it is an integer (a Python or numpy int); TypeError for anything else (a float, NaN
    and inf too, a bool, a string, None): a token count is never fractional, and a silent int() would hide a bug."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise TypeError(
        f"{name} must be an integer (a Python or numpy int) number of tokens, got {type(value).__name__} {short(value)}"
    )


def largest_chunk(policy: Policy) -> int:
    """The largest chunk any of the policy's rules gives (the prompt-aware rule's whole rest included, and the
    under-load rule's cap): what a server's chunk cap (SGLang's --max-prefill-tokens) must allow."""
    prompt_rule = policy.prompt_rule
    bands = (x for band in prompt_rule.chunk_size for x in band)
    load = [policy.load_rule.chunk_cap] if policy.load_rule is not None else []
    return max([prompt_rule.largest_chunk, *policy.history_table.chunk_size, *bands, *load])


def from_dict(data) -> Policy:
    """A Policy from a parsed policy file, checked whole as `ppprof validate` checks it: its version and the JSON
    Schema generated from the contract, the contract's parts (each checked in its own __post_init__), the report's
    numbers and structure, and the tables against the rules rebuilt; ValueError (one line naming the field)."""
    from ppprof.policy.rebuilt import check_rules  # the checks of a load, imported when a policy is read
    from ppprof.policy.structure import check_report, check_version_and_schema

    check_version_and_schema(data)
    policy = Policy.of(data)
    check_report(data)
    check_rules(policy)
    return policy


def from_text(text: str, label: str) -> Policy:
    """The Policy of a policy file's text, checked as from_dict checks it, after a strict JSON parse (no NaN or
    Infinity, bounded nesting); ValueError with one line starting with `label` otherwise. Both load and save call it."""
    try:
        data = parse_json(text, label, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"{label} is not readable JSON ({e})") from None
    except TooDeep:
        raise
    except ValueError as e:
        raise ValueError(f"{label} is not strict JSON: {e}; regenerate it with `ppprof fit`") from None
    try:
        return from_dict(data)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{label}: {e}") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def load(path: str | Path) -> Policy:
    """Read a policy file and check it as `ppprof validate` does; ValueError with one line naming the file and the
    field if it is missing, not strict JSON or not a valid policy. Every command that reads a policy calls this, and
    servers call it as `ppprof.policy.load(path)`."""
    path = Path(path)
    try:
        text = read_small_text(path, "policy file", "give a policy.json written by `ppprof fit`")
    except FileNotFoundError:
        raise ValueError(f"policy file {path} does not exist: run `ppprof fit` first") from None
    except IsADirectoryError:
        raise ValueError(f"policy file {path} is a folder: give the policy.json in it") from None
    except OSError as e:
        raise ValueError(f"policy file {path} is not readable ({e.strerror})") from None
    return from_text(text, f"policy file {path}")

"""The policy file: versioned JSON (schema, load, save, deep validation) and the server-facing Policy object."""

from __future__ import annotations

import json
import math
import numbers
from bisect import bisect_right
from pathlib import Path

import numpy as np

from ppprof.checks import is_int, short
from ppprof.chunks import walk
from ppprof.config import ChunkSettings
from ppprof.io import TooDeep, atomic_write_json, parse_json, read_small_text
from ppprof.policy.optimum import PromptRule, bounded_sizes
from ppprof.policy.rule import NO_CALIBRATION, LatencyModel, build_table

SCHEMA_VERSION = 3  # 3: the prompt-aware rule (prompt_table), the history-only table, the per-chunk overhead
MAX_PLAN_CHUNKS = 1_000_000
"""The most chunks a plan holds (Policy.plan, `ppprof plan`): its lists stay a few MB whatever the prompt."""
RULE_TEXT = (
    "a bounded rule: after L cached tokens the largest multiple of the unit <= the cap whose predicted latency "
    "t(L, x) + overhead is <= the bound, at least one unit. prompt_table: per band of prompt lengths, the bounded rule "
    "that plans within 1% of the DP optimum; the whole rest when it is at most the chunk + merge_len. table: the "
    "bounded rule with the least mean TTFT on the workload (no bound: fixed chunks of the cap)"
)


def table_chunk_size(starts: list[int], sizes: list[int], prefix_len: int) -> int:
    """The breakpoint table's chunk size after `prefix_len` tokens: sizes[i] for the last i with starts[i] <= it
    (Policy.next_chunk_size without a prompt length, less its argument checks)."""
    return sizes[bisect_right(starts, prefix_len) - 1]


def table_plan(starts: list[int], sizes: list[int], prompt_len: int) -> list[int]:
    """The chunk list of a `prompt_len`-token prompt under a breakpoint table (the last chunk takes the rest)."""
    return walk(lambda done: table_chunk_size(starts, sizes, done), prompt_len)


class Policy:
    """A loaded policy. `next_chunk_size(prefix_len, prompt_len)` is two bisects in the prompt-aware rule's tables;
    without the prompt length, one bisect in the history-only table."""

    __slots__ = (
        "data",
        "status",
        "reason",
        "model",
        "settings",
        "target_ms",
        "_starts",
        "_sizes",
        "base_chunk_size",
        "overhead_ms",
        "calibration",
        "planning_model",
        "num_stages",
        "provenance",
        "tp_size",
        "rule_tables",
        "_bands",
        "_band_starts",
        "_band_sizes",
        "_merge",
    )

    def __init__(self, data: dict):
        self.data = data
        self.status = data["status"]
        self.reason = data["reason"]
        try:
            self.model = None if data["latency_model"] is None else LatencyModel.from_dict(data["latency_model"])
        except ValueError as e:
            raise ValueError(f"$.latency_model: {e}") from None
        try:
            self.settings = ChunkSettings(**data["settings"])
        except ValueError as e:
            raise ValueError(f"$.settings: {e}") from None
        self.target_ms = data["target_latency_ms"]
        self.base_chunk_size = self.settings.base_chunk_size
        self.overhead_ms = float(data["overhead"]["ms_per_chunk"])
        self.calibration = data.get("calibration") or NO_CALIBRATION
        self.planning_model = None if self.model is None else self.model.planning(self.calibration, self.overhead_ms)
        self.num_stages = data.get("num_stages") or 1
        self.provenance = data.get("provenance") or {}  # where the numbers come from ({} where not recorded)
        self.tp_size = self.provenance.get("tp_size") or 1  # the TP degree of each profiled stage
        table, rule = data["table"], data["prompt_table"]
        self._starts, self._sizes = list(table["prefix_len"]), list(table["chunk_size"])
        self.rule_tables = PromptRule.from_dict(rule)
        self._bands, self._merge = self.rule_tables.prompt_len, self.rule_tables.merge_len
        self._band_starts, self._band_sizes = self.rule_tables.prefix_len, self.rule_tables.chunk_size

    def next_chunk_size(
        self, prefix_len: int | None = None, prompt_len: int | None = None, *, history_len: int | None = None
    ) -> int:
        """Size of the next prefill chunk of a prompt whose first `prefix_len` tokens are already in the cache.

        prompt_len: the prompt's length in tokens, where the server knows it: the chunk of the prompt-aware rule (the
        last chunk is the rest). Without it, the history-only table's chunk (the caller cuts the last chunk).
        history_len: alias of prefix_len kept for servers written against ppprof 0.1 / SGLang's name. Give exactly
        one of the two (TypeError otherwise).
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
        if prompt_len is None:
            return self._sizes[bisect_right(self._starts, prefix_len) - 1]
        if type(prompt_len) is not int:
            prompt_len = token_count("prompt_len", prompt_len)
        if prompt_len <= prefix_len:
            raise ValueError(
                f"prefix_len {prefix_len} leaves nothing of prompt_len {prompt_len} to prefill: ask only "
                "while tokens are left"
            )
        return self.rule_tables.next_chunk_size(prefix_len, prompt_len)

    def plan(self, prompt_len: int) -> list[int]:
        """The whole chunk list of a `prompt_len`-token prompt under the prompt-aware rule. ValueError beyond the
        policy's context length (no prompt is longer; the list stays bounded)."""
        return self.rule_tables.plan(self._checked_prompt(prompt_len))

    def plan_history(self, prompt_len: int) -> list[int]:
        """The chunk list under the history-only table (the last chunk takes the rest)."""
        return table_plan(self._starts, self._sizes, self._checked_prompt(prompt_len))

    def _checked_prompt(self, prompt_len) -> int:
        prompt_len = token_count("prompt_len", prompt_len)
        if prompt_len < 1:
            raise ValueError(f"--prompt-len {prompt_len} is invalid: use a positive number of tokens")
        check_prompt_len(self, prompt_len)
        return prompt_len

    def sglang_plan(self, prompt_len: int) -> list[int]:
        """The chunks of SGLang's equal-latency rule (target, smoothing, B // 4 floor, first chunk B) on the policy's
        fitted model and settings; fixed chunks of B without a model."""
        prompt_len = self._checked_prompt(prompt_len)
        if self.model is None or not self.target_ms:
            return walk(lambda _: self.base_chunk_size, prompt_len)
        starts, sizes = build_table(self.model, self.settings, self.target_ms)
        return table_plan(starts, sizes, prompt_len)


def largest_chunk(policy: Policy) -> int:
    """The largest chunk either of the policy's rules gives (the prompt-aware rule's whole rest included): what a
    server's chunk cap (SGLang's --max-prefill-tokens) must allow."""
    bands = policy.rule_tables
    return max([bands.largest_chunk, *policy._sizes, *(x for band in bands.chunk_size for x in band)])


def token_count(name: str, value) -> int:
    """`value` as a Python int if it is an integer (a Python or numpy int); TypeError for anything else (a float, NaN
    and inf too, a bool, a string, None): a token count is never fractional, and a silent int() would hide a bug."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise TypeError(
        f"{name} must be an integer (a Python or numpy int) number of tokens, got {type(value).__name__} {short(value)}"
    )


def check_prompt_len(policy: Policy, prompt_len: int) -> None:
    """ValueError when a prompt is longer than the policy's context length (its table ends there)."""
    context_len = policy.settings.context_len
    if prompt_len > context_len:
        raise ValueError(
            f"--prompt-len {prompt_len} exceeds the policy's context_len {context_len}: no prompt is "
            f"longer than the model's context; use a prompt of at most {context_len} tokens or a policy "
            "profiled with a larger --context-len"
        )
    smallest = min(policy._sizes)
    if prompt_len > smallest * MAX_PLAN_CHUNKS:
        raise ValueError(
            f"--prompt-len {prompt_len} could take {-(-prompt_len // smallest)} chunks of the policy's "
            f"smallest, {smallest} tokens: a plan holds at most {MAX_PLAN_CHUNKS}; use a prompt of at "
            f"most {smallest * MAX_PLAN_CHUNKS} tokens"
        )


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
        notes.append(
            f"prefixes up to {deepest}, {deepest / max(max_prefix, 1):.2f}x the largest profiled prefix ({max_prefix})"
        )
    if largest > max_chunk:
        notes.append(f"chunks up to {largest}, {largest / max_chunk:.2f}x the largest profiled chunk ({max_chunk})")
    if not notes:
        return None
    return (
        f"prompt {prompt_len} reaches " + " and ".join(notes) + ": the latency model is extrapolated there; "
        "profile with --prefix-lens (or --context-len) covering it"
    )


SCHEMA_FILE = Path(__file__).with_name("policy.schema.json")
"""The policy contract: a JSON Schema (draft 2020-12) of policy.json, shipped with the package; `ppprof validate
--schema` prints it. Servers in other languages validate against it."""
_validator = None


def policy_schema() -> dict:
    """The JSON Schema of policy.json (SCHEMA_FILE)."""
    return json.loads(SCHEMA_FILE.read_text())


def schema_validator():
    """A jsonschema validator of SCHEMA_FILE whose "integer" is an int, not a float such as 512.0 (jsonschema's
    own "integer" takes any float without a fraction; a server in C++ or Rust would read 512.0 as a double). jsonschema
    is imported here, not at module import: `import ppprof.policy` stays light."""
    global _validator
    if _validator is None:
        import jsonschema

        base = jsonschema.Draft202012Validator
        checker = base.TYPE_CHECKER.redefine("integer", lambda _, value: is_int(value))
        validator_class = jsonschema.validators.extend(base, type_checker=checker)
        schema = policy_schema()
        base.check_schema(schema)
        _validator = validator_class(schema)
    return _validator


def schema_error(data) -> str | None:
    """The most relevant violation of the schema, one line naming the field by its JSON path
    ("$.table.chunk_size[3]: 512.0 is not of type 'integer'"), or None."""
    import jsonschema

    error = jsonschema.exceptions.best_match(schema_validator().iter_errors(data))
    if error is None:
        return None
    if error.validator == "required":  # name the missing field itself, not the object that lacks it
        missing = next(k for k in error.validator_value if k not in error.instance)
        return f"{error.json_path}.{missing}: missing; it is required"
    if error.validator == "const":
        return f"{error.json_path}: {short(error.instance)} given, {error.validator_value!r} expected"
    message = error.message
    shown = repr(error.instance)
    if len(shown) > 60:  # keep the line short whatever the field holds
        message = message.replace(shown, short(error.instance))
    return f"{error.json_path}: {message}"


def check_breakpoints(where: str, starts: list[int], sizes: list[int]) -> None:
    """A breakpoint table's columns have one length, start at prefix 0 and increase strictly."""
    if len(starts) != len(sizes):
        raise ValueError(
            f"{where}: prefix_len has {len(starts)} entries but chunk_size {len(sizes)}: the columns "
            "must have one length"
        )
    if starts[0] != 0:
        raise ValueError(f"{where}.prefix_len[0]: {starts[0]}: a table starts at prefix_len 0")
    for i, (a, b) in enumerate(zip(starts, starts[1:])):
        if b <= a:
            raise ValueError(f"{where}.prefix_len[{i + 1}]: {b} after {a}: prefix_len must increase strictly")


def check_schema(data) -> None:
    """Raise ValueError (one line naming the field) unless `data` follows the policy schema (SCHEMA_FILE) and the
    structural rules a JSON Schema cannot say: the table's columns of one length, prefix_len strictly increasing,
    each domain range min <= max, coefficients finite."""
    if not isinstance(data, dict):
        raise ValueError(f"policy must be a JSON object, not a {type(data).__name__}: regenerate it with `ppprof fit`")
    if "schema_version" in data and data["schema_version"] != SCHEMA_VERSION:
        raise ValueError(
            f"policy schema_version {short(data['schema_version'])} is not supported: this ppprof reads "
            f"{SCHEMA_VERSION}; regenerate it with `ppprof fit`"
        )
    problem = schema_error(data)
    if problem:
        raise ValueError(f"{problem}; fix that field or regenerate the policy with `ppprof fit`")
    check_breakpoints("$.table", data["table"]["prefix_len"], data["table"]["chunk_size"])
    rule = data["prompt_table"]
    bands = rule["prompt_len"]
    for key in ("bound_ms", "merge_len", "prefix_len", "chunk_size"):
        if len(rule[key]) != len(bands):
            raise ValueError(f"$.prompt_table.{key}: {len(rule[key])} entries for {len(bands)} bands: give one a band")
    if bands[0] != 1:
        raise ValueError(f"$.prompt_table.prompt_len[0]: {bands[0]}: the first band starts at prompts of 1 token")
    for i, (a, b) in enumerate(zip(bands, bands[1:])):
        if b <= a:
            raise ValueError(f"$.prompt_table.prompt_len[{i + 1}]: {b} after {a}: band starts must increase strictly")
    for i, (starts, sizes) in enumerate(zip(rule["prefix_len"], rule["chunk_size"])):
        check_breakpoints(f"$.prompt_table.band[{i}]", starts, sizes)
    dom = data.get("domain")
    for key in ("prefix_len", "chunk_size") if dom else ():
        low, high = dom[key]
        if low > high:
            raise ValueError(f"$.domain.{key}: [{low}, {high}] must be [min, max] with min <= max")
    for key, entry in ((data.get("latency_model") or {}).get("coefficients") or {}).items():
        if not math.isfinite(entry["value"]):
            raise ValueError(f"$.latency_model.coefficients.{key}.value: {entry['value']} is not finite: refit")


def check_policy(policy: Policy) -> None:
    """What `ppprof validate` checks beyond the schema, ValueError (one line) on the first problem: the model
    predicts a positive latency for the smallest chunk; a static policy's tables are one fixed chunk; a dynamic one's
    tables are the bounded rules their bounds give on the planning model (checked at every breakpoint, both sides)."""
    if policy.model is not None:
        smallest = policy.settings.alignment
        t = float(policy.model.chunk_latency_ms(0, smallest))
        if not t > 0:
            raise ValueError(
                f"$.latency_model: predicts {t:.4g} ms for a {smallest}-token chunk: a latency must be "
                "positive; refit the samples"
            )
        t = float(policy.planning_model.chunk_latency_ms(0, smallest))
        if not t > 0:
            raise ValueError(
                f"$.calibration: the calibrated model predicts {t:.4g} ms for a {smallest}-token chunk: "
                "a latency must be positive; refit the samples"
            )
    if policy.status == "static":
        if len(policy._sizes) != 1 or policy._bands != [1] or policy._band_sizes != [policy._sizes]:
            raise ValueError("$.table: a static policy's table and prompt_table must be the one fixed chunk: refit")
        return
    rule, table = policy.data["prompt_table"], policy.data["table"]
    if policy.data.get("parity") is not None:  # SGLang's own rule on SGLang's fit
        starts, sizes = build_table(policy.model, policy.settings, policy.target_ms)
        if (
            (starts, sizes) != (policy._starts, policy._sizes)
            or policy._band_sizes != [sizes]
            or policy._band_starts != [starts]
        ):
            raise ValueError("$.table: a parity policy's tables must be SGLang's rule from its coefficients: refit")
        return
    unit, largest = rule["unit"], rule["largest_chunk"]
    check_bounded(
        "$.table", policy.planning_model, table["bound_ms"], table["chunk_cap"], unit, policy._starts, policy._sizes
    )
    for i, bound in enumerate(rule["bound_ms"]):
        check_bounded(
            f"$.prompt_table.band[{i}]",
            policy.planning_model,
            bound,
            largest,
            unit,
            policy._band_starts[i],
            policy._band_sizes[i],
        )


def check_bounded(
    where: str, model: LatencyModel, bound: float | None, cap: int, unit: int, starts: list[int], sizes: list[int]
) -> None:
    """The table is the bounded rule (bound, cap) on the model: its size at each breakpoint and just before the next.
    ValueError naming the entry otherwise."""
    bound = math.inf if bound is None else bound
    ends = [s - 1 for s in starts[1:]]
    at = np.array(starts + ends, dtype=np.int64)
    want = np.array(sizes + sizes[:-1], dtype=np.int64)
    got = bounded_sizes(model, np.full(len(at), bound), np.full(len(at), cap), at, unit)
    bad = np.flatnonzero(got != want)
    if bad.size:
        k = int(bad[0])
        raise ValueError(
            f"{where}: chunk {int(want[k])} at prefix_len {int(at[k])} is not the rule's {int(got[k])} "
            "from the coefficients, overhead and bound: refit"
        )


def from_dict(data) -> Policy:
    """A Policy from a parsed policy file, checked as `ppprof validate` checks it (check_schema, check_policy);
    ValueError (one line) otherwise."""
    check_schema(data)
    policy = Policy(data)
    check_policy(policy)
    return policy


def load_policy(path: str | Path) -> Policy:
    """Read a policy file and check it as `ppprof validate` does; ValueError with one line naming the file and the
    field if it is missing, not strict JSON or not a valid policy. Every command that reads a policy calls this."""
    path = Path(path)
    try:
        text = read_small_text(path, "policy file", "give a policy.json written by `ppprof fit`")
    except FileNotFoundError:
        raise ValueError(f"policy file {path} does not exist: run `ppprof fit` first") from None
    except IsADirectoryError:
        raise ValueError(f"policy file {path} is a folder: give the policy.json in it") from None
    except OSError as e:
        raise ValueError(f"policy file {path} is not readable ({e.strerror})") from None
    try:
        data = parse_json(text, f"policy file {path}", parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise ValueError(f"policy file {path} is not readable JSON ({e})") from None
    except TooDeep:
        raise
    except ValueError as e:
        raise ValueError(f"policy file {path} is not strict JSON: {e}; regenerate it with `ppprof fit`") from None
    try:
        return from_dict(data)
    except (ValueError, TypeError) as e:
        raise ValueError(f"policy file {path}: {e}") from None


load = load_policy
"""`ppprof.policy.load(path)`, the name servers use: load_policy."""


def _no_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def save(path: str | Path, data: dict) -> Path:
    """Check (schema) and write a policy atomically."""
    check_schema(data)
    Policy(data)
    return atomic_write_json(path, data)


def validate(policy: Policy) -> str:
    """Deep sanity check (check_policy); returns a one-line summary or raises ValueError with the reason."""
    check_policy(policy)
    return summary_line(policy)


def level_text(calibration: dict) -> str:
    """The calibration onto the pipelined level in words ("" where none)."""
    if calibration.get("source") != "measured":
        return ""
    return f", pipelined level {LatencyModel.level_words(calibration)}"


def summary_line(policy: Policy) -> str:
    """One line: status, model, the rules' sizes and the profiled domain."""
    if policy.status == "static":
        return f"static (chunk {policy._sizes[0]}): {policy.reason}{domain_text(policy)}"
    sizes = [x for band in policy._band_sizes for x in band]
    return (
        f"dynamic ({policy.model.name}, overhead {policy.overhead_ms:.3g} ms a chunk"
        f"{level_text(policy.calibration)}, {policy.num_stages} "
        f"stages): prompt-aware rule of {len(policy._bands)} bands, chunks {min(sizes)}-{max(sizes)}; "
        f"history-only table of {len(policy._sizes)} entries{domain_text(policy)}"
    )


def domain_text(policy: Policy) -> str:
    dom = policy.data.get("domain")
    if not isinstance(dom, dict):
        return ""
    (p0, p1), (c0, c1) = dom["prefix_len"], dom["chunk_size"]
    return f"; profiled prefixes {p0}-{p1}, chunks {c0}-{c1}"

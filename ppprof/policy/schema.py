"""The policy file: versioned JSON (schema, load, save, deep validation) and the server-facing Policy object."""

from __future__ import annotations

import json
import math
import numbers
from bisect import bisect_right
from pathlib import Path

from ppprof.checks import is_int, short
from ppprof.chunks import walk
from ppprof.io import atomic_write_json
from ppprof.config import ChunkSettings
from ppprof.policy.rule import LatencyModel, build_table, check_rule, next_chunk_size

SCHEMA_VERSION = 2  # 2: the table's prefix column is named prefix_len
MAX_PLAN_CHUNKS = 1_000_000
"""The most chunks a plan holds (Policy.plan, `ppprof plan`): its lists stay a few MB whatever the prompt."""
RULE_TEXT = (
    "L == 0: B; else x = positive root of a*x^2 + (2*a*L + b)*x + (g*L - T) = 0 (none: B; g*L >= T: x = 0), "
    "size = max(int(B + s*(x - B)), min_chunk_size), aligned down (at least one unit), "
    "capped at min(context_len - L - context_margin, max_chunk_size), aligned down again (0: B)"
)


def table_chunk_size(starts: list[int], sizes: list[int], prefix_len: int) -> int:
    """The breakpoint table's chunk size after `prefix_len` tokens: sizes[i] for the last i with starts[i] <= it
    (Policy.next_chunk_size, less its argument checks)."""
    return sizes[bisect_right(starts, prefix_len) - 1]


def table_plan(starts: list[int], sizes: list[int], prompt_len: int) -> list[int]:
    """The chunk list of a `prompt_len`-token prompt under a breakpoint table (the last chunk takes the rest)."""
    return walk(lambda done: table_chunk_size(starts, sizes, done), prompt_len)


class Policy:
    """A loaded policy. `next_chunk_size(prefix_len)` is one bisect in the precomputed breakpoint table."""

    __slots__ = ("data", "status", "reason", "model", "settings", "target_ms", "_starts", "_sizes", "base_chunk_size")

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
        if type(prefix_len) is not int:  # the fast path is a plain int; numpy ints are taken, floats and bools not
            prefix_len = token_count("prefix_len", prefix_len)
        if prefix_len < 0:
            raise ValueError(f"prefix_len {prefix_len} is negative: use the number of tokens already prefilled")
        return self._sizes[bisect_right(self._starts, prefix_len) - 1]

    def plan(self, prompt_len: int) -> list[int]:
        """The whole chunk list of a `prompt_len`-token prompt under this policy (the last chunk takes the rest).
        ValueError beyond the policy's context length (no prompt is longer; the list stays bounded)."""
        prompt_len = token_count("prompt_len", prompt_len)
        if prompt_len < 1:
            raise ValueError(f"--prompt-len {prompt_len} is invalid: use a positive number of tokens")
        check_prompt_len(self, prompt_len)
        return table_plan(self._starts, self._sizes, prompt_len)

    def rule(self, prefix_len: int) -> int:
        """The rule evaluated directly from the coefficients (slow path; equals next_chunk_size)."""
        if self.status == "static":
            return self.base_chunk_size
        return next_chunk_size(self.model, self.settings, self.target_ms, prefix_len)


def token_count(name: str, value) -> int:
    """`value` as a Python int if it is an integer (a Python or numpy int); TypeError for anything else (a float, NaN
    and inf too, a bool, a string, None): a token count is never fractional, and a silent int() would hide a bug."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    raise TypeError(f"{name} must be an integer (a Python or numpy int) number of tokens, got "
                    f"{type(value).__name__} {short(value)}")


def check_prompt_len(policy: Policy, prompt_len: int) -> None:
    """ValueError when a prompt is longer than the policy's context length (its table ends there)."""
    context_len = policy.settings.context_len
    if prompt_len > context_len:
        raise ValueError(f"--prompt-len {prompt_len} exceeds the policy's context_len {context_len}: no prompt is "
                         f"longer than the model's context; use a prompt of at most {context_len} tokens or a policy "
                         "profiled with a larger --context-len")
    smallest = min(policy._sizes)
    if prompt_len > smallest * MAX_PLAN_CHUNKS:
        raise ValueError(f"--prompt-len {prompt_len} could take {-(-prompt_len // smallest)} chunks of the policy's "
                         f"smallest, {smallest} tokens: a plan holds at most {MAX_PLAN_CHUNKS}; use a prompt of at "
                         f"most {smallest * MAX_PLAN_CHUNKS} tokens")


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
    starts, sizes = data["table"]["prefix_len"], data["table"]["chunk_size"]
    if len(starts) != len(sizes):
        raise ValueError(f"$.table: prefix_len has {len(starts)} entries but chunk_size {len(sizes)}: the columns "
                         "must have one length")
    for i, (a, b) in enumerate(zip(starts, starts[1:])):
        if b <= a:
            raise ValueError(f"$.table.prefix_len[{i + 1}]: {b} after {a}: prefix_len must increase strictly")
    dom = data.get("domain")
    for key in ("prefix_len", "chunk_size") if dom else ():
        low, high = dom[key]
        if low > high:
            raise ValueError(f"$.domain.{key}: [{low}, {high}] must be [min, max] with min <= max")
    for key, entry in ((data.get("latency_model") or {}).get("coefficients") or {}).items():
        if not math.isfinite(entry["value"]):
            raise ValueError(f"$.latency_model.coefficients.{key}.value: {entry['value']} is not finite: refit")


def check_policy(policy: Policy) -> None:
    """What `ppprof validate` checks beyond the schema, ValueError (one line) on the first problem: a static
    table is one entry of B; a dynamic policy's rule (from its coefficients) is aligned, within its clamps and
    non-increasing, and its table is the one the rule gives; the model predicts a positive latency for the
    smallest chunk."""
    B = policy.base_chunk_size
    if policy.model is not None:
        smallest = policy.settings.alignment
        t = float(policy.model.chunk_latency_ms(0, smallest))
        if not t > 0:
            raise ValueError(f"$.latency_model: predicts {t:.4g} ms for a {smallest}-token chunk: a latency must be "
                             "positive; refit the samples")
    if policy.status == "static":
        if policy._starts != [0] or policy._sizes != [B]:
            raise ValueError(f"$.table: static policy table must be one entry (0 -> {B})")
        return
    try:
        check_rule(policy.model, policy.settings, policy.target_ms)
    except ValueError as e:
        raise ValueError(f"$.latency_model: the rule from these coefficients and settings is unusable: {e}; "
                         "refit") from None
    expected = make_table(policy.model, policy.settings, policy.target_ms, "dynamic")
    if expected != {"prefix_len": policy._starts, "chunk_size": policy._sizes}:
        raise ValueError("$.table: policy table does not match the rule recomputed from its coefficients: refit")


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
        data = json.loads(path.read_text(), parse_constant=_no_constant)
    except FileNotFoundError:
        raise ValueError(f"policy file {path} does not exist: run `ppprof fit` first") from None
    except IsADirectoryError:
        raise ValueError(f"policy file {path} is a folder: give the policy.json in it") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"policy file {path} is not readable JSON ({e})") from None
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


def summary_line(policy: Policy) -> str:
    """One line: status, model, table size, the chunk range and the profiled domain."""
    B = policy.base_chunk_size
    if policy.status == "static":
        return f"static (base chunk {B}): {policy.reason}{domain_text(policy)}"
    smallest = min(policy._sizes)
    return (f"dynamic ({policy.model.name}), {len(policy._sizes)} table entries, chunk {B} -> {smallest}"
            f"{domain_text(policy)}")


def domain_text(policy: Policy) -> str:
    dom = policy.data.get("domain")
    if not isinstance(dom, dict):
        return ""
    (p0, p1), (c0, c1) = dom["prefix_len"], dom["chunk_size"]
    return f"; profiled prefixes {p0}-{p1}, chunks {c0}-{c1}"

"""The policy contract: what a server reads of policy.json as frozen values, each checked and bounded in its own
__post_init__ (ValueError: one line naming the JSON field, the value, the fix): the latency model, the calibration
(`Calibration`), the per-chunk overhead, the two tables and the under-load rule; `ppprof.policy.runtime.Policy` holds
them with the settings and the status. Standard library and the ground floors only (no numpy)."""

from __future__ import annotations

import math
import sys
from bisect import bisect_right
from dataclasses import dataclass, replace

from ppprof.bounds import MAX_STAGES, MAX_TOKENS
from ppprof.checks import is_int, is_number, short
from ppprof.chunks import positive_root, walk

SCHEMA_VERSION = NESTED_VERSION = 6
"""6: the report in its own object (`report`, ppprof.policy.runtime.Report; before, its fields beside the contract's);
5: the full-pipeline under-load rule; 4: a pending-count one; 3: the prompt-aware rule, the overhead."""
READ_VERSIONS = (3, 4, 5, SCHEMA_VERSION)
"""The versions read: a policy of schema 3 has no under-load rule, and one of schema 4 a rule keyed by the count of
pending requests that is not read (LOAD_RULE_VERSION); both answer at every load as with none."""
REPORT_ORDER = ("target_chunk_latency_ms", "rule", "diagnostics", "provenance", "domain", "workload", "predicted")
REPORT_ORDER += ("parity", "design", "packed_forwards")
"""The report's fields in the order the fit writes them (the last two, OPTIONAL, where recorded)."""
OPTIONAL = ("design", "packed_forwards")
RENAMED = (("provenance", "world_size", "pp_size"),)
"""The report's fields schema 6 renamed, (part, old name, new name): the provenance's stages (world_size: ranks)."""


def nested_layout(data) -> bool:
    """Whether `data` says a version of schema 6's layout, the report in its own object (NESTED_VERSION on)."""
    return isinstance(data, dict) and is_int(data.get("schema_version")) and data["schema_version"] >= NESTED_VERSION


STATUSES = ("dynamic", "static")
"""A policy's status: its tables follow the rules (dynamic), or every chunk is the best fixed one (static)."""
FIX = "fix that field or regenerate the policy with `ppprof fit`"
MAX_LATENCY_MS = 1e7
"""The largest latency a policy holds, ms (about 2.8 hours a chunk): a target, a bound, the overhead, the
calibration's shift; and the largest coefficient in its unit (ms per token^k: a one-token chunk's cost)."""
MAX_LINEAR_SCALE = 1e3
"""The largest calibration linear_scale read (a fit applies one in 0.5..2 only)."""
MAX_COUNT = 2**53
"""The largest count summed over a whole profile: exact in a double, as JSON readers in other languages hold it."""
MAX_FILL = 1e3
"""The largest `fill` of an under-load rule read (a fit tries a few, about 1)."""


@dataclass(frozen=True, slots=True)
class Bound:
    """A number's range, low..high, and what the range is, in words."""

    low: float
    high: float
    what: str

    def check(self, where: str, value) -> None:
        """ValueError naming `where`, the value and the range where `value` is not a number within it."""
        if not is_number(value):
            raise ValueError(f"{where}: {short(value)} is not a number: it is {self.what}; {FIX}")
        if not self.low <= value <= self.high:
            low, high = number_text(self.low), number_text(self.high)
            raise ValueError(f"{where}: {short(value)} is outside {low}..{high}, the range of {self.what}; {FIX}")

    def check_all(self, where: str, values) -> None:
        for i, value in enumerate(values):
            self.check(f"{where}[{i}]", value)


def number_text(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


TOKENS = Bound(0, MAX_TOKENS, "a token count (servers index tokens with int32)")
STAGES = Bound(1, MAX_STAGES, "pipeline stages (ppprof's --pp-size bound)")
LATENCY = Bound(0, MAX_LATENCY_MS, "a latency in ms")
SIGNED_LATENCY = Bound(-MAX_LATENCY_MS, MAX_LATENCY_MS, "a latency in ms")
COEFFICIENT = Bound(-MAX_LATENCY_MS, MAX_LATENCY_MS, "a coefficient in its unit (a one-token chunk's cost)")
SCALE = Bound(0, MAX_LINEAR_SCALE, "a linear scale")
COUNT = Bound(0, MAX_COUNT, "a count exact in a double")
FILL = Bound(0, MAX_FILL, "how many times over the work fills the slots")
SETTINGS_TOKENS = ("base_chunk_size", "page_size", "alignment", "min_chunk_size", "max_chunk_size", "context_len")
CONTRACT_FIELDS = (
    *((f"settings.{k}", TOKENS) for k in (*SETTINGS_TOKENS, "context_margin")),
    ("latency_model.coefficients.*.value", COEFFICIENT),
    ("target_latency_ms", LATENCY),
    ("overhead.ms_per_chunk", LATENCY),
    ("overhead.stderr_ms", LATENCY),
    ("calibration.linear_scale", SCALE),
    ("calibration.shift_ms", SIGNED_LATENCY),
    ("num_stages", STAGES),
    ("table.prefix_len[]", TOKENS),
    ("table.chunk_size[]", TOKENS),
    ("table.bound_ms", LATENCY),
    ("table.chunk_cap", TOKENS),
    *((f"prompt_table.{k}[]", TOKENS) for k in ("prompt_len", "merge_len")),
    ("prompt_table.bound_ms[]", LATENCY),
    *((f"prompt_table.{k}[][]", TOKENS) for k in ("prefix_len", "chunk_size")),
    *((f"prompt_table.{k}", TOKENS) for k in ("unit", "largest_chunk", "max_prompt_len")),
    ("load.slots", COUNT),
    ("load.fill", FILL),
    ("load.unit", TOKENS),
    ("load.floor", TOKENS),
    ("load.full.bound_ms", LATENCY),
    ("load.full.chunk_cap", TOKENS),
)
"""The bound of every number of the contract (a path's `[]` is each item of a list, `*` each value of an object), as
its parts check them: in __post_init__, or in from_dict for what the file keeps beside a class's fields (a table's
bound and cap, the coefficients' values; the settings, which Policy.of checks before ChunkSettings so that the line
names the JSON field). ppprof.policy.numbers adds the report's."""


def check_optional(where: str, value, bound: Bound) -> None:
    """bound.check where `value` is given (None: an absent field, not checked)."""
    if value is not None:
        bound.check(where, value)


MODEL_NAMES = ("quadratic", "prefix", "pairs")
COEF_UNITS = {"a": "ms/token^2", "b": "ms/token", "c": "ms", "g": "ms/token", "h": "ms/token^3"}
MODEL_COEFS = {"quadratic": ("a", "b", "c"), "prefix": ("a", "b", "c", "g"), "pairs": ("a", "b", "c", "g", "h")}
FORMS = {
    "quadratic": "f(l) = a*l^2 + b*l + c, fitted on prefix-free samples (l = chunk_size); chunk c + f(L+x) - f(L)",
    "prefix": "t(L, x) = c + g*L + b*x + a*(2*L*x + x^2), L = prefix_len, x = chunk_size",
    "pairs": "t(L, x) = c + g*L + b*x + a*(2*L*x + x^2) + h*L*x^2: the cost of a query-key pair across the prefix, "
    "a + h*x/2, changes with the chunk size (h < 0: larger chunks reuse each key over more queries)",
}
NO_CALIBRATION = {"linear_scale": 1.0, "shift_ms": 0.0, "source": "none"}
CALIBRATION_KEYS = tuple(NO_CALIBRATION)
"""The policy's calibration where none was measured (LatencyModel.planning leaves the model as fitted)."""


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """Fitted coefficients (COEF_UNITS) of one of MODEL_NAMES; those the model lacks (MODEL_COEFS) are 0. A chunk of
    x new tokens after L cached ones costs t(L, x) = c + g L + b x + a (2 L x + x^2) + h L x^2 (ppprof.policy.rule)."""

    name: str
    a: float
    b: float
    c: float
    g: float = 0.0
    h: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in MODEL_NAMES:
            raise ValueError(f"latency model {self.name!r} is unknown: use one of {', '.join(MODEL_NAMES)}")
        for key in COEF_UNITS:
            value = getattr(self, key)
            if not math.isfinite(value):
                raise ValueError(f"latency model coefficient {key}={value} is not finite: refit the samples")
            if key not in MODEL_COEFS[self.name] and value != 0.0:
                raise ValueError(
                    f"{self.name} latency model has {key}={value}: {key} must be 0 (use a model with that term)"
                )

    def chunk_latency_ms(self, prefix_len, chunk_size):
        """Latency of a chunk of `chunk_size` new tokens after `prefix_len` cached tokens: on numbers, or on arrays
        (numpy's float arrays, as every fit and planner passes them; numpy is never imported here, a caller with
        arrays has it). What the planner sums, what each model's fit is scored with, and (for a prefix-free sample,
        prefix_len = 0) the quadratic's f(chunk_size)."""
        np = sys.modules.get("numpy")
        if np is None:  # plain numbers: nothing else could be given without numpy
            return self.one_chunk_ms(prefix_len, chunk_size)
        L = np.asarray(prefix_len, dtype=float)
        x = np.asarray(chunk_size, dtype=float)
        t = self.c + self.g * L + self.b * x + self.a * (2.0 * L * x + x * x)
        return t + self.h * L * x * x if self.h else t

    def one_chunk_ms(self, prefix_len: int, chunk_size: int) -> float:
        """chunk_latency_ms of one chunk in plain floats: what a simulation or a server's sizer asks per chunk, where
        numpy's per-call cost is most of the time."""
        L, x = float(prefix_len), float(chunk_size)
        return self.c + self.g * L + self.b * x + self.a * (2.0 * L * x + x * x) + self.h * L * x * x

    def with_overhead(self, ms_per_chunk: float) -> LatencyModel:
        """This model with the per-chunk pipeline overhead added to every chunk's fixed cost."""
        return replace(self, c=self.c + ms_per_chunk) if ms_per_chunk else self

    def planning(self, calibration: dict | None, ms_per_chunk: float) -> LatencyModel:
        """The planning model: the policy's calibration onto the pipelined runs, linear_scale * (c + b x) + the
        attention terms + shift_ms (none: 1 and 0), plus the per-chunk pipeline overhead."""
        calibration = calibration or NO_CALIBRATION
        scale, shift = float(calibration["linear_scale"]), float(calibration["shift_ms"])
        model = self if scale == 1.0 else replace(self, b=self.b * scale, c=self.c * scale)
        return model.with_overhead(shift + ms_per_chunk)

    @staticmethod
    def calibration_words(calibration: dict) -> str:
        """A calibration in words: "linear_scale (c + b x) +shift ms"."""
        return f"{calibration['linear_scale']:.3f} (c + b x) {calibration['shift_ms']:+.3g} ms"

    def target_ms(self, base_chunk_size: int) -> float:
        """Target T of the equal-latency rule: the variable latency of a B-token first chunk.

        quadratic: T = f(B) - f(0), computed literally as SGLang does (so floats round the same way).
        prefix, pairs: T = t(0, B) - c = b B + a B^2 (the fixed cost c is paid by every chunk and drops out).
        """
        B = base_chunk_size
        if self.name == "quadratic":
            return sglang_f(self, B) - sglang_f(self, 0)
        B = float(B)
        return self.b * B + self.a * B * B

    def equal_latency_chunk(self, prefix_len: int, target_ms: float) -> float | None:
        """Chunk size x whose variable latency after `prefix_len` tokens equals the target.

        Solves (a + h L) x^2 + (2 a L + b) x + (g L - T) = 0, i.e. t(L, x) - c = T (for quadratic, g = h = 0 and
        this is f(L + x) - f(L) = T, SGLang's equation). Returns the positive root; 0.0 when the prefix cost g L alone
        already reaches T (then the shortest chunk is best, and the caller's floor applies); None when there is
        no root (the caller then uses the base chunk size, as SGLang does).
        """
        L = float(prefix_len)
        qa = self.a + self.h * L if self.h else self.a
        qb = 2.0 * self.a * L + self.b
        qc = self.g * L - target_ms
        if qc >= 0.0:
            return 0.0 if self.g > 0.0 else None
        if qa == 0.0:
            return -qc / qb if qb > 0.0 else None
        return positive_root(qa, qb, qc)

    def to_dict(self) -> dict:
        coefs = {k: {"value": getattr(self, k), "unit": COEF_UNITS[k]} for k in MODEL_COEFS[self.name]}
        return {"name": self.name, "form": FORMS[self.name], "coefficients": coefs}

    @classmethod
    def from_dict(cls, d: dict) -> LatencyModel:
        """The model of a policy's latency_model, each coefficient within COEFFICIENT; ValueError (one line)."""
        if not isinstance(d, dict) or "name" not in d or not isinstance(d.get("coefficients"), dict):
            raise ValueError("latency_model must be an object with 'name' and 'coefficients': refit the samples")
        coefs = d["coefficients"]
        values = {}
        for key in COEF_UNITS:
            entry = coefs.get(key, {"value": 0.0} if key in ("g", "h") else None)
            if not isinstance(entry, dict) or not isinstance(entry.get("value"), (int, float)):
                raise ValueError(f"latency_model.coefficients.{key} must be {{'value': number, 'unit': str}}")
            if key in coefs and entry.get("unit") != COEF_UNITS[key]:
                raise ValueError(
                    f"latency_model.coefficients.{key} has unit {entry.get('unit')!r}: expected {COEF_UNITS[key]!r}"
                )
            if key in coefs:
                COEFFICIENT.check(f"$.latency_model.coefficients.{key}.value", entry["value"])
            values[key] = float(entry["value"])
        return cls(name=d["name"], **values)


def sglang_f(model: LatencyModel, l):
    """SGLang's f(l) = a*l*l + b*l + c, evaluated in its order ((a*l)*l, not a*l**2) so floats round the same way."""
    return model.a * l * l + model.b * l + model.c


@dataclass(frozen=True, slots=True)
class Overhead:
    """The per-chunk pipeline overhead (the file's `overhead`): what a chunk costs on the real pipeline beyond its
    stages' timed forwards, added to every chunk's predicted latency; measured, given or none (0)."""

    ms_per_chunk: float
    stderr_ms: float | None
    """Its uncertainty (None where not measured)."""
    source: str
    """measured, given or none."""

    def __post_init__(self) -> None:
        LATENCY.check("$.overhead.ms_per_chunk", self.ms_per_chunk)
        check_optional("$.overhead.stderr_ms", self.stderr_ms, LATENCY)

    @classmethod
    def from_dict(cls, d: dict) -> Overhead:
        return cls(d["ms_per_chunk"], d["stderr_ms"], d["source"])


@dataclass(frozen=True, slots=True)
class Calibration:
    """The calibration (the file's `calibration`): the fitted latency mapped onto the bottleneck stage's forwards
    in the profile's pipelined runs, linear_scale (c + b x) + the attention terms + shift_ms; 1 and 0 where none."""

    linear_scale: float
    shift_ms: float
    source: str
    """measured or none."""

    def __post_init__(self) -> None:
        SCALE.check("$.calibration.linear_scale", self.linear_scale)
        SIGNED_LATENCY.check("$.calibration.shift_ms", self.shift_ms)

    def __getitem__(self, key: str):
        """calibration["linear_scale"], as readers of the file's dict ask it (LatencyModel.planning too)."""
        if key not in CALIBRATION_KEYS:
            raise KeyError(key)
        return getattr(self, key)

    def get(self, key: str, default=None):
        return self[key] if key in CALIBRATION_KEYS else default

    def to_dict(self) -> dict:
        return {key: self[key] for key in CALIBRATION_KEYS}

    @classmethod
    def from_dict(cls, d: dict | None) -> Calibration:
        d = d or NO_CALIBRATION
        return cls(d["linear_scale"], d["shift_ms"], d["source"])


def check_breakpoints(where: str, starts: list[int], sizes: list[int]) -> None:
    """A breakpoint table's columns have one length, start at prefix 0 and increase strictly."""
    if len(starts) != len(sizes):
        raise ValueError(
            f"{where}: prefix_len has {len(starts)} entries but chunk_size {len(sizes)}: the columns "
            "must have one length"
        )
    if starts[0] != 0:
        raise ValueError(f"{where}.prefix_len[0]: {starts[0]}: a table starts at prefix_len 0")
    increasing(f"{where}.prefix_len", starts, "prefix_len")


def increasing(where: str, values: list, what: str) -> None:
    """ValueError naming the first entry of `values` (the column at `where`) not above the one before it."""
    for i, (a, b) in enumerate(zip(values, values[1:])):
        if b <= a:
            raise ValueError(f"{where}[{i + 1}]: {b} after {a}: {what} must increase strictly")


def one_a_row(where: str, columns: dict, rows: int, row: str) -> None:
    """ValueError naming the first of `columns` (name: list, at `where`) whose length is not `rows` (one a `row`)."""
    for key, column in columns.items():
        if len(column) != rows:
            raise ValueError(f"{where}.{key}: {len(column)} entries for {rows} {row}s: give one a {row}")


@dataclass(frozen=True, slots=True)
class HistoryTable:
    """The history-only table as it is stored (the file's `table`): after L cached tokens the next chunk is
    chunk_size[i] for the last i with prefix_len[i] <= L (the caller cuts the last chunk)."""

    prefix_len: list[int]
    chunk_size: list[int]

    def __post_init__(self) -> None:
        TOKENS.check_all("$.table.prefix_len", self.prefix_len)
        TOKENS.check_all("$.table.chunk_size", self.chunk_size)
        check_breakpoints("$.table", self.prefix_len, self.chunk_size)

    def next_chunk_size(self, prefix_len: int) -> int:
        return self.chunk_size[bisect_right(self.prefix_len, prefix_len) - 1]

    def plan(self, prompt_len: int) -> list[int]:
        return walk(self.next_chunk_size, prompt_len)

    @classmethod
    def from_dict(cls, d: dict) -> HistoryTable:
        check_optional("$.table.bound_ms", d.get("bound_ms"), LATENCY)
        check_optional("$.table.chunk_cap", d.get("chunk_cap"), TOKENS)
        return cls(list(d["prefix_len"]), list(d["chunk_size"]))


@dataclass(frozen=True, slots=True)
class PromptRule:
    """The prompt-aware rule as it is stored (the file's `prompt_table`): band i holds the prompts of prompt_len[i]
    .. prompt_len[i+1] - 1 tokens; after L cached tokens of such a prompt of N tokens, the next chunk is
    x = chunk_size[i][j] for the last j with prefix_len[i][j] <= L, or the whole rest N - L where that is at most
    x + merge_len[i] and largest_chunk. A bound of inf is none (null in the file)."""

    prompt_len: list[int]
    bound_ms: list[float]
    merge_len: list[int]
    prefix_len: list[list[int]]
    chunk_size: list[list[int]]
    largest_chunk: int

    def __post_init__(self) -> None:
        where = "$.prompt_table"
        for key in ("prompt_len", "merge_len"):
            TOKENS.check_all(f"{where}.{key}", getattr(self, key))
        for i, bound in enumerate(self.bound_ms):
            if bound != math.inf:
                LATENCY.check(f"{where}.bound_ms[{i}]", bound)
        for key in ("prefix_len", "chunk_size"):
            for i, band in enumerate(getattr(self, key)):
                TOKENS.check_all(f"{where}.{key}[{i}]", band)
        TOKENS.check(f"{where}.largest_chunk", self.largest_chunk)
        columns = {k: getattr(self, k) for k in ("bound_ms", "merge_len", "prefix_len", "chunk_size")}
        one_a_row(where, columns, len(self.prompt_len), "band")
        if self.prompt_len[0] != 1:
            raise ValueError(
                f"{where}.prompt_len[0]: {self.prompt_len[0]}: the first band starts at prompts of 1 token"
            )
        increasing(f"{where}.prompt_len", self.prompt_len, "band starts")
        for i, (starts, sizes) in enumerate(zip(self.prefix_len, self.chunk_size)):
            check_breakpoints(f"{where}.band[{i}]", starts, sizes)

    def next_chunk_size(self, prefix_len: int, prompt_len: int) -> int:
        i = bisect_right(self.prompt_len, prompt_len) - 1
        x = self.chunk_size[i][bisect_right(self.prefix_len[i], prefix_len) - 1]
        rest = prompt_len - prefix_len
        return rest if rest <= min(x + self.merge_len[i], self.largest_chunk) else x

    def plan(self, prompt_len: int) -> list[int]:
        return walk(lambda done: self.next_chunk_size(done, prompt_len), prompt_len)

    def to_dict(self, dom) -> dict:
        """The policy's prompt_table (a bound of inf: null), with the domain's unit and longest prompt
        (ppprof.policy.optimum.Domain)."""
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
        for key in ("unit", "max_prompt_len"):
            TOKENS.check(f"$.prompt_table.{key}", d[key])
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


LOAD_RULE_VERSION = 5
"""The schema whose `load` is the full-pipeline rule (LoadRule); schema 4's (a count of pending requests tuned to one
workload) is kept in the file but not read."""


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

    def __post_init__(self) -> None:
        COUNT.check("$.load.slots", self.slots)
        FILL.check("$.load.fill", self.fill)
        TOKENS.check("$.load.unit", self.unit)
        check_optional("$.load.floor", self.floor, TOKENS)
        if self.bound_ms != math.inf:
            LATENCY.check("$.load.full.bound_ms", self.bound_ms)
        TOKENS.check("$.load.full.chunk_cap", self.chunk_cap)

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


def bounded_chunk(model: LatencyModel, bound_ms: float, cap: int, prefix_len: int, unit: int) -> int:
    """A bounded rule's chunk after `prefix_len` (bound M, cap X): the largest multiple of the unit x <= X with
    t(L, x) <= M, at least one unit, in plain floats (as a server's sizer asks it; ppprof.policy.bounded has it at
    many prefixes at once): the root of (a + h L) x^2 + (2 a L + b) x + (c + g L - M) = 0, aligned down, one unit
    down where rounding left it over the bound."""
    L = float(prefix_len)
    qa, qb, qc = model.a + model.h * L, 2.0 * model.a * L + model.b, model.c + model.g * L - bound_ms
    if not math.isfinite(bound_ms):
        root = math.inf
    elif qa != 0:
        disc = qb * qb - 4.0 * qa * qc
        root = math.inf if qa < 0 and disc < 0 else (-qb + math.sqrt(max(disc, 0.0))) / (2.0 * qa)
    else:
        root = -qc / qb if qb > 0 else math.inf
    x = max(unit, min(int(min(root, cap) // unit) * unit, cap))
    return x - unit if x > unit and model.one_chunk_ms(prefix_len, x) > bound_ms else x

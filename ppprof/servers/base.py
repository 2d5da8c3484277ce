"""What every server module provides (the Server interface) and what they share: the ServerSetting dataclass, the
bounds checks, and the root the servers' rules solve (reading and writing their command lines: ppprof.servers.flags). Pure Python and
numpy; no torch."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, replace
from typing import Protocol

from ppprof.checks import is_int
from ppprof.chunks import align_down, default_alignment, positive_root, walk
from ppprof.config.chunk import ChunkSizes
from ppprof.policy.rule import FORMS, LatencyModel
from ppprof.policy.runtime import Policy
from ppprof.servers.boot import Forwards, prefix_free_quadratic
from ppprof.servers.flags import CALIBRATION, DYNAMIC, parse_number, read_flags, split_command

PP_SIZE, TP_SIZE = "pp_size", "tp_size"
"""The parallel layout a policy was profiled at (its provenance's pp_size and tp_size), in a server's flags."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ServerSetting(ChunkSizes):
    """One server's chunking flags: the five chunk sizes in ppprof's words (each server module says which of its flags
    sets which field; max_chunk_size is the cap of every chunk), whether dynamic chunking is on, and the server."""

    server: str
    dynamic: bool

    def fields(self) -> dict:
        """Every field but the server's name, in the order `tune --json` writes them."""
        return {k: getattr(self, k) for k in SERVER_FIELDS}

    def to_dict(self) -> dict:
        return {"server": self.server, **self.fields()}

    @classmethod
    def from_dict(cls, d: dict) -> ServerSetting:
        return cls(**{k: d[k] for k in ("server", *SERVER_FIELDS)})


SERVER_FIELDS = ("base_chunk_size", "dynamic", "smooth_factor", "min_chunk_size", "max_chunk_size", "page_size")
"""A ServerSetting's fields but the server's name, in the order its to_dict writes them."""


class Rule(Protocol):
    """A server's next-chunk rule: `next(L)` is the chunk it prefills after L tokens (before the prompt's remainder
    limits it)."""

    def next(self, prefix_len: int) -> int: ...


class Server(ABC):
    """What ppprof knows of one server's chunking: defaults, boot fit, next-chunk rule, flags out and in, why its
    chunks differ from a policy's, and the settings `ppprof tune` tries. One subclass per server module."""

    name: str
    """The registry key: the value of --server."""
    label: str
    """The server's name in messages."""
    targets: str
    """The documentation the rule here is re-derived from."""
    form: str
    """The latency model form it sizes chunks with (ppprof.policy.rule.FORMS)."""
    context_margin: int
    """Tokens its rule keeps free at the end of the context."""
    flag_keys: dict[str, str]
    """Its flags (and environment variables) -> the ServerSetting field they set (or CALIBRATION)."""
    parallel_flags: dict[str, str] = {"--pp-size": PP_SIZE, "--tp-size": TP_SIZE}
    """Its flags of the pipeline stages and the TP degree (the first of each is the one written) -> PP_SIZE or
    TP_SIZE. A policy holds for the layout it was profiled at, so an export and a tune carry these too."""
    fits_at_boot: bool = True
    """It fits its latency model to prefix-free forwards at start-up (`boot_fit`); else its flags carry one."""

    # --- defaults and the policy's settings in its terms -------------------------------------------------------------

    @abstractmethod
    def default_setting(self, page_size: int = 1) -> ServerSetting:
        """Its settings when the user gives none."""

    def setting_of(self, policy: Policy) -> ServerSetting:
        """The policy's settings in its terms: B, the smoothing factor, the floor and the cap. By default B is the
        token budget and so the cap too (a policy's lower cap from the second chunk on has no flag)."""
        s = policy.settings
        return ServerSetting(
            server=self.name,
            base_chunk_size=s.base_chunk_size,
            dynamic=policy.status == "dynamic",
            smooth_factor=s.smooth_factor,
            min_chunk_size=s.min_chunk_size,
            max_chunk_size=s.base_chunk_size,
            page_size=s.page_size,
        )

    def alignment(self, page_size: int) -> int:
        """The unit its chunk sizes are multiples of."""
        return default_alignment(page_size)

    def fixed_chunk_size(self, setting: ServerSetting) -> int:
        """The chunk size with dynamic chunking off."""
        return setting.base_chunk_size

    # --- the model it sizes chunks with ------------------------------------------------------------------------------

    @abstractmethod
    def boot_model(self, model: LatencyModel | None, domain: dict | None = None) -> LatencyModel | None:
        """The model it sizes chunks with when `model` is the truth (its clamps applied); None: it keeps chunks
        fixed."""

    def boot_fit(self, forwards: Forwards) -> LatencyModel | None:
        """The model it fits at start-up to these forwards: the prefix-free least squares with its clamps; None: it
        keeps chunks fixed."""
        return self.boot_model(prefix_free_quadratic(forwards).model)

    def model_for(self, policy: Policy, forwards: Forwards | None = None) -> LatencyModel | None:
        """The model it sizes chunks with beside this policy: its boot fit of `forwards` (the profile's samples)
        where given and it fits at boot, else derived from the policy's model."""
        if forwards is not None and self.fits_at_boot:
            return self.boot_fit(forwards)
        return self.boot_model(policy.latency_model, policy.report.domain)

    def calibration(self, policy: Policy) -> LatencyModel | None:
        """The latency model its flags carry for this policy (format_flags' `calibration`); None for a server that
        fits its own."""
        return None

    # --- its rule --------------------------------------------------------------------------------------------------

    @abstractmethod
    def rule(self, setting: ServerSetting, model: LatencyModel | None, context_len: int) -> Rule:
        """Its next-chunk rule with `setting`, the model it has and a context of `context_len` tokens."""

    def chunks(
        self, setting: ServerSetting, model: LatencyModel | None, context_len: int, prompt_len: int
    ) -> list[int]:
        """The chunks it prefills a `prompt_len`-token prompt in: its rule where dynamic, else fixed chunks."""
        if setting.dynamic:
            return walk(self.rule(setting, model, context_len).next, prompt_len)
        size = self.fixed_chunk_size(setting)
        return walk(lambda done: size, prompt_len)

    # --- flags out and in ------------------------------------------------------------------------------------------

    @abstractmethod
    def format_flags(self, setting: ServerSetting, calibration: LatencyModel | None = None) -> tuple[dict, list[str]]:
        """(environment, arguments) that set `setting` on it; `calibration`: the model its flags carry, if any."""

    def format_parallel(self, pp_size: int | None, tp_size: int | None) -> list[str]:
        """The arguments that set the pipeline stages and the TP degree (those known, not None) on it."""
        args = []
        for key, value in ((PP_SIZE, pp_size), (TP_SIZE, tp_size)):
            if value is not None:
                args += [next(flag for flag, k in self.parallel_flags.items() if k == key), str(value)]
        return args

    def parse_parallel(self, tokens: list[str]) -> tuple[dict[str, int], list[str]]:
        """({PP_SIZE or TP_SIZE: value} of the parallel flags among a command line's tokens in its syntax, the other
        tokens). ValueError (one line) naming the flag on a bad value."""
        values, rest = read_flags(tokens, self.parallel_flags)
        return {key: parse_number(name, value, int, 1) for key, (name, value) in values.items()}, rest

    def parse_flags(self, text: str, page_size: int = 1) -> tuple[ServerSetting, LatencyModel | None, list[str]]:
        """(setting, calibration or None, ignored tokens) from a command line in its syntax (`ppprof tune --current`,
        or an export read back); settings not given keep its defaults. ValueError (one line) naming the flag on a bad
        value."""
        values, ignored = read_flags(split_command(text), self.flag_keys)
        ignored = self.parse_parallel(ignored)[1]  # the layout's flags: known, not chunking settings
        fields = self.default_setting(page_size).fields()
        calibration = None
        for key, (name, value) in values.items():
            parsed = {DYNAMIC: True} if key == DYNAMIC else self.parse_value(key, name, value)
            calibration = parsed.pop(CALIBRATION, calibration)
            fields.update(parsed)
        setting = ServerSetting(server=self.name, **self.complete(fields, set(values)))
        self.check_setting(setting)
        return setting, calibration, ignored

    def parse_value(self, key: str, name: str, value: str) -> dict:
        """{field: value} set by flag `name` (which sets `key`) given `value`."""
        if key == "smooth_factor":
            return {key: parse_number(name, value, float, 0.0, 1.0, low_open=True)}
        return {key: parse_number(name, value, int, 1)}

    def complete(self, fields: dict, given: set[str]) -> dict:
        """The fields its flags imply from those given (`given`: the keys the command line set)."""
        return fields

    def flag_name(self, field: str) -> str:
        """The flag that sets `field` (for messages)."""
        return {v: k for k, v in self.flag_keys.items()}.get(field, field)

    def check_setting(self, s: ServerSetting) -> None:
        """ValueError (one line) for settings the server would refuse or ppprof cannot plan."""
        align = self.alignment(s.page_size)
        for field in ("base_chunk_size", "max_chunk_size"):
            value = getattr(s, field)
            if not is_int(value) or value < align:
                raise ValueError(
                    f"{self.label} {self.flag_name(field)} {value} is below the alignment {align}: use at least {align}"
                )

    def with_context(self, setting: ServerSetting, context_len: int) -> ServerSetting:
        """`setting` with its chunk sizes limited to what a `context_len` context admits (a server default of 8192
        on a 4096-token model runs 4096-token chunks)."""
        align = self.alignment(setting.page_size)
        limit = align_down(context_len - self.context_margin - align, align)
        if self.fixed_chunk_size(setting) <= limit and setting.base_chunk_size <= limit:
            return setting
        base = min(setting.base_chunk_size, limit)
        return replace(
            setting,
            base_chunk_size=base,
            max_chunk_size=min(setting.max_chunk_size, limit),
            min_chunk_size=min(setting.min_chunk_size, base),
        )

    # --- why its chunks differ from the policy's ---------------------------------------------------------------------

    @abstractmethod
    def causes(self, policy: Policy) -> list[str]:
        """Why its chunk sizes may differ from the policy's with the exported flags (those that apply here)."""

    def export_header(self, policy: Policy, source: str) -> list[str]:
        """The export's first comment lines: where the latency model it sizes chunks with and the settings come
        from."""
        return [
            f"# {self.label} re-profiles its own latency model at start; these settings come from {source}",
            f"# (policy {policy.status}: {policy.reason});",
            "# the policy's coefficients inform them, they are not loaded.",
        ]

    def export_notes(self, policy: Policy) -> list[str]:
        """Comment lines its export adds about where the policy's coefficients come from."""
        return []

    # --- what `ppprof tune` tries ------------------------------------------------------------------------------------
    # By default the floor is the knob (a flag of vllm-ascend and ATOM); a server whose floor is fixed overrides these.

    def dynamic_candidates(self, B: int, smooth_factors, alignment: int, page_size: int) -> list[ServerSetting]:
        """Candidate dynamic settings at base chunk B: each smoothing factor with each floor (B/8, B/4, B/2 aligned
        down to `alignment`, and the default floor where it fits)."""
        default_floor = self.default_setting().min_chunk_size
        floors = sorted(
            {align_down(B // k, alignment) for k in (8, 4, 2)} | ({default_floor} if default_floor <= B else set())
        )
        return [
            ServerSetting(
                server=self.name,
                base_chunk_size=B,
                dynamic=True,
                smooth_factor=s,
                min_chunk_size=floor,
                max_chunk_size=B,
                page_size=page_size,
            )
            for s in smooth_factors
            for floor in floors
        ]

    def fixed_candidate(self, size: int, page_size: int) -> ServerSetting:
        """The setting that runs fixed chunks of `size` tokens."""
        d = self.default_setting()
        return ServerSetting(
            server=self.name,
            base_chunk_size=size,
            dynamic=False,
            smooth_factor=d.smooth_factor,
            min_chunk_size=min(d.min_chunk_size, size),
            max_chunk_size=size,
            page_size=page_size,
        )

    def same_knob(self, candidate: ServerSetting, pick: ServerSetting, B: int) -> bool:
        """Refinement around `pick` keeps its floor in the same proportion to B."""
        return abs(candidate.min_chunk_size / B - pick.min_chunk_size / pick.base_chunk_size) < 0.13


def concave_free_root(qa: float, qb: float, qc: float) -> float | None:
    """positive_root where the quadratic term is positive (the servers' rules solve no concave model), else None."""
    return positive_root(qa, qb, qc) if qa > 0 else None


def boot_quadratic_cause(label: str, policy: Policy) -> list[str]:
    """Why a server that fits a prefix-free quadratic at boot cannot follow a policy with another model."""
    name = policy.latency_model.name if policy.latency_model is not None else None
    if name in (None, "quadratic"):
        return []
    return [
        f"{label} sizes chunks with its own prefix-free quadratic fitted at boot, not ppprof's {name} model (its "
        f"form: {FORMS['quadratic']}), so it cannot see the prefix cost"
    ]

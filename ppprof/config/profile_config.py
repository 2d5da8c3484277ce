"""Settings of one `ppprof profile` run (flags > --config YAML > defaults), checked at construction before any rank starts, and
the probe chunk sizes they imply."""

from __future__ import annotations

from dataclasses import asdict

from ppprof.bounds import ATTENTION_BACKENDS, DEVICES, MAX_STAGES
from ppprof.checks import is_number, require_int, short
from ppprof.chunks import align_down, align_up, chunk_unit
from ppprof.config.chunk import ChunkSettings, check_base_chunk
from ppprof.config.policy import PolicyOptions
from ppprof.config.sections import (
    DESIGNS,
    LEGACY_PROBE_MULTIPLE,
    MAX_DESIGN_REQUESTS,
    MAX_TIMEOUT_S,
    MIN_TIMEOUT_S,
    RECORD_ORDER,
    SECTION_OF,
    SECTIONS,
    SGLANG_PROBE_MULTIPLE,
    FitSettings,
    JobSettings,
    ModelSettings,
    ParallelismSettings,
    PoolSettings,
    ProbeSettings,
)
from ppprof.config.workload import check_prompt_spec
from ppprof.specs.dtypes import normalize_dtype
from ppprof.specs.memory import CacheSizes

DEFAULT_PP_SIZE = 2
"""Stages of a one-node profile where neither --pp-size nor --nproc-per-node is given."""


class ProfileConfig:
    """Settings of one `ppprof profile` run (flags > --config YAML > the sections' defaults), in sections (`model`,
    `parallelism`, `probes`, `pools`, `fit`, `job`: ppprof.config.sections). Built from the flat settings the flags
    and YAML keys name (`ProfileConfig(base_chunk_size=1024)`), checked before any rank starts."""

    __slots__ = tuple(SECTIONS)
    model: ModelSettings
    parallelism: ParallelismSettings
    probes: ProbeSettings
    pools: PoolSettings
    fit: FitSettings
    job: JobSettings

    def __init__(self, **settings) -> None:
        unknown = sorted(set(settings) - set(SECTION_OF))
        if unknown:
            raise TypeError(f"ProfileConfig() got an unexpected keyword argument {unknown[0]!r}")
        for section, cls in SECTIONS.items():
            setattr(self, section, cls(**{k: v for k, v in settings.items() if SECTION_OF[k] == section}))
        self.check()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ProfileConfig) and all(getattr(self, s) == getattr(other, s) for s in SECTIONS)

    def __repr__(self) -> str:
        return f"ProfileConfig({', '.join(f'{s}={getattr(self, s)!r}' for s in SECTIONS)})"

    def setting(self, name: str):
        """One setting by its flat name (its flag's, its YAML key's)."""
        return getattr(getattr(self, SECTION_OF[name]), name)

    def settings(self) -> dict:
        """The flat settings, by name (what the flags and YAML keys set)."""
        flat = {k: v for s in SECTIONS for k, v in asdict(getattr(self, s)).items()}
        return {k: flat[k] for k in RECORD_ORDER}

    def check(self) -> None:
        """The checks across sections, and the settings resolved from others."""
        if self.parallelism.nproc_per_node is None:
            self.parallelism.nproc_per_node = (self.parallelism.pp_size or DEFAULT_PP_SIZE) * self.parallelism.tp_size
            if self.parallelism.nproc_per_node > MAX_STAGES:
                raise ValueError(
                    f"--pp-size x --tp-size = {self.parallelism.nproc_per_node} ranks exceed {MAX_STAGES} a node: "
                    "give --nproc-per-node (and --nnodes) for a job over several nodes"
                )
        try:
            self.model.dtype = normalize_dtype(self.model.dtype)
        except ValueError as e:
            raise ValueError(f"--dtype: {e}") from None
        if self.job.device not in DEVICES:
            raise ValueError(f"--device {short(self.job.device)} is not supported: use cpu or cuda")
        if self.job.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"--attention-backend {short(self.job.attention_backend)} is unknown: use one of "
                f"{', '.join(ATTENTION_BACKENDS)}"
            )
        self.check_design_bounds()
        if self.fit.prompt_lens is not None:
            check_prompt_spec(self.fit.prompt_lens)  # read where the fit runs (run/prelaunch reads it before any rank)
        PolicyOptions(min_gain=self.fit.min_gain)  # the fit's checks, before any rank
        if not is_number(self.job.timeout) or not MIN_TIMEOUT_S <= self.job.timeout <= MAX_TIMEOUT_S:
            raise ValueError(
                f"--timeout {self.job.timeout!r} must be a number of seconds in {MIN_TIMEOUT_S:g}.."
                f"{MAX_TIMEOUT_S:g}, e.g. 60"
            )
        rule = (
            self.fit.fit or self.probes.design == "adaptive"
        )  # the rule the policy will carry, or the design makes certain
        self.check_probe_base_chunk(rule)
        if self.max_probe_chunk_size > self.probes.context_len:
            raise ValueError(
                f"--base-chunk-size {self.probes.base_chunk_size} (largest probe chunk {self.max_probe_chunk_size}) exceeds "
                f"--context-len {self.probes.context_len}: lower the base chunk or raise the context length"
            )
        for p in self.resolved_prefix_lens():
            if p + self.max_probe_chunk_size > self.probes.context_len:
                raise ValueError(
                    f"--prefix-lens value {p} plus the largest probe chunk {self.max_probe_chunk_size} exceeds "
                    f"--context-len {self.probes.context_len}: use prefixes below "
                    f"{self.probes.context_len - self.max_probe_chunk_size}"
                )
        self.resolve_kv_slots()
        if rule:
            self.chunk_settings()

    def check_probe_base_chunk(self, rule: bool) -> None:
        """B holds one unit of the probe chunks and, where a rule is planned (`rule`), one alignment unit; where only
        the adaptive design plans one (no fit), the error says the grid design would take this B."""
        B, page, tp = self.probes.base_chunk_size, self.pools.page_size, self.parallelism.tp_size
        try:
            check_base_chunk(B, page, tp, 0 if rule else None, probes=True)
        except ValueError as e:
            if not rule or self.fit.fit:
                raise
            check_base_chunk(B, page, tp, None, probes=True)  # a B the grid refuses too gets its own error
            raise ValueError(f"{e} (the adaptive design plans them; --design grid probes a smaller B)") from None

    def resolve_kv_slots(self) -> None:
        """--max-total-tokens: whole pages that hold the longest probe request; by default exactly that."""
        pools = self.pools
        if pools.max_total_tokens is not None:
            if pools.max_total_tokens % pools.page_size:
                raise ValueError(
                    f"--max-total-tokens {pools.max_total_tokens} is not a multiple of --page-size {pools.page_size}"
                )
            need = self.needed_total_tokens()
            if pools.max_total_tokens < need:
                raise ValueError(
                    f"--base-chunk-size {self.probes.base_chunk_size} does not fit the KV cache: the longest probe request "
                    f"needs {need} slots but --max-total-tokens is {pools.max_total_tokens}; raise --max-total-tokens "
                    "or lower --base-chunk-size / --prefix-lens"
                )
        else:
            pools.max_total_tokens = self.needed_total_tokens()

    def check_design_bounds(self) -> None:
        """--design is known, and --max-requests and --max-seconds are bounded and given only with the adaptive one."""
        if self.probes.design not in DESIGNS:
            raise ValueError(f"--design {self.probes.design!r} is unknown: use one of {', '.join(DESIGNS)}")
        if self.probes.max_requests is not None:
            require_int("--max-requests", self.probes.max_requests, 1, MAX_DESIGN_REQUESTS)
        if self.probes.max_seconds is not None:
            s = self.probes.max_seconds
            if not is_number(s) or not (0 < s < float("inf")):
                raise ValueError(f"--max-seconds {s!r} must be a positive number of seconds")
            self.probes.max_seconds = float(s)
        if self.probes.design != "adaptive":
            for flag, value in (
                ("--max-requests", self.probes.max_requests),
                ("--max-seconds", self.probes.max_seconds),
            ):
                if value is not None:
                    raise ValueError(
                        f"{flag} {value} bounds the adaptive design only (the default): drop --design grid or drop {flag}"
                    )

    @property
    def request_budget(self) -> int:
        """The adaptive design's --max-requests, or by default what the grid design runs."""
        if self.probes.max_requests is not None:
            return self.probes.max_requests
        return self.probes.requests_per_probe * (1 + len(self.resolved_prefix_lens()))

    @property
    def chunk_unit(self) -> int:
        """What every probe chunk is a multiple of: whole pages split evenly over the TP ranks, lcm(page, tp)."""
        return chunk_unit(self.pools.page_size, self.parallelism.tp_size)

    @property
    def cache_sizes(self) -> CacheSizes:
        """The sizes a stage's cache is built with (and its memory counted with): the pools and the context."""
        pools = self.pools
        return CacheSizes(
            max_total_tokens=pools.max_total_tokens,
            page_size=pools.page_size,
            max_mamba_cache_size=pools.max_mamba_cache_size,
            max_running_requests=pools.max_running_requests,
            context_len=self.probes.context_len,
        )

    @property
    def max_probe_chunk_size(self) -> int:
        """The largest probe chunk: max_probe_chunk_multiple x B, aligned down to the chunk unit."""
        return align_down(int(self.probes.max_probe_chunk_multiple * self.probes.base_chunk_size), self.chunk_unit)

    def resolved_prefix_lens(self, num: int | None = None) -> tuple[int, ...]:
        """--prefix-lens, else `num` (default num_prefix_lens) lengths log-spaced from B to the context length less
        the largest probe chunk."""
        if self.probes.prefix_lens is not None:
            return tuple(self.probes.prefix_lens)
        page = self.pools.page_size
        top = (self.probes.context_len - self.max_probe_chunk_size) // page * page
        bottom = min(align_down(self.probes.base_chunk_size, page), top)
        if top < page:
            return ()
        n = num or self.probes.num_prefix_lens
        ratio = top / bottom
        if n == 1:
            return (top,)
        levels = {align_down(round(bottom * ratio ** (i / (n - 1))), page) for i in range(n)}
        return tuple(sorted(levels))

    def needed_total_tokens(self) -> int:
        """KV slots the longest probe request holds (prefix + the largest chunk), in whole pages."""
        longest = max((*self.resolved_prefix_lens(), 0)) + self.max_probe_chunk_size
        return align_up(longest, self.pools.page_size)

    def chunk_settings(self, **given) -> ChunkSettings:
        """The settings of the rule this profile's policy carries: its B, page size and context length, the rule's
        own defaults for the rest, what `given` sets (not None) winning (`ppprof fit`'s options)."""
        chunk = {
            "base_chunk_size": self.probes.base_chunk_size,
            "page_size": self.pools.page_size,
            "context_len": self.probes.context_len,
        }
        chunk.update({k: v for k, v in given.items() if v is not None})
        return ChunkSettings(**chunk, tp_size=self.parallelism.tp_size)

    def to_dict(self) -> dict:
        d = self.settings()
        d["prefix_lens"] = list(self.resolved_prefix_lens())
        d["layer_partition"] = (
            None if self.parallelism.layer_partition is None else list(self.parallelism.layer_partition)
        )
        return d

    @classmethod
    def recorded(cls, d: dict) -> dict:
        """The settings of a recorded config (run.json's) that this ppprof knows; keys of other versions left out. A
        config recorded before max_probe_chunk_multiple existed probed up to 1.25 B, and one recorded before design
        existed ran the grid: they read so."""
        known = set(SECTION_OF)
        legacy = {"max_probe_chunk_multiple": LEGACY_PROBE_MULTIPLE, "design": "grid"}
        return {**legacy, **{k: v for k, v in d.items() if k in known}}

    @classmethod
    def from_dict(cls, d: dict, where: str = "run.json") -> ProfileConfig:
        """The settings a run recorded (`to_dict`, the config of its run.json), typed and checked again; keys of
        other ppprof versions are left out. ValueError naming `where` when they are no longer valid."""
        if not isinstance(d, dict):
            raise ValueError(f"{where}: config must be an object of settings; profile again")
        d = cls.recorded(d)
        for key in ("prefix_lens", "layer_partition"):
            if isinstance(d.get(key), list):
                d[key] = tuple(d[key])
        try:
            return cls(**d)
        except ValueError as e:
            raise ValueError(f"{where}: {e}") from None


SGLANG_SWEEP_REQUESTS = 128


def sweep_chunk_sizes(base_chunk_size: int, num_requests: int = SGLANG_SWEEP_REQUESTS, align: int = 1) -> list[int]:
    """The prefix-free sweep's chunk sizes: SGLang's start-up profile, size_i = 1.25B - i * (1.25B // 128) for
    i = 0..127, sampled at `num_requests` evenly spaced i (all of them for 128), each aligned down to `align`.
    So the sizes fall linearly from 1.25 B to about 1.25 B / 128 whatever the number of requests. Below 1.25 B = 128,
    where SGLang's integer step would be 0 (every size equal), the step is 1.25 B / 128 in real numbers."""
    top = int(SGLANG_PROBE_MULTIPLE * base_chunk_size)
    step = top // SGLANG_SWEEP_REQUESTS or top / SGLANG_SWEEP_REQUESTS
    last = SGLANG_SWEEP_REQUESTS - 1
    picks = [round(i * last / (num_requests - 1)) for i in range(num_requests)] if num_requests > 1 else [0]
    return [align_down(int(top - i * step), align) for i in picks]

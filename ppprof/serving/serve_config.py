"""Settings of one `ppprof serve-bench` run through the ranks: the profile's settings it runs under (from the policy's
run.json, as `ppprof bench` takes them) and what it serves. Handed to every rank as JSON (to_dict, from_dict). Pure:
no torch."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from ppprof.bounds import MAX_ASYNC_DEPTH
from ppprof.checks import require_int, require_str
from ppprof.config.profile_config import ProfileConfig
from ppprof.config.workload import Workload
from ppprof.serving.levels import DEFAULT_REQUEST_ENTRIES, MAX_NUM_PROMPTS
from ppprof.serving.replay import REQUEST_ENTRIES
from ppprof.serving.simulate import LoadLevel, prompts_of
from ppprof.traces import Trace, read_trace

MAX_REPEATS = 100


@dataclass(kw_only=True, slots=True)
class TraceReplay:
    """The part of a request trace a run through the ranks replays (`serve-bench --trace` without --simulate), read
    again where it is needed (the command before the launch, checked there; each rank), and what is written of it."""

    path: str
    window_s: tuple[float, float] | None = None
    num_prompts: int | None = None
    time_scale: float = 1.0
    length_scale: float = 1.0
    context_len: int | None = None
    """The policy's: a scaled prompt beyond it is refused."""
    cache_tokens: int | None = None
    """The prefix cache's bound; None: the simulated pool's (ppprof.serving.replay.pool_tokens), as --simulate."""
    output_file: str | None = None
    output_details: bool = False

    def __post_init__(self) -> None:
        if self.window_s is not None:  # a JSON list on the ranks
            self.window_s = (float(self.window_s[0]), float(self.window_s[1]))

    def read(self) -> Trace:
        return read_trace(
            self.path,
            window_s=self.window_s,
            num_prompts=self.num_prompts,
            time_scale=self.time_scale,
            length_scale=self.length_scale,
            context_len=self.context_len,
        )


@dataclass(kw_only=True, slots=True)
class ServeBenchConfig:
    """What a serving bench through the ranks serves: the load levels (closed-loop `concurrency` or Poisson
    `request_rates`), each arm `repeats` times interleaved, `num_prompts` prompts a level drawn from `workload`."""

    policy: str
    profile: ProfileConfig
    concurrency: tuple[int, ...] | None = None
    request_rates: tuple[float, ...] | None = None
    strategies: tuple[str, ...] = ()
    workload: dict | None = None
    """Workload.to_dict() of the prompt lengths drawn."""
    num_prompts: int = 64
    async_depth: int = 0
    seed: int = 0
    repeats: int = 3
    """Runs of each (level, arm), interleaved: every arm of every level once, then again."""
    out: str | None = None
    """serving.json's path; None: results/<time>-serve-<model>/serving.json."""
    forward_trace: str | None = None
    """Where every rank's forwards go as one forward trace (docs/forwards.md); None: none."""
    trace: TraceReplay | None = None
    """A request trace replayed instead of the levels; None: the levels."""

    def __post_init__(self) -> None:
        require_int("--num-prompts", self.num_prompts, 1, MAX_NUM_PROMPTS)
        require_int("--async-depth", self.async_depth, 0, MAX_ASYNC_DEPTH)
        require_int("--seed", self.seed, 0, 2**32 - 1)
        require_int("--repeats", self.repeats, 1, MAX_REPEATS)
        if self.out is not None:
            require_str("--out", self.out, "a file path for serving.json")
        if self.forward_trace is not None:
            require_str("--forward-trace", self.forward_trace, "a file path for the forward trace")

    @property
    def levels(self) -> list[LoadLevel]:
        if self.concurrency is not None:
            return [LoadLevel(concurrency=c) for c in self.concurrency]
        return [LoadLevel(rate=r) for r in self.request_rates or ()]

    @property
    def prompts(self) -> list[int]:
        """The prompt lengths every level (or the trace's part) serves, in arrival order."""
        if self.trace is not None:
            return [r.prompt_len for r in self.trace.read().requests]
        w = Workload.from_dict(self.workload)
        return prompts_of(w.prompt_lens, w.weights, self.num_prompts, self.seed)

    def entries(self, level: LoadLevel) -> int:
        """Requests a level holds at once: its concurrency, else (Poisson) a server's default, at most the prompts."""
        return min(level.concurrency or DEFAULT_REQUEST_ENTRIES, self.num_prompts)

    def max_entries(self, prompts: list[int]) -> int:
        """Requests the run holds at once at most: the levels' most, or (a trace) the simulated pools' entries, at
        most the part's requests."""
        if self.trace is not None:
            return min(REQUEST_ENTRIES, len(prompts))
        return max(self.entries(level) for level in self.levels)

    def with_pools(self) -> ServeBenchConfig:
        """These settings with each stage's pools sized for the most requests a level holds at once, each at the
        longest prompt (KV slots, Mamba slots, request entries, context; at least the profile's), so that the memory check before the launch
        judges what the run will hold. ValueError (one line) where that is beyond a pool's bound."""
        prompts = self.prompts
        entries = self.max_entries(prompts)
        page = self.profile.pools.page_size
        longest = -(-max(prompts) // page) * page
        recorded = self.profile.pools  # what the profile held (its probes' checks still hold): at least that much
        pools = {
            "max_total_tokens": max(entries * longest, recorded.max_total_tokens),
            "max_mamba_cache_size": max(entries, recorded.max_mamba_cache_size),
            "max_running_requests": max(entries, recorded.max_running_requests),
            "context_len": max(longest, self.profile.probes.context_len),
        }
        try:
            profile = ProfileConfig(**{**self.profile.settings(), **pools})
        except ValueError as e:
            what = "the trace's part" if self.trace is not None else f"--num-prompts {self.num_prompts}"
            raise ValueError(
                f"{what}: {entries} requests at once at the longest prompt ({longest} "
                f"tokens) need pools beyond their bounds ({e}); serve fewer or shorter prompts"
            ) from None
        return replace(self, profile=profile)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["profile"] = self.profile.to_dict()
        if self.trace is not None:
            d["trace"] = asdict(self.trace)
        for key in ("concurrency", "request_rates", "strategies"):
            d[key] = None if d[key] is None else list(d[key])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ServeBenchConfig:
        d = dict(d)
        d["profile"] = ProfileConfig.from_dict(d["profile"], "--resolved-config")
        if d.get("trace") is not None:
            d["trace"] = TraceReplay(**d["trace"])
        for key in ("concurrency", "request_rates", "strategies"):
            d[key] = None if d.get(key) is None else tuple(d[key])
        return cls(**d)

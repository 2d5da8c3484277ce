"""Settings of one `ppprof profile` run (flags > --config YAML > defaults), checked at construction before any rank starts, and
the probe chunk sizes they imply."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ppprof.bounds import ATTENTION_BACKENDS, DEVICES, MAX_STAGES, MAX_TOKENS
from ppprof.checks import a_type, is_int, is_number, require_bool, require_int, require_str, short
from ppprof.chunks import align_down, align_up, chunk_unit
from ppprof.config.chunk import DEFAULT_CONTEXT_LEN, ChunkSettings, check_base_chunk
from ppprof.config.policy import DEFAULT_MIN_GAIN, PolicyOptions
from ppprof.config.workload import check_prompt_spec
from ppprof.specs.dtypes import normalize_dtype
from ppprof.specs.spec import MAX_LAYERS
from ppprof.specs.tp import MAX_TP_SIZE

MAX_REQUESTS_PER_PROBE = 128
MIN_REQUESTS_PER_PROBE = 8
MAX_SLOTS = 2**31 - 1
"""The most Mamba slots or request entries a stage takes (memory is checked before launch too)."""
MAX_WARMUP = 1000
"""The most untimed warm-up forwards."""
MAX_SEED = 2**32 - 1
MAX_TORCH_THREADS = 1024
MAX_PREFIX_LENS = 64
"""The most prefix probes (each holds up to 128 requests)."""
SGLANG_PROBE_MULTIPLE = 1.25
"""SGLang's largest start-up chunk, in multiples of B: the top of the sweep and of the base chunk sizes of the grid."""
MAX_PROBE_CHUNK_MULTIPLES = (SGLANG_PROBE_MULTIPLE, 16.0)
"""--max-probe-chunk-multiple's range."""
LEGACY_PROBE_MULTIPLE = SGLANG_PROBE_MULTIPLE
"""The largest probe chunk of a run recorded before the setting existed (its probes stopped at 1.25 B)."""
MAX_OVERHEAD_REPEATS = 100
"""The most rounds of the pipeline overhead's fixed plans."""
INT_FIELDS = (
    # (field, low, high, may be None)
    ("num_layers", 1, MAX_LAYERS, True),
    ("nproc_per_node", 1, MAX_STAGES, True),
    ("tp_size", 1, MAX_TP_SIZE, False),
    ("pp_size", 1, MAX_STAGES, True),
    ("base_chunk_size", 1, MAX_TOKENS, False),
    ("requests_per_probe", MIN_REQUESTS_PER_PROBE, MAX_REQUESTS_PER_PROBE, False),
    ("page_size", 1, MAX_TOKENS, False),
    ("max_mamba_cache_size", 1, MAX_SLOTS, False),
    ("max_running_requests", 1, MAX_SLOTS, False),
    ("max_total_tokens", 1, MAX_TOKENS, True),
    ("context_len", 1, MAX_TOKENS, False),
    ("num_prefix_lens", 1, MAX_PREFIX_LENS, False),
    ("warmup", 0, MAX_WARMUP, False),
    ("seed", 0, MAX_SEED, False),
    ("torch_threads", 1, MAX_TORCH_THREADS, True),
    ("overhead_repeats", 0, MAX_OVERHEAD_REPEATS, False),
)
"""ProfileConfig's integer fields and their bounds (a float, 4096.0 too, a string, a bool or a list is refused)."""


def flag(name: str) -> str:
    """A setting's flag: max_total_tokens -> --max-total-tokens (a YAML key is the same name with underscores)."""
    return "--" + name.replace("_", "-")


def int_tuple(name: str, value, low: int | None) -> tuple[int, ...] | None:
    """A list setting (prefix_lens, layer_partition) as a tuple of integers (>= low unless low is None); None stays
    None. A float (4.5, 4096.0), a bool or a string element is refused, not truncated."""
    if value is None:
        return None
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{flag(name)} {short(value)} must be a list of integers, e.g. 512,1024")
    for v in value:
        if not is_int(v):
            raise ValueError(f"{flag(name)} value {short(v)} must be an integer, not {a_type(v)}")
        if low is not None and v < low:
            raise ValueError(f"{flag(name)} value {v} must be an integer >= {low}")
    return tuple(value)


def check_types(cfg: ProfileConfig) -> None:
    """Every field of the right type and within its bounds (INT_FIELDS), lists as tuples of integers."""
    require_str("--model", cfg.model, "a preset name or a path to a model spec / HF config")
    for name, low, high, optional in INT_FIELDS:
        value = getattr(cfg, name)
        if not (optional and value is None):
            require_int(flag(name), value, low, high)
    for name in ("device", "attention_backend"):
        require_str(flag(name), getattr(cfg, name))
    if cfg.dtype is not None:
        require_str("--dtype", cfg.dtype, "a dtype name, e.g. bfloat16")
    if cfg.out is not None:
        require_str("--out", cfg.out, "a folder path")
    require_bool("fit (--fit/--no-fit)", cfg.fit)
    low, high = MAX_PROBE_CHUNK_MULTIPLES
    m = cfg.max_probe_chunk_multiple
    if not is_number(m) or not low <= m <= high:
        raise ValueError(
            f"--max-probe-chunk-multiple {short(m)} must be a number in {low:g}..{high:g} (the largest "
            f"probe chunk in multiples of B), e.g. 4"
        )
    cfg.max_probe_chunk_multiple = float(m)
    cfg.prefix_lens = int_tuple("prefix_lens", cfg.prefix_lens, 0)
    if cfg.prefix_lens and max(cfg.prefix_lens) > MAX_TOKENS:
        raise ValueError(f"--prefix-lens value {max(cfg.prefix_lens)} must be an integer in 0..{MAX_TOKENS}")
    cfg.layer_partition = int_tuple("layer_partition", cfg.layer_partition, None)  # split_layers says why < 1
    if cfg.layer_partition is not None and len(cfg.layer_partition) > MAX_STAGES:
        raise ValueError(f"--layer-partition has {len(cfg.layer_partition)} stages: use at most {MAX_STAGES}")


DEFAULT_PP_SIZE = 2
"""Stages of a one-node profile where neither --pp-size nor --nproc-per-node is given."""
MAX_DESIGN_REQUESTS = 1_000_000
"""The most requests --max-requests allows the adaptive design."""
DESIGNS = ("grid", "adaptive")
"""What --design takes. grid: the sweep and one probe per prefix length; adaptive: a small D-optimal design for the
prefix model, then the requests that most reduce the policy's uncertainty, until its table is stable or a budget is
spent (ppprof.adaptive)."""
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 0.5, 86400.0
"""--timeout's range: below half a second a heartbeat could not tell a stopped rank; above a day no fault is bounded."""


@dataclass(kw_only=True, slots=True)
class ProfileConfig:
    """Settings of one `ppprof profile` run (flags > --config YAML > these defaults). Checked before any rank starts."""

    model: str = "tiny-hybrid"
    """Preset name, YAML spec, or HuggingFace config.json (or a folder holding one)."""
    num_layers: int | None = None
    """Keep the model's layer pattern but only this many layers (real shapes on a small machine)."""
    nproc_per_node: int | None = None
    """Ranks on this node (nnodes x nproc_per_node = pp_size x tp_size ranks in all); default (None, resolved at
    construction): pp_size x tp_size, 2 x tp_size without pp_size."""
    pp_size: int | None = None
    """Pipeline stages (SGLang's --pp-size); default: the job's ranks over tp_size."""
    tp_size: int = 1
    """Tensor-parallel ranks of each stage (SGLang's --tp-size), adjacent ranks of one node: rank = stage x tp_size
    + TP rank."""
    device: str = "cpu"
    """cpu (gloo) or cuda (NCCL, one GPU per rank)."""
    dtype: str | None = None
    """float32, bfloat16 or float16; default bf16 on cuda, fp32 on cpu."""
    base_chunk_size: int = 512
    """B: the chunk size the policy starts from (SGLang's --chunked-prefill-size; 2-3x the best fixed chunk)."""
    requests_per_probe: int = 128
    """Synthetic prefill requests per probe, 8..128."""
    page_size: int = 1
    """KV cache page size in tokens; probe chunk sizes are multiples of it (and of tp_size: chunk_unit)."""
    max_probe_chunk_multiple: float = 4.0
    """The largest probe chunk in multiples of B (1.25..16): the grid's prefix probes and a prefix-free probe reach it,
    so that plans with first chunks 2-4x later ones stay in the profiled domain; 1.25 probes SGLang's range only."""
    max_mamba_cache_size: int = 128
    """Mamba state slots per stage (SGLang's --max-mamba-cache-size)."""
    max_running_requests: int = 128
    """Request pool entries per stage."""
    max_total_tokens: int | None = None
    """KV cache capacity per stage, in token slots; default (None, resolved at construction): the longest probe request
    (prefix + chunk), rounded up to a page."""
    context_len: int = DEFAULT_CONTEXT_LEN
    """Longest request the served model takes; recorded for the policy's caps and bounds the prefix probes."""
    prefix_lens: tuple[int, ...] | None = None
    """Prefix lengths of the prefix probes; default: num_prefix_lens lengths log-spaced from B to the context length
    less the largest probe chunk, so that the fit covers every prefix a plan will meet instead of extrapolating."""
    num_prefix_lens: int = 6
    """How many default prefix lengths (ignored when prefix_lens is given)."""
    warmup: int = 3
    """Untimed forwards before the first timed one."""
    layer_partition: tuple[int, ...] | None = None
    """Layers per stage, e.g. (3, 5); default: an even split."""
    seed: int = 0
    out: str | None = None
    """Run folder; default results/<run-id>."""
    fit: bool = True
    """Fit the samples and write policy.json and plots at the end of the run."""
    torch_threads: int | None = None
    """torch's intra-op threads on each rank; default: OMP_NUM_THREADS, which the launcher sets to the cores of this
    node divided by its ranks. `ppprof bench` runs with the profile's, so that both measure under the same."""
    attention_backend: str = "auto"
    """Attention kernel the stages run: auto (flashinfer on CUDA when importable, else sdpa), sdpa (torch's fast
    paths, no dense mask), flashinfer (paged prefill from the KV pages, CUDA), reference (dense mask; the oracle)."""
    design: str = "grid"
    """Probe design: grid (the sweep, then one probe per prefix length) or adaptive (a small D-optimal design, then
    the requests that most reduce the uncertainty of the policy's table, until it is stable or a budget is spent)."""
    max_requests: int | None = None
    """Adaptive design: stop after this many timed requests (default: as many as the grid design would run,
    requests_per_probe x (1 + the number of prefix lengths))."""
    max_seconds: float | None = None
    """Adaptive design: stop choosing probes once probing has taken this many seconds (default: no limit)."""
    prompt_lens: str | None = None
    """The workload the policy's history-only table and status are chosen on (`ppprof fit --prompt-lens`)."""
    min_gain: float = DEFAULT_MIN_GAIN
    """The least predicted gain over the best fixed chunk for a dynamic policy (`ppprof fit --min-gain`)."""
    overhead_repeats: int = 3
    """Rounds of the pipeline overhead's fixed plans after the probes (ppprof.bench.overhead), one prompt a chunk size
    each, interleaved; 0: not measured."""
    timeout: float = 60.0
    """Seconds: the least time a rank waits on another before the run stops with "rank N did not answer"; a wait
    may take longer when the requests measured so far are slow (ppprof.distributed.watchdog: 20 x the slowest)."""

    def __post_init__(self) -> None:
        check_types(self)
        if self.nproc_per_node is None:
            self.nproc_per_node = (self.pp_size or DEFAULT_PP_SIZE) * self.tp_size
            if self.nproc_per_node > MAX_STAGES:
                raise ValueError(
                    f"--pp-size x --tp-size = {self.nproc_per_node} ranks exceed {MAX_STAGES} a node: "
                    "give --nproc-per-node (and --nnodes) for a job over several nodes"
                )
        try:
            self.dtype = normalize_dtype(self.dtype)
        except ValueError as e:
            raise ValueError(f"--dtype: {e}") from None
        if self.device not in DEVICES:
            raise ValueError(f"--device {short(self.device)} is not supported: use cpu or cuda")
        if self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(
                f"--attention-backend {short(self.attention_backend)} is unknown: use one of "
                f"{', '.join(ATTENTION_BACKENDS)}"
            )
        self.check_design_bounds()
        if self.prompt_lens is not None:
            check_prompt_spec(self.prompt_lens)  # read where the fit runs (run/checks.py reads it before any rank)
        PolicyOptions(min_gain=self.min_gain)  # the fit's checks, before any rank
        if not is_number(self.timeout) or not MIN_TIMEOUT_S <= self.timeout <= MAX_TIMEOUT_S:
            raise ValueError(
                f"--timeout {self.timeout!r} must be a number of seconds in {MIN_TIMEOUT_S:g}.."
                f"{MAX_TIMEOUT_S:g}, e.g. 60"
            )
        rule = self.fit or self.design == "adaptive"  # the rule the policy will carry, or the design makes certain
        check_base_chunk(self.base_chunk_size, self.page_size, self.tp_size, 0 if rule else None, probes=True)
        if self.max_probe_chunk_size > self.context_len:
            raise ValueError(
                f"--base-chunk-size {self.base_chunk_size} (largest probe chunk {self.max_probe_chunk_size}) exceeds "
                f"--context-len {self.context_len}: lower the base chunk or raise the context length"
            )
        for p in self.resolved_prefix_lens():
            if p + self.max_probe_chunk_size > self.context_len:
                raise ValueError(
                    f"--prefix-lens value {p} plus the largest probe chunk {self.max_probe_chunk_size} exceeds "
                    f"--context-len {self.context_len}: use prefixes below "
                    f"{self.context_len - self.max_probe_chunk_size}"
                )
        if self.max_total_tokens is not None:
            if self.max_total_tokens % self.page_size:
                raise ValueError(
                    f"--max-total-tokens {self.max_total_tokens} is not a multiple of --page-size {self.page_size}"
                )
            need = self.needed_total_tokens()
            if self.max_total_tokens < need:
                raise ValueError(
                    f"--base-chunk-size {self.base_chunk_size} does not fit the KV cache: the longest probe request "
                    f"needs {need} slots but --max-total-tokens is {self.max_total_tokens}; raise --max-total-tokens "
                    "or lower --base-chunk-size / --prefix-lens"
                )
        else:
            self.max_total_tokens = self.needed_total_tokens()
        if rule:
            self.chunk_settings()

    def check_design_bounds(self) -> None:
        """--design is known, and --max-requests and --max-seconds are bounded and given only with the adaptive one."""
        if self.design not in DESIGNS:
            raise ValueError(f"--design {self.design!r} is unknown: use one of {', '.join(DESIGNS)}")
        if self.max_requests is not None:
            require_int("--max-requests", self.max_requests, 1, MAX_DESIGN_REQUESTS)
        if self.max_seconds is not None:
            s = self.max_seconds
            if not is_number(s) or not (0 < s < float("inf")):
                raise ValueError(f"--max-seconds {s!r} must be a positive number of seconds")
            self.max_seconds = float(s)
        if self.design != "adaptive":
            for flag, value in (("--max-requests", self.max_requests), ("--max-seconds", self.max_seconds)):
                if value is not None:
                    raise ValueError(
                        f"{flag} {value} bounds the adaptive design only: add --design adaptive or drop {flag}"
                    )

    @property
    def request_budget(self) -> int:
        """The adaptive design's --max-requests, or by default what the grid design runs."""
        if self.max_requests is not None:
            return self.max_requests
        return self.requests_per_probe * (1 + len(self.resolved_prefix_lens()))

    @property
    def chunk_unit(self) -> int:
        """What every probe chunk is a multiple of: whole pages split evenly over the TP ranks, lcm(page, tp)."""
        return chunk_unit(self.page_size, self.tp_size)

    @property
    def max_probe_chunk_size(self) -> int:
        """The largest probe chunk: max_probe_chunk_multiple x B, aligned down to the chunk unit."""
        return align_down(int(self.max_probe_chunk_multiple * self.base_chunk_size), self.chunk_unit)

    def resolved_prefix_lens(self, num: int | None = None) -> tuple[int, ...]:
        """--prefix-lens, else `num` (default num_prefix_lens) lengths log-spaced from B to the context length less
        the largest probe chunk."""
        if self.prefix_lens is not None:
            return tuple(self.prefix_lens)
        page = self.page_size
        top = (self.context_len - self.max_probe_chunk_size) // page * page
        bottom = min(align_down(self.base_chunk_size, page), top)
        if top < page:
            return ()
        n = num or self.num_prefix_lens
        ratio = top / bottom
        if n == 1:
            return (top,)
        levels = {align_down(round(bottom * ratio ** (i / (n - 1))), page) for i in range(n)}
        return tuple(sorted(levels))

    def needed_total_tokens(self) -> int:
        """KV slots the longest probe request holds (prefix + the largest chunk), in whole pages."""
        longest = max((*self.resolved_prefix_lens(), 0)) + self.max_probe_chunk_size
        return align_up(longest, self.page_size)

    def chunk_settings(self, **given) -> ChunkSettings:
        """The settings of the rule this profile's policy carries: its B, page size and context length, the rule's
        own defaults for the rest, what `given` sets (not None) winning (`ppprof fit`'s options)."""
        chunk = {"base_chunk_size": self.base_chunk_size, "page_size": self.page_size, "context_len": self.context_len}
        chunk.update({k: v for k, v in given.items() if v is not None})
        return ChunkSettings(**chunk, tp_size=self.tp_size)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["prefix_lens"] = list(self.resolved_prefix_lens())
        d["layer_partition"] = None if self.layer_partition is None else list(self.layer_partition)
        return d

    @classmethod
    def recorded(cls, d: dict) -> dict:
        """The settings of a recorded config (run.json's) that this ppprof knows; keys of other versions left out. A
        config recorded before max_probe_chunk_multiple existed probed up to 1.25 B, and reads so."""
        known = {f.name for f in fields(cls)}
        return {"max_probe_chunk_multiple": LEGACY_PROBE_MULTIPLE, **{k: v for k, v in d.items() if k in known}}

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

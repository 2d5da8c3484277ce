"""The sections of a profile's settings (ProfileConfig), as a training job's config has them: the model, the
parallel layout, the probes, the pools, the fit and the job. Each section checks its own settings' types and bounds at
construction; the checks across sections are ProfileConfig's. Flags, YAML keys and run.json's config stay flat: a
setting's name is its flag's (`flag`), and ProfileConfig takes them flat."""

from __future__ import annotations

from dataclasses import dataclass, fields

from ppprof.bounds import MAX_STAGES, MAX_TOKENS
from ppprof.checks import a_type, is_int, is_number, require_bool, require_int, require_str, short
from ppprof.config.chunk import DEFAULT_CONTEXT_LEN
from ppprof.config.policy import DEFAULT_MIN_GAIN
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
MAX_PACKED_FORWARDS = 1000
"""The most timed packed forwards after the probes."""
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
    ("packed_forwards", 0, MAX_PACKED_FORWARDS, False),
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


MAX_DESIGN_REQUESTS = 1_000_000
"""The most requests --max-requests allows the adaptive design."""
DESIGNS = ("grid", "adaptive")
"""What --design takes. grid: the sweep and one probe per prefix length; adaptive: a small D-optimal design for the
prefix model, then the requests that most reduce the uncertainty of the policy's decision, until its status is sure and
its tables stable or a budget is spent (ppprof.adaptive)."""
MIN_TIMEOUT_S, MAX_TIMEOUT_S = 0.5, 86400.0
"""--timeout's range: below half a second a heartbeat could not tell a stopped rank; above a day no fault is bounded."""


STR_FIELDS = {
    "model": "a preset name or a path to a model spec / HF config",
    "device": None,
    "attention_backend": None,
    "dtype": "a dtype name, e.g. bfloat16",
    "out": "a folder path",
}
"""The string settings and what a value must be (those that may be None: dtype, out)."""


def check_section(section) -> None:
    """Every setting of one section of the right type and within its bounds (INT_FIELDS, STR_FIELDS), lists as
    tuples of integers; ValueError (one line) naming the flag."""
    names = {f.name for f in fields(section)}
    for name, low, high, optional in INT_FIELDS:
        if name in names and not (optional and getattr(section, name) is None):
            require_int(flag(name), getattr(section, name), low, high)
    for name, what in STR_FIELDS.items():
        if name in names and not (name in ("dtype", "out") and getattr(section, name) is None):
            require_str(flag(name), getattr(section, name), *([what] if what else []))
    if "fit" in names:
        require_bool("fit (--fit/--no-fit)", section.fit)
    if "max_probe_chunk_multiple" in names:
        low, high = MAX_PROBE_CHUNK_MULTIPLES
        m = section.max_probe_chunk_multiple
        if not is_number(m) or not low <= m <= high:
            raise ValueError(
                f"--max-probe-chunk-multiple {short(m)} must be a number in {low:g}..{high:g} (the largest "
                f"probe chunk in multiples of B), e.g. 4"
            )
        section.max_probe_chunk_multiple = float(m)
    if "prefix_lens" in names:
        section.prefix_lens = int_tuple("prefix_lens", section.prefix_lens, 0)
        if section.prefix_lens and max(section.prefix_lens) > MAX_TOKENS:
            raise ValueError(f"--prefix-lens value {max(section.prefix_lens)} must be an integer in 0..{MAX_TOKENS}")
    if "layer_partition" in names:
        section.layer_partition = int_tuple("layer_partition", section.layer_partition, None)  # split_layers: < 1
        if section.layer_partition is not None and len(section.layer_partition) > MAX_STAGES:
            raise ValueError(f"--layer-partition has {len(section.layer_partition)} stages: use at most {MAX_STAGES}")


@dataclass(kw_only=True, slots=True)
class ModelSettings:
    """The model profiled: what --model names, how many of its layers, its dtype. (ProfileConfig.model)"""

    model: str = "tiny-hybrid"
    """Preset name, YAML spec, or HuggingFace config.json (or a folder holding one)."""
    num_layers: int | None = None
    """Keep the model's layer pattern but only this many layers (real shapes on a small machine)."""
    dtype: str | None = None
    """float32, bfloat16 or float16; default bf16 on cuda, fp32 on cpu."""

    def __post_init__(self) -> None:
        check_section(self)


@dataclass(kw_only=True, slots=True)
class ParallelismSettings:
    """The pipeline's layout: ranks on this node, stages, TP ranks a stage, layers a stage. (ProfileConfig.parallelism)"""

    nproc_per_node: int | None = None
    """Ranks on this node (nnodes x nproc_per_node = pp_size x tp_size ranks in all); default (None, resolved at
    construction): pp_size x tp_size, 2 x tp_size without pp_size."""
    pp_size: int | None = None
    """Pipeline stages (SGLang's --pp-size); default: the job's ranks over tp_size."""
    tp_size: int = 1
    """Tensor-parallel ranks of each stage (SGLang's --tp-size), adjacent ranks of one node: rank = stage x tp_size
    + TP rank."""
    layer_partition: tuple[int, ...] | None = None
    """Layers per stage, e.g. (3, 5); default: an even split."""

    def __post_init__(self) -> None:
        check_section(self)


@dataclass(kw_only=True, slots=True)
class ProbeSettings:
    """What the probes measure: the base chunk, the requests of a probe and their chunks, the prefixes, the design that picks them, and the overhead's plans. (ProfileConfig.probes)"""

    base_chunk_size: int = 512
    """B: the chunk size the policy starts from (SGLang's --chunked-prefill-size; 2-3x the best fixed chunk)."""
    requests_per_probe: int = 128
    """Synthetic prefill requests per probe, 8..128."""
    max_probe_chunk_multiple: float = 4.0
    """The largest probe chunk in multiples of B (1.25..16): the grid's prefix probes and a prefix-free probe reach it,
    so that plans with first chunks 2-4x later ones stay in the profiled domain; 1.25 probes SGLang's range only."""
    context_len: int = DEFAULT_CONTEXT_LEN
    """Longest request the served model takes; recorded for the policy's caps and bounds the prefix probes."""
    prefix_lens: tuple[int, ...] | None = None
    """Prefix lengths of the prefix probes; default: num_prefix_lens lengths log-spaced from B to the context length
    less the largest probe chunk, so that the fit covers every prefix a plan will meet instead of extrapolating."""
    num_prefix_lens: int = 6
    """How many default prefix lengths (ignored when prefix_lens is given)."""
    warmup: int = 3
    """Untimed forwards before the first timed one."""
    seed: int = 0
    design: str = "adaptive"
    """Probe design: adaptive (a small D-optimal design, then the requests that most reduce the uncertainty of the
    policy's decision, until its status is sure and its tables stable, or a budget is spent) or grid (the sweep, then
    one probe per prefix length). Adaptive by default: in repeated default profiles interleaved with the grid's it
    reached the grid's decision in 10 of 13 at a median of about 0.2x its probing time (docs/profiling.md)."""
    max_requests: int | None = None
    """Adaptive design: stop after this many timed requests (default: as many as the grid design would run,
    requests_per_probe x (1 + the number of prefix lengths))."""
    max_seconds: float | None = None
    """Adaptive design: stop choosing probes once probing has taken this many seconds (default: no limit)."""
    overhead_repeats: int = 3
    """Rounds of the pipeline overhead's fixed plans before the probes (ppprof.bench.overhead), one prompt a chunk size
    each, interleaved; 0: not measured."""
    packed_forwards: int = 28
    """Timed packed forwards after the probes (ppprof.probe.packed): 2 to 8 requests' chunks in one forward, each at
    its own prefix, prefixes and chunk sizes among the probes'; the fit scores its additive form on them; 0: none."""

    def __post_init__(self) -> None:
        check_section(self)


@dataclass(kw_only=True, slots=True)
class PoolSettings:
    """Each stage's pools: the KV page, Mamba state slots, request entries, KV slots. (ProfileConfig.pools)"""

    page_size: int = 1
    """KV cache page size in tokens; probe chunk sizes are multiples of it (and of tp_size: chunk_unit)."""
    max_mamba_cache_size: int = 128
    """Mamba state slots per stage (SGLang's --max-mamba-cache-size)."""
    max_running_requests: int = 128
    """Request pool entries per stage."""
    max_total_tokens: int | None = None
    """KV cache capacity per stage, in token slots; default (None, resolved at construction): the longest probe request
    (prefix + chunk), rounded up to a page."""

    def __post_init__(self) -> None:
        check_section(self)


@dataclass(kw_only=True, slots=True)
class FitSettings:
    """The fit at the end of the run and what its policy is chosen with. (ProfileConfig.fit)"""

    fit: bool = True
    """Fit the samples and write policy.json and plots at the end of the run."""
    prompt_lens: str | None = None
    """The workload the policy's history-only table and status are chosen on (`ppprof fit --prompt-lens`)."""
    min_gain: float = DEFAULT_MIN_GAIN
    """The least predicted gain over the best fixed chunk for a dynamic policy (`ppprof fit --min-gain`)."""

    def __post_init__(self) -> None:
        check_section(self)


@dataclass(kw_only=True, slots=True)
class JobSettings:
    """How the ranks run: the device, the run folder, threads, the attention kernel, the watchdog's timeout. (ProfileConfig.job)"""

    device: str = "cpu"
    """cpu (gloo) or cuda (NCCL, one GPU per rank)."""
    out: str | None = None
    """Run folder; default results/<run-id>."""
    torch_threads: int | None = None
    """torch's intra-op threads on each rank; default: OMP_NUM_THREADS, which the launcher sets to the cores of this
    node divided by its ranks. `ppprof bench` runs with the profile's, so that both measure under the same."""
    attention_backend: str = "auto"
    """Attention kernel the stages run: auto (flashinfer on CUDA when importable, else sdpa), sdpa (torch's fast
    paths, no dense mask), flashinfer (paged prefill from the KV pages, CUDA), reference (dense mask; the oracle)."""
    timeout: float = 60.0
    """Seconds: the least time a rank waits on another before the run stops with "rank N did not answer"; a wait
    may take longer when the requests measured so far are slow (ppprof.distributed.watchdog: 20 x the slowest)."""

    def __post_init__(self) -> None:
        check_section(self)


SECTIONS = {
    "model": ModelSettings,
    "parallelism": ParallelismSettings,
    "probes": ProbeSettings,
    "pools": PoolSettings,
    "fit": FitSettings,
    "job": JobSettings,
}
"""ProfileConfig's sections, by the attribute that holds each."""
SECTION_OF = {f.name: section for section, cls in SECTIONS.items() for f in fields(cls)}
"""Each setting's section."""


def setting_fields() -> tuple:
    """Every setting's dataclass field (name, default, type), section by section: the flat list the flags, the YAML
    keys and run.json's config name."""
    return tuple(f for cls in SECTIONS.values() for f in fields(cls))


RECORD_ORDER = (
    "model",
    "num_layers",
    "nproc_per_node",
    "pp_size",
    "tp_size",
    "device",
    "dtype",
    "base_chunk_size",
    "requests_per_probe",
    "page_size",
    "max_probe_chunk_multiple",
    "max_mamba_cache_size",
    "max_running_requests",
    "max_total_tokens",
    "context_len",
    "prefix_lens",
    "num_prefix_lens",
    "warmup",
    "layer_partition",
    "seed",
    "out",
    "fit",
    "torch_threads",
    "attention_backend",
    "design",
    "max_requests",
    "max_seconds",
    "prompt_lens",
    "min_gain",
    "overhead_repeats",
    "packed_forwards",
    "timeout",
)
"""The order run.json's config records the settings in (the flat order they had before they had sections)."""
assert sorted(RECORD_ORDER) == sorted(SECTION_OF), "every setting has its place in run.json's config"

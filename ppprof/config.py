"""Model specs: the shapes of the model being profiled (one tree of kw-only dataclasses, validated at construction).

Loading presets and HuggingFace config.json files lives in ppprof/specs/; this module holds and checks the settings.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

ATTENTION = "attention"
MAMBA = "mamba"
MLP = "mlp"
MOE = "moe"
MIXERS = (ATTENTION, MAMBA)
FFNS = (MLP, MOE)
SILU = "silu"
RELU2 = "relu2"
MLP_ACTS = (SILU, RELU2)
"""FFN activations: silu is gated (Llama: down(silu(gate x) * up x), 3 matrices); relu2 is not (Nemotron-H:
down(relu(up x)^2), 2 matrices)."""


@dataclass(frozen=True, slots=True)
class LayerSpec:
    """One decoder layer: token mixers run in parallel on the same input (FalconH1 has both), then an optional FFN.

    Nemotron-H's separate layers map to LayerSpec(mixers=("mamba",)), LayerSpec(mixers=("attention",)),
    LayerSpec(mixers=(), ffn="mlp"); a Llama layer is LayerSpec(mixers=("attention",), ffn="mlp").
    """

    mixers: tuple[str, ...] = ()
    ffn: str | None = None

    def __post_init__(self) -> None:
        for m in self.mixers:
            if m not in MIXERS:
                raise ValueError(f"layer mixer {m!r} is unknown: use one of {', '.join(MIXERS)}")
        if self.ffn is not None and self.ffn not in FFNS:
            raise ValueError(f"layer ffn {self.ffn!r} is unknown: use one of {', '.join(FFNS)} or none")
        if not self.mixers and self.ffn is None:
            raise ValueError("a layer needs a mixer or an ffn")

    @property
    def has_attention(self) -> bool:
        return ATTENTION in self.mixers

    @property
    def has_mamba(self) -> bool:
        return MAMBA in self.mixers

    @property
    def code(self) -> str:
        """One character a layer, for printing patterns: A attention, M mamba, P parallel (both), - MLP, E MoE;
        a mixer layer with an FFN prints the mixer in upper case, without one in lower case."""
        if self.has_attention and self.has_mamba:
            c = "P"
        elif self.has_attention:
            c = "A"
        elif self.has_mamba:
            c = "M"
        else:
            return "-" if self.ffn == MLP else "E"
        return c if self.ffn is not None else c.lower()


@dataclass(kw_only=True, slots=True)
class ModelSpec:
    """Shapes of a decoder-only model with attention and/or Mamba2 layers. Weights are random (dummy), as servers do."""

    name: str
    """Preset name or the path the spec was read from."""
    family: str
    """Architecture family: llama, qwen2, qwen3, mistral, nemotron_h, jamba, bamba, falcon_h1."""
    layers: tuple[LayerSpec, ...]
    hidden_size: int
    vocab_size: int = 32000
    intermediate_size: int = 0
    """MLP inner width."""
    mlp_act: str = SILU
    """FFN activation of the MLP and of the MoE experts, one of MLP_ACTS: silu (gated, 3 matrices) or relu2
    (squared ReLU, not gated, 2 matrices)."""
    rms_norm_eps: float = 1e-5

    # attention
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    rope_theta: float = 10000.0

    # Mamba2
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    ssm_state_size: int = 0
    """d_state: size of the SSM state per head and head dim."""
    conv_kernel: int = 4
    mamba_n_groups: int = 1
    mamba_chunk_size: int = 128
    """Chunk length of the SSD scan (an algorithmic block size, not the prefill chunk)."""

    # MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0

    dtype: str | None = None
    """torch dtype name (float32, bfloat16, float16); None means bf16 on GPU, fp32 on CPU."""
    extra: dict = field(default_factory=dict)
    """Fields read from a HuggingFace config that ppprof keeps for the record only."""

    def __post_init__(self) -> None:
        if not self.layers:
            raise ValueError(f"model {self.name!r} has no layers: give at least one layer")
        _positive(self, "hidden_size", "vocab_size")
        if self.mlp_act not in MLP_ACTS:
            raise ValueError(f"model {self.name!r}: mlp_act={self.mlp_act!r} is unknown: use one of "
                             f"{', '.join(MLP_ACTS)}")
        if any(layer.ffn == MLP for layer in self.layers):
            _positive(self, "intermediate_size")
        if any(layer.has_attention for layer in self.layers):
            _positive(self, "num_attention_heads", "num_key_value_heads", "head_dim")
            if self.num_attention_heads % self.num_key_value_heads:
                raise ValueError(
                    f"num_attention_heads ({self.num_attention_heads}) is not a multiple of num_key_value_heads "
                    f"({self.num_key_value_heads}): use a divisor of num_attention_heads"
                )
        if any(layer.has_mamba for layer in self.layers):
            _positive(self, "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "conv_kernel", "mamba_n_groups",
                      "mamba_chunk_size")
            if self.mamba_num_heads % self.mamba_n_groups:
                raise ValueError(
                    f"mamba_num_heads ({self.mamba_num_heads}) is not a multiple of mamba_n_groups "
                    f"({self.mamba_n_groups}): use a divisor of mamba_num_heads"
                )
        if any(layer.ffn == MOE for layer in self.layers):
            _positive(self, "num_experts", "num_experts_per_tok", "moe_intermediate_size")
            if self.num_experts_per_tok > self.num_experts:
                raise ValueError(
                    f"num_experts_per_tok ({self.num_experts_per_tok}) exceeds num_experts ({self.num_experts}): "
                    "lower num_experts_per_tok"
                )

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def pattern(self) -> str:
        return "".join(layer.code for layer in self.layers)

    @property
    def mlp_gated(self) -> bool:
        """Whether the FFN has a gate projection (silu) besides up and down (relu2 has not)."""
        return self.mlp_act == SILU

    @property
    def mamba_d_inner(self) -> int:
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels that go through the causal conv: x, B and C."""
        return self.mamba_d_inner + 2 * self.mamba_n_groups * self.ssm_state_size

    def to_dict(self) -> dict:
        d = asdict(self)
        d["layers"] = [{"mixers": list(layer.mixers), "ffn": layer.ffn} for layer in self.layers]
        d["pattern"] = self.pattern
        return d


def _positive(spec: ModelSpec, *names: str) -> None:
    for name in names:
        value = getattr(spec, name)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"model {spec.name!r}: {name}={value!r} must be a positive integer; set it in the config")


MAX_REQUESTS_PER_PROBE = 128
MIN_REQUESTS_PER_PROBE = 8
DEVICES = ("cpu", "cuda")


@dataclass(kw_only=True, slots=True)
class ProfileConfig:
    """Settings of one `ppprof profile` run (flags > --config YAML > these defaults). Checked before any rank starts."""

    model: str = "tiny-hybrid"
    """Preset name, YAML spec, or HuggingFace config.json (or a folder holding one)."""
    num_layers: int | None = None
    """Keep the model's layer pattern but only this many layers (real shapes on a small machine)."""
    nproc_per_node: int = 2
    """Ranks on this node; the pipeline has one stage per rank (nnodes x nproc_per_node stages)."""
    device: str = "cpu"
    """cpu (gloo) or cuda (NCCL, one GPU per rank)."""
    dtype: str | None = None
    """float32, bfloat16 or float16; default bf16 on cuda, fp32 on cpu."""
    base_chunk_size: int = 512
    """B: the chunk size the policy starts from (SGLang's --chunked-prefill-size; 2-3x the best fixed chunk)."""
    requests_per_probe: int = 128
    """Synthetic prefill requests per probe, 8..128."""
    page_size: int = 1
    """KV cache page size in tokens; probe chunk sizes are multiples of it."""
    max_mamba_cache_size: int = 128
    """Mamba state slots per stage (SGLang's --max-mamba-cache-size)."""
    max_running_requests: int = 128
    """Request pool entries per stage."""
    max_total_tokens: int | None = None
    """KV cache slots per stage; default: the longest probe request (prefix + chunk), rounded up to a page."""
    context_len: int = 32768
    """Longest request the served model takes; recorded for the policy's caps and bounds the prefix probes."""
    prefix_lens: tuple[int, ...] | None = None
    """Prefix lengths of the prefix probes; default: B, 2B, 4B (capped by the context length)."""
    warmup: int = 3
    """Untimed forwards before the first timed one."""
    layer_partition: tuple[int, ...] | None = None
    """Layers per stage, e.g. (3, 5); default: an even split."""
    seed: int = 0
    out: str | None = None
    """Run folder; default results/<run-id>."""
    fit: bool = True
    """Fit the samples and write policy.json and plots at the end of the run."""

    def __post_init__(self) -> None:
        from ppprof.specs.dtypes import normalize_dtype  # here: ppprof.specs imports this module

        try:
            self.dtype = normalize_dtype(self.dtype)
        except ValueError as e:
            raise ValueError(f"--dtype: {e}") from None
        if self.device not in DEVICES:
            raise ValueError(f"--device {self.device!r} is not supported: use cpu or cuda")
        for name, lo in (("nproc_per_node", 1), ("base_chunk_size", 1), ("page_size", 1), ("max_mamba_cache_size", 1),
                         ("max_running_requests", 1), ("context_len", 1), ("warmup", 0), ("seed", 0)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < lo:
                raise ValueError(f"--{name.replace('_', '-')} {value!r} must be an integer >= {lo}")
        if not MIN_REQUESTS_PER_PROBE <= self.requests_per_probe <= MAX_REQUESTS_PER_PROBE:
            raise ValueError(
                f"--requests-per-probe {self.requests_per_probe} is out of range: use "
                f"{MIN_REQUESTS_PER_PROBE}..{MAX_REQUESTS_PER_PROBE}"
            )
        if self.num_layers is not None and self.num_layers < 1:
            raise ValueError(f"--num-layers {self.num_layers} must be >= 1")
        if self.base_chunk_size < self.page_size:
            raise ValueError(
                f"--base-chunk-size {self.base_chunk_size} is smaller than --page-size {self.page_size}: "
                "use a base chunk of at least one page"
            )
        if self.max_chunk_size > self.context_len:
            raise ValueError(
                f"--base-chunk-size {self.base_chunk_size} (largest probe chunk {self.max_chunk_size}) exceeds "
                f"--context-len {self.context_len}: lower the base chunk or raise the context length"
            )
        for p in self.resolved_prefix_lens():
            if p < 0 or p + self.max_chunk_size > self.context_len:
                raise ValueError(
                    f"--prefix-lens value {p} plus the largest probe chunk {self.max_chunk_size} exceeds --context-len "
                    f"{self.context_len}: use prefixes below {self.context_len - self.max_chunk_size}"
                )
        if self.max_total_tokens is not None:
            if self.max_total_tokens % self.page_size:
                raise ValueError(
                    f"--max-total-tokens {self.max_total_tokens} is not a multiple of --page-size {self.page_size}"
                )
            need = self.needed_kv_tokens()
            if self.max_total_tokens < need:
                raise ValueError(
                    f"--base-chunk-size {self.base_chunk_size} does not fit the KV cache: the longest probe request "
                    f"needs {need} slots but --max-total-tokens is {self.max_total_tokens}; raise --max-total-tokens "
                    "or lower --base-chunk-size / --prefix-lens"
                )

    @property
    def max_chunk_size(self) -> int:
        """The largest probe chunk: 1.25 x B, aligned down to the page."""
        return max(self.page_size, int(1.25 * self.base_chunk_size) // self.page_size * self.page_size)

    def resolved_prefix_lens(self) -> tuple[int, ...]:
        if self.prefix_lens is not None:
            return tuple(self.prefix_lens)
        out = []
        for k in (1, 2, 4):
            p = k * self.base_chunk_size // self.page_size * self.page_size
            if p + self.max_chunk_size <= self.context_len:
                out.append(p)
        return tuple(out)

    def needed_kv_tokens(self) -> int:
        """KV slots the longest probe request holds (prefix + the largest chunk), in whole pages."""
        longest = max((*self.resolved_prefix_lens(), 0)) + self.max_chunk_size
        return -(-longest // self.page_size) * self.page_size

    @property
    def kv_tokens(self) -> int:
        return self.max_total_tokens if self.max_total_tokens is not None else self.needed_kv_tokens()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["prefix_lens"] = list(self.resolved_prefix_lens())
        d["max_total_tokens"] = self.kv_tokens
        d["layer_partition"] = None if self.layer_partition is None else list(self.layer_partition)
        return d

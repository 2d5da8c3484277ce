"""The settings of the next-chunk rule (ChunkSettings), part of the settings tree: a profile's run checks them before
any rank starts, `ppprof fit` builds them from its options over the profile's recorded settings, and the policy
file carries them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from ppprof.checks import is_number, require_int
from ppprof.chunks import default_alignment, default_floor

DEFAULT_SMOOTH_FACTOR = 0.75
"""ppprof's default s (SGLang's too): the next chunk is B + s (x - B)."""
DEFAULT_CONTEXT_LEN = 32768
"""The context length a profile bounds its prefixes by, and a policy caps its chunks by, unless one is given."""
CONTEXT_MARGIN = 100
"""Tokens ppprof's rule keeps free at the end of the context (SGLang's 100)."""


@dataclass(kw_only=True, slots=True)
class ChunkSettings:
    """The knobs of the next-chunk rule (named after SGLang's flags), with their defaults resolved and checked."""

    base_chunk_size: int
    """B: the first chunk, the size a static policy always uses, and the size whose latency is the target."""
    smooth_factor: float = DEFAULT_SMOOTH_FACTOR
    """s in (0, 1]: the next chunk is B + s (x - B); 1 follows the model fully."""
    page_size: int = 1
    """KV page size of the server, in tokens."""
    alignment: int = 0
    """Chunk sizes are multiples of this; 0 means max(page_size, 64)."""
    min_chunk_size: int = 0
    """Floor before alignment; 0 means B // 4."""
    max_chunk_size: int = 0
    """Cap from the second chunk on (the server's max prefill tokens; may be below B); 0 means B."""
    context_len: int = DEFAULT_CONTEXT_LEN
    """Model context length; chunks are capped at context_len - prefix_len - context_margin."""
    context_margin: int = field(default=CONTEXT_MARGIN)
    """Tokens kept free at the end of the context (SGLang's 100)."""

    def __post_init__(self) -> None:
        for name, low in (
            ("base_chunk_size", 1),
            ("page_size", 1),
            ("alignment", 0),
            ("min_chunk_size", 0),
            ("max_chunk_size", 0),
            ("context_len", 1),
        ):
            require_int("--" + name.replace("_", "-"), getattr(self, name), low)
        require_int("context_margin", self.context_margin, 0)
        s = self.smooth_factor
        if not is_number(s) or not (0.0 < s <= 1.0):
            raise ValueError(f"--smooth-factor {s!r} is out of range: use a value in (0, 1]")
        self.smooth_factor = float(s)
        B = self.base_chunk_size
        if not self.alignment and default_alignment(self.page_size) > B:
            unit = default_alignment(self.page_size)
            raise ValueError(
                f"--base-chunk-size {B} is below the chunk alignment {unit} = max(--page-size {self.page_size}, 64) "
                f"that dynamic chunks are multiples of: use --base-chunk-size {unit} or more"
            )
        self.alignment = self.alignment or default_alignment(self.page_size)
        self.min_chunk_size = self.min_chunk_size or default_floor(B)
        self.max_chunk_size = self.max_chunk_size or B
        if self.alignment > B:
            raise ValueError(
                f"--alignment {self.alignment} is larger than --base-chunk-size {B}: use a base chunk of at least "
                f"one alignment unit, or a smaller alignment"
            )
        if self.min_chunk_size > B:
            raise ValueError(f"--min-chunk-size {self.min_chunk_size} is above --base-chunk-size {B}: use at most {B}")
        if self.max_chunk_size < self.alignment:
            raise ValueError(
                f"--max-chunk-size {self.max_chunk_size} is below the alignment {self.alignment}: every "
                f"later chunk would be capped to 0 tokens; use at least {self.alignment}"
            )
        if self.context_len < B:
            raise ValueError(f"--context-len {self.context_len} is below --base-chunk-size {B}: use at least {B}")

    def to_dict(self) -> dict:
        return asdict(self)

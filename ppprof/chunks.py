"""Chunk arithmetic every layer shares: aligning a token count to a unit, the default floor of a chunk, walking a
prompt chunk by chunk under a rule, and the settings of the next-chunk rule (ChunkSettings: a profile's run checks them
before any rank starts, `ppprof fit` builds them, the policy file carries them and a server reads them). Pure Python;
imports only the ground floor (ppprof.bounds, ppprof.checks)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import InitVar, asdict, dataclass, field

from ppprof.bounds import MAX_TOKENS
from ppprof.checks import is_number, require_int

MIN_ALIGNMENT = 64
"""Chunk sizes of a dynamic rule are multiples of max(page size, 64), as SGLang aligns them."""


def default_alignment(page_size: int, tp_size: int = 1) -> int:
    """The alignment unit of chunk sizes on a server with this KV page size and TP degree: max(page_size, 64), and a
    multiple of tp_size too (a server's token split across TP ranks needs chunks divisible by them)."""
    return math.lcm(max(page_size, MIN_ALIGNMENT), tp_size)


def chunk_unit(page_size: int, tp_size: int = 1) -> int:
    """What every probe chunk is a multiple of: whole pages, split evenly over the TP ranks (lcm(page, tp))."""
    return math.lcm(page_size, tp_size)


def default_floor(base_chunk_size: int) -> int:
    """The smallest chunk a dynamic rule gives before alignment, by default: B // 4 (SGLang's floor), at least 1."""
    return max(base_chunk_size // 4, 1)


def ceil_div(x: int, unit: int) -> int:
    """How many `unit`s hold `x` (x / unit rounded up), in integers."""
    return -(-x // unit)


def align_up(x: int, unit: int) -> int:
    """x rounded up to a multiple of unit."""
    return ceil_div(x, unit) * unit


def align_down(x: int, unit: int) -> int:
    """x rounded down to a multiple of unit, but at least one unit."""
    return max(unit, x // unit * unit)


def walk(size_at: Callable[[int], int], prompt_len: int) -> list[int]:
    """The chunks of a `prompt_len`-token prompt under a rule: size_at(done) is the next chunk after `done` tokens
    are prefilled; the last chunk takes the rest. ValueError where the rule gives a chunk of less than one token."""
    chunks, done = [], 0
    while done < prompt_len:
        size = min(int(size_at(done)), prompt_len - done)
        if size < 1:
            raise ValueError(f"the rule gave a chunk of {size} tokens after {done}: check the chunk settings")
        chunks.append(size)
        done += size
    return chunks


def positive_root(qa: float, qb: float, qc: float) -> float | None:
    """The root (-qb + sqrt(qb^2 - 4 qa qc)) / (2 qa) of qa x^2 + qb x + qc = 0 (qa != 0) where it is real, finite
    and positive, else None (for qa > 0 the larger root; the caller solves qa == 0 itself)."""
    disc = qb * qb - 4.0 * qa * qc
    if qa == 0 or disc < 0:
        return None
    x = (-qb + math.sqrt(disc)) / (2.0 * qa)
    return x if math.isfinite(x) and x > 0 else None


DEFAULT_SMOOTH_FACTOR = 0.75
"""ppprof's default s (SGLang's too): the next chunk is B + s (x - B)."""
DEFAULT_CONTEXT_LEN = 32768
"""The context length a profile bounds its prefixes by, and a policy caps its chunks by, unless one is given."""
CONTEXT_MARGIN = 100
"""Tokens ppprof's rule keeps free at the end of the context (SGLang's 100)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkSizes:
    """The five chunk settings ppprof's rule and every server's flags share (named after SGLang's flags; each server
    module says which of its flags sets which): the rule's ChunkSettings and a server's ServerSetting are these and
    more. Unchecked here: each says what it accepts."""

    base_chunk_size: int
    """B: the first chunk, the size a static policy always uses, and the size whose latency is the target."""
    smooth_factor: float = DEFAULT_SMOOTH_FACTOR
    """s in (0, 1]: the next chunk is B + s (x - B); 1 follows the model fully."""
    min_chunk_size: int = 0
    """Floor before alignment; 0 means B // 4."""
    max_chunk_size: int = 0
    """Cap from the second chunk on (the server's max prefill tokens; may be below B); 0 means B."""
    page_size: int = 1
    """KV page size of the server, in tokens."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkSettings(ChunkSizes):
    """The knobs of the next-chunk rule, with their defaults resolved and checked: the five chunk sizes, the
    alignment and the context."""

    alignment: int = 0
    """Chunk sizes are multiples of this; 0 means max(page_size, 64)."""
    context_len: int = DEFAULT_CONTEXT_LEN
    """Model context length; chunks are capped at context_len - prefix_len - context_margin."""
    context_margin: int = field(default=CONTEXT_MARGIN)
    """Tokens kept free at the end of the context (SGLang's 100)."""
    tp_size: InitVar[int] = 1
    """The TP degree the chunks are split over (not stored: it shapes the default alignment and what is checked)."""

    def __post_init__(self, tp_size: int) -> None:
        for name, low in (
            ("base_chunk_size", 1),
            ("page_size", 1),
            ("alignment", 0),
            ("min_chunk_size", 0),
            ("max_chunk_size", 0),
            ("context_len", 1),
        ):
            require_int("--" + name.replace("_", "-"), getattr(self, name), low, MAX_TOKENS)
        require_int("context_margin", self.context_margin, 0, MAX_TOKENS)
        s = self.smooth_factor
        if not is_number(s) or not (0.0 < s <= 1.0):
            raise ValueError(f"--smooth-factor {s!r} is out of range: use a value in (0, 1]")
        object.__setattr__(self, "smooth_factor", float(s))
        B = self.base_chunk_size
        check_base_chunk(B, self.page_size, tp_size, self.alignment)
        resolved = {  # frozen: the defaults are resolved once, here
            "alignment": self.alignment or default_alignment(self.page_size, tp_size),
            "min_chunk_size": self.min_chunk_size or default_floor(B),
            "max_chunk_size": self.max_chunk_size or B,
        }
        for name, value in resolved.items():
            object.__setattr__(self, name, value)
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
        """policy.json's `settings`, in the order it has always had."""
        d = asdict(self)
        return {k: d[k] for k in SETTINGS_ORDER}


SETTINGS_ORDER = (
    "base_chunk_size",
    "smooth_factor",
    "page_size",
    "alignment",
    "min_chunk_size",
    "max_chunk_size",
    "context_len",
    "context_margin",
)


def check_base_chunk(
    base_chunk_size: int, page_size: int, tp_size: int = 1, alignment: int | None = 0, *, probes: bool = False
) -> None:
    """The one check that the base chunk B holds at least one unit of what chunks are multiples of (ValueError, one
    line, naming the unit and its flags): with `probes`, every probe chunk, whole pages split evenly over the TP ranks
    (lcm(page, tp)); the rule's chunks, multiples of its alignment: --alignment where given (itself a multiple of the
    TP degree), else lcm(max(page, 64), tp). `alignment` None: no rule is built (a profile of samples only)."""
    B, unit = base_chunk_size, chunk_unit(page_size, tp_size)
    if probes and B < unit:
        of = (
            f"--page-size {page_size}"
            if tp_size == 1
            else f"{unit} = lcm(--page-size {page_size}, --tp-size {tp_size})"
        )
        raise ValueError(
            f"--base-chunk-size {B} is smaller than {of}, the unit every chunk is split evenly over the TP ranks in: "
            f"use --base-chunk-size {unit} or a multiple of it"
        )
    if alignment is None:
        return
    if alignment:
        if alignment % tp_size:
            raise ValueError(
                f"--alignment {alignment} is not a multiple of the profile's --tp-size {tp_size}: its chunks would "
                f"not split evenly over the TP ranks; use a multiple of {tp_size}"
            )
        if alignment > B:
            raise ValueError(
                f"--alignment {alignment} is larger than --base-chunk-size {B}: use a base chunk of at least one "
                "alignment unit, or a smaller alignment"
            )
        return
    unit = default_alignment(page_size, tp_size)
    if unit > B:
        of = f"max(--page-size {page_size}, 64)"
        of = of if unit == default_alignment(page_size) else f"lcm({of}, --tp-size {tp_size})"
        raise ValueError(
            f"--base-chunk-size {B} is below the chunk alignment {unit} = {of} that dynamic chunks are multiples of: "
            f"use --base-chunk-size {unit} or more"
        )

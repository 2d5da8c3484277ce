"""Latency models of a prefill chunk, and the greedy equal-latency next-chunk rule built on them, with its lookup table.

Both models are kept as the four coefficients of the prefix-aware form (ATOM's), so that planning is the same code:

    chunk latency  t(L, x) = c + g L + b x + a (2 L x + x^2)     (L = prefix_len cached tokens, x = chunk_size new ones)

- `quadratic` (SGLang's): f(l) = a l^2 + b l + c, fitted (as SGLang does) on prefix-free requests only, where a
  request of l tokens really takes f(l); g = 0. A chunk of x tokens after L cached ones costs the fixed cost plus the
  growth of f: c + f(L + x) - f(L), which is the form above with g = 0.
- `prefix` (ATOM's): t(L, x) fitted directly; g is the per-chunk work proportional to the prefix.


Rule for a prompt whose first `L` tokens are already prefilled (B = base chunk size, s = smooth factor):
  1. L == 0: the first chunk is B.
  2. x = positive root of the model's equal-latency equation (see LatencyModel.equal_latency_chunk); none: B.
  3. smoothed = int(B + s (x - B)), floored at min_chunk_size (default B // 4, SGLang's floor).
  4. aligned down to the alignment, at least one alignment unit.
  5. capped at min(context_len - L - CONTEXT_MARGIN, max_chunk_size), aligned down again; 0 means "use B".
The cap applies from the second chunk on: max_chunk_size (SGLang's max_prefill_tokens) may be below B, and the
first chunk is B all the same, as in SGLang.
Pure Python and numpy; no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ppprof.chunks import positive_root
from ppprof.config.chunk import ChunkSettings

MODEL_NAMES = ("quadratic", "prefix", "pairs")
NO_CALIBRATION = {"linear_scale": 1.0, "shift_ms": 0.0, "source": "none"}
"""The policy's calibration where none was measured (LatencyModel.planning leaves the model as fitted)."""
COEF_UNITS = {"a": "ms/token^2", "b": "ms/token", "c": "ms", "g": "ms/token", "h": "ms/token^3"}
MODEL_COEFS = {"quadratic": ("a", "b", "c"), "prefix": ("a", "b", "c", "g"), "pairs": ("a", "b", "c", "g", "h")}
FORMS = {
    "quadratic": "f(l) = a*l^2 + b*l + c, fitted on prefix-free samples (l = chunk_size); chunk c + f(L+x) - f(L)",
    "prefix": "t(L, x) = c + g*L + b*x + a*(2*L*x + x^2), L = prefix_len, x = chunk_size",
    "pairs": "t(L, x) = c + g*L + b*x + a*(2*L*x + x^2) + h*L*x^2: the cost of a query-key pair across the prefix, "
    "a + h*x/2, changes with the chunk size (h < 0: larger chunks reuse each key over more queries)",
}


@dataclass(frozen=True, slots=True)
class LatencyModel:
    """Fitted coefficients (COEF_UNITS) of one of MODEL_NAMES; those the model lacks (MODEL_COEFS) are 0."""

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
        """Latency of a chunk of `chunk_size` new tokens after `prefix_len` cached tokens (works on arrays).

        This is what the planner sums, what each model's fit is scored with, and (for a prefix-free sample,
        prefix_len = 0) the quadratic's f(chunk_size).
        """
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
        """The planning model: the policy's calibration onto the pipelined level, linear_scale * (c + b x) + the
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
            values[key] = float(entry["value"])
        return cls(name=d["name"], **values)


def sglang_f(model: LatencyModel, l):
    """SGLang's f(l) = a*l*l + b*l + c, evaluated in its order ((a*l)*l, not a*l**2) so floats round the same way."""
    return model.a * l * l + model.b * l + model.c


def next_chunk_size(model: LatencyModel, settings: ChunkSettings, target_ms: float, prefix_len: int) -> int:
    """The rule in the module docstring, evaluated directly (the table is built from this)."""
    B = settings.base_chunk_size
    if prefix_len == 0:
        return B
    x = model.equal_latency_chunk(prefix_len, target_ms)
    if x is None:
        return B
    align = settings.alignment
    size = int(B + settings.smooth_factor * (x - B))
    size = max(size, settings.min_chunk_size)
    size = (size // align) * align
    size = max(size, align)
    size = min(size, chunk_cap(settings, prefix_len))
    size = (size // align) * align
    return size if size > 0 else B


def chunk_cap(settings: ChunkSettings, prefix_len: int) -> int:
    """The largest chunk allowed after `prefix_len` tokens: min(context_len - L - margin, max_chunk_size)."""
    return min(settings.context_len - prefix_len - settings.context_margin, settings.max_chunk_size)


def monotone_end(settings: ChunkSettings) -> int:
    """First prefix length at which the context cap leaves less than one alignment unit (the rule gives B again)."""
    return max(1, settings.context_len - settings.context_margin - settings.alignment + 1)


def build_table(model: LatencyModel, settings: ChunkSettings, target_ms: float) -> tuple[list[int], list[int]]:
    """Breakpoints (prefix_len starts, chunk sizes): size(L) = sizes[i] for the last i with starts[i] <= L.

    Exact for every integer L >= 0: on [1, monotone_end) the rule is non-increasing in L (the root shrinks as L grows,
    and the context cap shrinks too), so each change is found by bisection; L = 0 and L >= monotone_end give B.
    """
    B = settings.base_chunk_size
    end = monotone_end(settings)
    starts, sizes = [0], [B]

    def rule(L: int) -> int:
        return next_chunk_size(model, settings, target_ms, L)

    L = 1
    while L < end:
        size = rule(L)
        if size != sizes[-1]:
            starts.append(L)
            sizes.append(size)
        lo, hi = L, end  # rule(lo) == size; find the first L' in (lo, end) with rule(L') != size, or end
        if rule(end - 1) == size:
            break
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if rule(mid) == size:
                lo = mid
            else:
                hi = mid
        L = hi
    if sizes[-1] != B:
        starts.append(end)
        sizes.append(B)
    return starts, sizes


def check_rule(model: LatencyModel, settings: ChunkSettings, target_ms: float, num_points: int = 4096) -> None:
    """Raise ValueError unless the rule's sizes are aligned, within the clamps and non-increasing in prefix_len.

    The first chunk (prefix 0) must be B and is exempt from the cap (max_chunk_size may be below B, as SGLang's
    max_prefill_tokens may be below its chunked_prefill_size); the clamps are checked from prefix 1 on.
    """
    first = next_chunk_size(model, settings, target_ms, 0)
    if first != settings.base_chunk_size:
        raise ValueError(f"first chunk {first} is not the base chunk size {settings.base_chunk_size}")
    end = monotone_end(settings)
    step = max(1, end // num_points)
    align = settings.alignment
    previous = math.inf
    for L in range(1, end, step):
        size = next_chunk_size(model, settings, target_ms, L)
        cap = chunk_cap(settings, L)
        if size % align:
            raise ValueError(f"chunk size {size} at prefix_len {L} is not a multiple of alignment {align}")
        if not (align <= size <= cap):
            raise ValueError(f"chunk size {size} at prefix_len {L} is outside [{align}, {cap}]")
        if size > previous:
            raise ValueError(f"chunk size grows from {previous} to {size} at prefix_len {L}: sizes must not increase")
        previous = size

"""What each server does with its chunking flags: the flags read and written in its own syntax, the latency model it
has at run time, and its next-chunk rule. The rules are re-derived here from each server's documentation (our code):

SGLang (`--enable-dynamic-chunking`, `--chunked-prefill-size` B, `--max-prefill-tokens`,
SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR, default 0.75): at boot it fits f(l) = a l^2 + b l + c to prefix-free forwards
(a <= 0: dynamic chunking stays off; b < 0 -> 0); the rule is ppprof's own (ppprof.policy.rule): floor B // 4,
aligned down to max(page, 64), capped at min(context - L - 100, max_prefill_tokens).

vllm-ascend (`--max-num-batched-tokens` B, `--additional-config` profiling_chunk_config {enabled, smooth_factor
(default 1.0), min_chunk (default 4096)}; since its docs moved it, under scheduler_config): the same boot fit on 64
prefix-free forwards, but a < 0 -> 1e-9 (a == 0 keeps B) and b kept as fitted; T = f(B) - f(0) (<= 0 -> 1 ms); the
root, smoothed, floored at min_chunk, aligned UP to max(page, 64), then limited by the token budget B and by
max_model_len - 1 - L; the first chunk is the budget B. Online calibration (need_timing, on by default) later refits a
prefix-aware model on live batches: those chunk sizes are not predicted here.

ATOM (`--enable-dynamic-chunking`, `--max-num-batched-tokens` (the ceiling; fixed chunking uses it),
`--dynamic-chunking-base-size` B (0: the ceiling), `--dynamic-chunking-smooth-factor`,
`--dynamic-chunking-min-chunk-size` (default 4096), `--dynamic-chunking-calibration a,b,c,gamma` (ms, tokens)): the
prefix model t(L, x) = c + gamma L + b x + a (2 L x + x^2) given by the calibration flag (a > 0, b >= 0, gamma >= 0);
the first chunk is min(B, ceiling); after L tokens x solves a (2 L x + x^2) + b x = a B^2 + b B - gamma L (nothing
left: B); smoothed; floored at max(block, min chunk, the chunk whose prefix cost gamma L is at most 20% of its
latency); at most min(B, ceiling); aligned down to the KV block size.

Pure Python and numpy; no torch.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, replace

import numpy as np

from ppprof.checks import is_int
from ppprof.chunks import align_up, positive_root, walk
from ppprof.config import ChunkSettings
from ppprof.policy.rule import LatencyModel, next_chunk_size

SERVERS = ("sglang", "vllm-ascend", "atom")
LABELS = {"sglang": "SGLang", "vllm-ascend": "vllm-ascend", "atom": "ATOM"}
TARGETS = {
    "sglang": "SGLang's documented dynamic chunking (--enable-dynamic-chunking, SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR)",
    "vllm-ascend": "vllm-ascend's latest docs (2026-11: --additional-config scheduler_config.profiling_chunk_config, "
                   "smooth_factor default 1.0, min_chunk 4096); the v0.20.2rc and v0.22.1rc guides show the top-level "
                   "profiling_chunk_config, which later releases still read (deprecated)",
    "atom": "ATOM's Dynamic CPP guide (--enable-dynamic-chunking with --dynamic-chunking-calibration)",
}
SGLANG_SMOOTH_ENV = "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR"
VLLM_ASCEND_A_FLOOR = 1e-9  # vllm-ascend replaces a negative fitted a with this
ATOM_PREFIX_SHARE = 0.2  # ATOM floors a chunk where its prefix cost gamma * L would exceed this share of its latency
CONTEXT_MARGIN = {"sglang": 100, "vllm-ascend": 1, "atom": 0}


@dataclass(frozen=True, slots=True)
class ServerSetting:
    """One server's chunking flags, in ppprof's words.

    base_chunk_size: the first chunk and the size the target latency is taken from (SGLang --chunked-prefill-size,
    vllm-ascend --max-num-batched-tokens, ATOM --dynamic-chunking-base-size, 0 there meaning the ceiling).
    max_chunk_size: the cap (SGLang --max-prefill-tokens from the second chunk on; vllm-ascend the token budget, = B;
    ATOM --max-num-batched-tokens, every chunk, and the fixed chunk size when dynamic chunking is off).
    min_chunk_size: the floor before alignment (SGLang B // 4, not a flag; vllm-ascend min_chunk; ATOM
    --dynamic-chunking-min-chunk-size).
    """

    server: str
    base_chunk_size: int
    dynamic: bool
    smooth_factor: float
    min_chunk_size: int
    max_chunk_size: int
    page_size: int = 1

    @property
    def alignment(self) -> int:
        return self.page_size if self.server == "atom" else max(self.page_size, 64)

    @property
    def fixed_chunk_size(self) -> int:
        """The chunk size with dynamic chunking off."""
        return self.max_chunk_size if self.server == "atom" else self.base_chunk_size

    def to_dict(self) -> dict:
        return {"server": self.server, "base_chunk_size": self.base_chunk_size, "dynamic": self.dynamic,
                "smooth_factor": self.smooth_factor, "min_chunk_size": self.min_chunk_size,
                "max_chunk_size": self.max_chunk_size, "page_size": self.page_size}


def default_setting(server: str, page_size: int = 1) -> ServerSetting:
    """The server's settings when the user gives none (dynamic chunking is off by default in all three).

    SGLang: --chunked-prefill-size 8192 (its default on large GPUs), --max-prefill-tokens 16384, s 0.75.
    vllm-ascend: --max-num-batched-tokens 8192 (vllm serve's default), smooth_factor 1.0, min_chunk 4096.
    ATOM: --max-num-batched-tokens 32768 (the default its Dynamic CPP guide measures), s 1.0, min chunk 4096.
    """
    if server == "sglang":
        return ServerSetting("sglang", 8192, False, 0.75, 8192 // 4, 16384, page_size)
    if server == "vllm-ascend":
        return ServerSetting("vllm-ascend", 8192, False, 1.0, 4096, 8192, page_size)
    if server == "atom":
        return ServerSetting("atom", 32768, False, 1.0, 4096, 32768, page_size)
    raise ValueError(f"--server {server!r} is unknown: use one of {', '.join(SERVERS)}")


# --- the model each server sizes chunks with -----------------------------------------------------------------------


def boot_model(server: str, model: LatencyModel | None, domain: dict | None = None) -> LatencyModel | None:
    """The latency model `server` sizes chunks with when `model` (ppprof's) is the truth; None: it keeps chunks fixed.

    SGLang and vllm-ascend fit a quadratic to prefix-free forwards at boot. Every ppprof model's prefix-free latency
    t(0, l) = c + b l + a l^2 is exactly that quadratic, so a least-squares fit of noise-free forwards returns
    (a, b, c); each server's clamps are then applied. (A uniform factor between the stage the server times and the
    bottleneck stage cancels in the rule.) ATOM takes the prefix model from --dynamic-chunking-calibration, which the
    export fills with ppprof's coefficients (a pairs model's prefix-form fit, `prefix_form`).
    """
    if model is None:
        return None
    if server == "sglang":
        if model.a <= 0:
            return None
        return LatencyModel("quadratic", a=model.a, b=max(model.b, 0.0), c=model.c)
    if server == "vllm-ascend":
        a = VLLM_ASCEND_A_FLOOR if model.a < 0 else model.a
        return LatencyModel("quadratic", a=a, b=model.b, c=model.c)
    if server == "atom":
        prefix = prefix_form(model, domain)
        if prefix.a <= 0 or prefix.b < 0 or prefix.g < 0:
            return None
        return prefix
    raise ValueError(f"--server {server!r} is unknown: use one of {', '.join(SERVERS)}")


def prefix_form(model: LatencyModel, domain: dict | None = None) -> LatencyModel:
    """`model` as ATOM's four coefficients: itself for prefix, g = 0 for quadratic, and for pairs the least-squares
    prefix model over the profiled domain (prefix lengths x chunk sizes), the h term folded into a and g."""
    if model.name == "prefix":
        return model
    if model.name == "quadratic":
        return LatencyModel("prefix", a=model.a, b=model.b, c=model.c, g=0.0)
    dom = domain or {}
    (p0, p1), (c0, c1) = dom.get("prefix_len", (0, 32768)), dom.get("chunk_size", (64, 8192))
    L, x = np.meshgrid(np.linspace(p0, p1, 24), np.linspace(max(c0, 1), max(c1, 2), 24))
    L, x = L.ravel(), x.ravel()
    t = model.chunk_latency_ms(L, x)
    design = np.column_stack([2 * L * x + x * x, x, np.ones_like(x), L])
    scale = np.abs(design).max(axis=0)
    coef, *_ = np.linalg.lstsq(design / scale, t, rcond=None)
    a, b, c, g = (float(v) for v in coef / scale)
    return LatencyModel("prefix", a=a, b=b, c=c, g=g)


# --- each server's rule ----------------------------------------------------------------------------------------------


class ServerRule:
    """`next(L)`: the next chunk `setting.server` prefills after L tokens (before the prompt's remainder limits it),
    with the model it has (`boot_model`) and a context of `context_len` tokens."""

    def __init__(self, setting: ServerSetting, model: LatencyModel | None, context_len: int):
        self.setting, self.model, self.context_len = setting, model, context_len
        self.server = setting.server
        s = setting
        self.target = None
        if s.dynamic and model is not None:
            B = float(s.base_chunk_size)
            if self.server == "sglang":
                self.chunk_settings = ChunkSettings(base_chunk_size=s.base_chunk_size, smooth_factor=s.smooth_factor,
                                                    page_size=s.page_size, max_chunk_size=s.max_chunk_size,
                                                    context_len=context_len)
                self.target = model.target_ms(s.base_chunk_size)
            elif self.server == "vllm-ascend":
                f = lambda l: model.a * l * l + model.b * l + model.c  # noqa: E731 - f(l) in its literal order
                self.target = f(B) - f(0.0)
                if self.target <= 0:
                    self.target = 1.0
            else:
                self.target = model.a * B * B + model.b * B

    def next(self, prefix_len: int) -> int:
        s, m, L = self.setting, self.model, prefix_len
        if self.server == "sglang":
            if self.target is None:
                return s.base_chunk_size
            return next_chunk_size(m, self.chunk_settings, self.target, L)
        if self.server == "vllm-ascend":
            budget = max(1, min(s.base_chunk_size, self.context_len - CONTEXT_MARGIN["vllm-ascend"] - L))
            if self.target is None or L == 0 or m.a <= 0:
                return budget
            x = concave_free_root(m.a, 2.0 * m.a * L + m.b, -self.target)
            if x is None:
                return budget
            size = max(int(s.base_chunk_size + s.smooth_factor * (x - s.base_chunk_size)), s.min_chunk_size)
            align = s.alignment
            size = max(align_up(size, align), align)
            return min(size, budget)
        # atom
        ceiling = s.max_chunk_size
        if self.target is None:
            return ceiling
        B = s.base_chunk_size
        fallback = min(B, ceiling)
        if L == 0:  # the first chunk is the base size (the root is B up to rounding)
            return fallback - fallback % s.alignment
        budget = self.target - m.g * L
        if budget <= 0:
            return fallback
        x = concave_free_root(m.a, 2.0 * m.a * L + m.b, -budget)
        if x is None:
            return fallback
        smoothed = B + s.smooth_factor * (x - B)
        floor = 0.0
        if m.g > 0 and L > 0:
            floor = concave_free_root(m.a, 2.0 * m.a * L + m.b, -m.g * L * (1 - ATOM_PREFIX_SHARE) / ATOM_PREFIX_SHARE) or 0
        align = s.alignment
        lower = max(align, s.min_chunk_size, int(floor))
        size = min(max(int(smoothed), lower), B, ceiling)
        size -= size % align
        return size if size >= align else fallback


def concave_free_root(qa: float, qb: float, qc: float) -> float | None:
    """positive_root where the quadratic term is positive (the servers' rules solve no concave model), else None."""
    return positive_root(qa, qb, qc) if qa > 0 else None


def chunk_sequence(rule, length: int) -> np.ndarray:
    """The chunks `rule` gives a prompt of `length` tokens; a shorter prompt's chunks are these, cut at its length."""
    return np.asarray(walk(rule, length), dtype=np.int64)


def cut(chunks: np.ndarray, prompt_len: int) -> np.ndarray:
    """The plan of a `prompt_len` prompt from the chunks of a longer one (the last chunk takes the rest)."""
    ends = np.cumsum(chunks)
    k = int(np.searchsorted(ends, prompt_len, side="left"))
    out = chunks[: k + 1].copy()
    out[-1] = prompt_len - (int(ends[k - 1]) if k else 0)
    return out


# --- flags in each server's syntax -----------------------------------------------------------------------------------


def format_flags(setting: ServerSetting, calibration: LatencyModel | None = None) -> tuple[dict, list[str]]:
    """(environment, arguments) that set `setting` on its server; ATOM's calibration when dynamic."""
    s = setting
    if s.server == "sglang":
        args = ["--chunked-prefill-size", str(s.base_chunk_size), "--max-prefill-tokens", str(s.max_chunk_size)]
        if s.page_size > 1:
            args += ["--page-size", str(s.page_size)]
        if not s.dynamic:
            return {}, args
        return {SGLANG_SMOOTH_ENV: f"{s.smooth_factor:g}"}, ["--enable-dynamic-chunking"] + args
    if s.server == "vllm-ascend":
        config = {"scheduler_config": {"profiling_chunk_config": {
            "enabled": s.dynamic, "smooth_factor": round(s.smooth_factor, 6), "min_chunk": s.min_chunk_size}}}
        args = ["--max-num-batched-tokens", str(s.base_chunk_size)]
        if s.page_size > 1:
            args += ["--block-size", str(s.page_size)]
        return {}, args + ["--additional-config", json.dumps(config, separators=(",", ":"))]
    args = ["--max-num-batched-tokens", str(s.max_chunk_size)]
    if s.page_size > 1:
        args += ["--block-size", str(s.page_size)]
    if not s.dynamic:
        return {}, args
    args = ["--enable-dynamic-chunking", "--dynamic-chunking-base-size", str(s.base_chunk_size),
            "--dynamic-chunking-smooth-factor", f"{s.smooth_factor:g}",
            "--dynamic-chunking-min-chunk-size", str(s.min_chunk_size)] + args
    if calibration is not None:
        coefs = ",".join(f"{v:.6g}" for v in (calibration.a, calibration.b, calibration.c, calibration.g))
        args += ["--dynamic-chunking-calibration", coefs]
    return {}, args


def command_line(env: dict, args: list[str]) -> str:
    return " ".join([f"{k}={shlex.quote(v)}" for k, v in env.items()] + [shlex.quote(a) for a in args])


FLAG_KEYS = {
    "sglang": {"--chunked-prefill-size": "base_chunk_size", "--max-prefill-tokens": "max_chunk_size",
               "--page-size": "page_size", "--enable-dynamic-chunking": "dynamic", SGLANG_SMOOTH_ENV: "smooth_factor"},
    "vllm-ascend": {"--max-num-batched-tokens": "base_chunk_size", "--block-size": "page_size",
                    "--additional-config": "additional_config"},
    "atom": {"--max-num-batched-tokens": "max_chunk_size", "--block-size": "page_size",
             "--enable-dynamic-chunking": "dynamic", "--dynamic-chunking-base-size": "base_chunk_size",
             "--dynamic-chunking-smooth-factor": "smooth_factor",
             "--dynamic-chunking-min-chunk-size": "min_chunk_size", "--dynamic-chunking-calibration": "calibration"},
}


def parse_flags(server: str, text: str, page_size: int = 1) -> tuple[ServerSetting, LatencyModel | None, list[str]]:
    """(setting, ATOM calibration or None, ignored tokens) from a command line in `server`'s syntax (`ppprof tune
    --current`, or an export read back); settings not given keep the server's defaults. ValueError (one line)
    naming the flag on a bad value."""
    if server not in SERVERS:
        raise ValueError(f"--server {server!r} is unknown: use one of {', '.join(SERVERS)}")
    try:
        tokens = shlex.split(text)
    except ValueError as e:
        raise ValueError(f"--current {text!r} is not a command line ({e}): quote it as one shell string") from None
    keys = FLAG_KEYS[server]
    values: dict = {}
    ignored: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, eq, inline = token.partition("=")
        if name in keys and keys[name] == "dynamic":
            values["dynamic"] = True
            i += 1
            continue
        if name in keys:
            if eq:
                value = inline
            elif i + 1 < len(tokens):
                value, i = tokens[i + 1], i + 1
            else:
                raise ValueError(f"--current: {name} has no value: give one, e.g. {name} 8192")
            values[keys[name]] = (name, value)
        else:
            ignored.append(token)
        i += 1
    default = default_setting(server, page_size)
    fields = {k: getattr(default, k) for k in ("base_chunk_size", "dynamic", "smooth_factor", "min_chunk_size",
                                                "max_chunk_size", "page_size")}
    calibration = None
    for key, item in values.items():
        if key == "dynamic":
            fields["dynamic"] = True
            continue
        name, value = item
        if key == "smooth_factor":
            fields[key] = parse_number(name, value, float, 0.0, 1.0, low_open=True)
        elif key == "additional_config":
            fields.update(parse_ascend_config(value))
        elif key == "calibration":
            calibration = parse_calibration(name, value)
        else:
            fields[key] = parse_number(name, value, int, 0 if key == "base_chunk_size" and server == "atom" else 1)
    if server == "sglang":
        fields["min_chunk_size"] = max(fields["base_chunk_size"] // 4, 1)
        if "max_chunk_size" not in values:
            fields["max_chunk_size"] = max(default.max_chunk_size, 1)
    elif server == "vllm-ascend":
        fields["max_chunk_size"] = fields["base_chunk_size"]
    elif server == "atom":
        if "base_chunk_size" not in values or fields["base_chunk_size"] == 0:
            fields["base_chunk_size"] = fields["max_chunk_size"]
    setting = ServerSetting(server, **fields)
    check_setting(setting)
    return setting, calibration, ignored


def parse_number(name: str, value: str, kind, low, high=None, low_open=False):
    try:
        number = kind(value)
    except ValueError:
        raise ValueError(f"--current: {name} {value!r} is not {'an integer' if kind is int else 'a number'}: "
                         f"give one") from None
    if not math.isfinite(number) or (number <= low if low_open else number < low) or \
            (high is not None and number > high):
        bound = f"in ({low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"--current: {name} {value} is out of range: use a value {bound}")
    return number


def parse_ascend_config(value: str) -> dict:
    """smooth_factor, min_chunk and enabled from vllm-ascend's --additional-config (either layout)."""
    try:
        config = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"--current: --additional-config is not JSON ({e.msg}): quote the JSON") from None
    if not isinstance(config, dict):
        raise ValueError("--current: --additional-config must be a JSON object")
    nested = (config.get("scheduler_config") or {}).get("profiling_chunk_config") \
        if isinstance(config.get("scheduler_config"), dict) else None
    legacy = config.get("profiling_chunk_config")
    merged = {**(legacy if isinstance(legacy, dict) else {}), **(nested if isinstance(nested, dict) else {})}
    out = {}
    if "enabled" in merged:
        if not isinstance(merged["enabled"], bool):
            raise ValueError(f"--current: profiling_chunk_config.enabled {merged['enabled']!r} must be true or false")
        out["dynamic"] = merged["enabled"]
    if "smooth_factor" in merged:
        out["smooth_factor"] = parse_number("profiling_chunk_config.smooth_factor", str(merged["smooth_factor"]),
                                            float, 0.0, 1.0, low_open=True)
    if "min_chunk" in merged:
        out["min_chunk_size"] = parse_number("profiling_chunk_config.min_chunk", str(merged["min_chunk"]), int, 1)
    return out


def parse_calibration(name: str, value: str) -> LatencyModel:
    parts = value.split(",")
    if len(parts) != 4:
        raise ValueError(f"--current: {name} {value!r} must be four numbers a,b,c,gamma")
    try:
        a, b, c, g = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"--current: {name} {value!r} must be four numbers a,b,c,gamma") from None
    return LatencyModel("prefix", a=a, b=b, c=c, g=g)


def flag_name(server: str, field: str) -> str:
    """The flag that sets `field` on `server` (for messages)."""
    names = {v: k for k, v in FLAG_KEYS[server].items()}
    if server == "vllm-ascend" and field == "max_chunk_size":
        return "--max-num-batched-tokens"
    return names.get(field, field)


def check_setting(s: ServerSetting) -> None:
    """ValueError (one line) for settings the server would refuse or ppprof cannot plan."""
    label = LABELS[s.server]
    for field in ("base_chunk_size", "max_chunk_size"):
        value = getattr(s, field)
        if not is_int(value) or value < s.alignment:
            raise ValueError(f"{label} {flag_name(s.server, field)} {value} is below the alignment {s.alignment}: use "
                             f"at least {s.alignment}")


def with_context(setting: ServerSetting, context_len: int) -> ServerSetting:
    """`setting` with its chunk sizes limited to what a `context_len` context admits (a server default of 8192 on a
    4096-token model runs 4096-token chunks)."""
    limit = max(setting.alignment, context_len - CONTEXT_MARGIN[setting.server] - setting.alignment)
    limit -= limit % setting.alignment
    if setting.fixed_chunk_size <= limit and setting.base_chunk_size <= limit:
        return setting
    base = min(setting.base_chunk_size, limit)
    return replace(setting, base_chunk_size=base, max_chunk_size=min(setting.max_chunk_size, limit),
                   min_chunk_size=min(setting.min_chunk_size, base))

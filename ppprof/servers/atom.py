"""AMD ATOM's Dynamic CPP, as its guide describes it (our re-derivation).

Flags: `--enable-dynamic-chunking`, `--max-num-batched-tokens` (the ceiling; fixed chunking uses it),
`--dynamic-chunking-base-size` B (0: the ceiling), `--dynamic-chunking-smooth-factor`,
`--dynamic-chunking-min-chunk-size` (default 4096), `--dynamic-chunking-calibration a,b,c,gamma` (ms, tokens),
`--block-size`. It fits nothing at boot: the prefix model t(L, x) = c + gamma L + b x + a (2 L x + x^2) is given by
the calibration flag (a > 0, b >= 0, gamma >= 0). The first chunk is min(B, ceiling); after L tokens x solves
a (2 L x + x^2) + b x = a B^2 + b B - gamma L (nothing left: B); smoothed; floored at max(block, min chunk, the chunk
whose prefix cost gamma L is at most 20% of its latency); at most min(B, ceiling); aligned down to the KV block size.
"""

from __future__ import annotations

import numpy as np

from ppprof.chunks import align_down
from ppprof.policy.rule import LatencyModel
from ppprof.policy.runtime import Policy
from ppprof.servers.base import PP_SIZE, TP_SIZE, Server, ServerSetting, concave_free_root
from ppprof.servers.flags import CALIBRATION, DYNAMIC, parse_number

PREFIX_SHARE = 0.2
"""ATOM floors a chunk where its prefix cost gamma * L would exceed this share of its latency."""
DOMAIN_GRID = 24
"""Points per axis of the profiled domain the prefix form of a pairs model is fitted on."""


class AtomRule:
    """The equal-latency root of the prefix model after L tokens, smoothed, floored, capped, aligned down."""

    def __init__(self, setting: ServerSetting, model: LatencyModel | None, context_len: int):
        self.setting, self.model, self.target = setting, model, None
        if setting.dynamic and model is not None:
            B = float(setting.base_chunk_size)
            self.target = model.a * B * B + model.b * B

    def next(self, prefix_len: int) -> int:
        s, m, L = self.setting, self.model, prefix_len
        if self.target is None:
            return s.max_chunk_size
        B, align = s.base_chunk_size, ATOM.alignment(s.page_size)
        fallback = min(B, s.max_chunk_size)
        if L == 0:  # the first chunk is the base size (the root is B up to rounding)
            return align_down(fallback, align)
        budget = self.target - m.g * L
        x = concave_free_root(m.a, 2.0 * m.a * L + m.b, -budget) if budget > 0 else None
        if x is None:
            return fallback
        smoothed = B + s.smooth_factor * (x - B)
        lower = max(align, s.min_chunk_size, int(self.prefix_floor(L)))
        size = min(max(int(smoothed), lower), B, s.max_chunk_size)
        return align_down(size, align) if size >= align else fallback

    def prefix_floor(self, L: int) -> float:
        """The chunk whose prefix cost gamma L is PREFIX_SHARE of its latency (0 without a prefix cost)."""
        m = self.model
        if m.g <= 0 or L <= 0:
            return 0.0
        return concave_free_root(m.a, 2.0 * m.a * L + m.b, -m.g * L * (1 - PREFIX_SHARE) / PREFIX_SHARE) or 0


class Atom(Server):
    name = "atom"
    label = "ATOM"
    targets = "ATOM's Dynamic CPP guide (--enable-dynamic-chunking with --dynamic-chunking-calibration)"
    form = "prefix"
    context_margin = 0
    flag_keys = {
        "--max-num-batched-tokens": "max_chunk_size",
        "--block-size": "page_size",
        "--enable-dynamic-chunking": DYNAMIC,
        "--dynamic-chunking-base-size": "base_chunk_size",
        "--dynamic-chunking-smooth-factor": "smooth_factor",
        "--dynamic-chunking-min-chunk-size": "min_chunk_size",
        "--dynamic-chunking-calibration": CALIBRATION,
    }
    parallel_flags = {
        "--pipeline-parallel-size": PP_SIZE,
        "--tensor-parallel-size": TP_SIZE,
        "-pp": PP_SIZE,
        "-tp": TP_SIZE,
    }
    fits_at_boot = False

    def default_setting(self, page_size: int = 1) -> ServerSetting:
        """--max-num-batched-tokens 32768 (the default its Dynamic CPP guide measures), s 1.0, min chunk 4096."""
        return ServerSetting(
            server=self.name,
            base_chunk_size=32768,
            dynamic=False,
            smooth_factor=1.0,
            min_chunk_size=4096,
            max_chunk_size=32768,
            page_size=page_size,
        )

    def alignment(self, page_size: int) -> int:
        """The KV block size."""
        return page_size

    def fixed_chunk_size(self, setting: ServerSetting) -> int:
        """The ceiling (--max-num-batched-tokens)."""
        return setting.max_chunk_size

    def boot_model(self, model: LatencyModel | None, domain: dict | None = None) -> LatencyModel | None:
        """The calibration its export carries (`prefix_form` of ppprof's model), where ATOM accepts it."""
        if model is None:
            return None
        prefix = prefix_form(model, domain)
        if prefix.a <= 0 or prefix.b < 0 or prefix.g < 0:
            return None
        return prefix

    def calibration(self, policy: Policy) -> LatencyModel | None:
        return None if policy.latency_model is None else prefix_form(policy.latency_model, policy.report.domain)

    def rule(self, setting: ServerSetting, model: LatencyModel | None, context_len: int) -> AtomRule:
        return AtomRule(setting, model, context_len)

    def format_flags(self, setting: ServerSetting, calibration: LatencyModel | None = None) -> tuple[dict, list[str]]:
        s = setting
        args = ["--max-num-batched-tokens", str(s.max_chunk_size)]
        if s.page_size > 1:
            args += ["--block-size", str(s.page_size)]
        if not s.dynamic:
            return {}, args
        args = [
            "--enable-dynamic-chunking",
            "--dynamic-chunking-base-size",
            str(s.base_chunk_size),
            "--dynamic-chunking-smooth-factor",
            f"{s.smooth_factor:g}",
            "--dynamic-chunking-min-chunk-size",
            str(s.min_chunk_size),
        ] + args
        if calibration is not None:
            coefs = ",".join(f"{v:.6g}" for v in (calibration.a, calibration.b, calibration.c, calibration.g))
            args += ["--dynamic-chunking-calibration", coefs]
        return {}, args

    def parse_value(self, key: str, name: str, value: str) -> dict:
        """The calibration as a model; a base size of 0 (the ceiling) is allowed."""
        if key == CALIBRATION:
            return {CALIBRATION: parse_calibration(name, value)}
        if key == "base_chunk_size":
            return {key: parse_number(name, value, int, 0)}
        return super().parse_value(key, name, value)

    def complete(self, fields: dict, given: set[str]) -> dict:
        """No base size, or 0: the ceiling."""
        if "base_chunk_size" not in given or fields["base_chunk_size"] == 0:
            return {**fields, "base_chunk_size": fields["max_chunk_size"]}
        return fields

    def export_header(self, policy: Policy, source: str) -> list[str]:
        return [
            f"# ATOM sizes chunks with the prefix model given by --dynamic-chunking-calibration (ppprof's); "
            f"settings from {source}",
            f"# (policy {policy.status}: {policy.reason}).",
        ]

    def causes(self, policy: Policy) -> list[str]:
        s = policy.settings
        out = [
            f"ATOM aligns down to the KV block size ({s.page_size}), ppprof to {s.alignment}",
            "ATOM floors a chunk at max(block, min chunk, the chunk whose prefix cost gamma*L is 20% of its "
            "latency); ppprof floors at min_chunk_size only",
            "ATOM has no context cap; its ceiling (--max-num-batched-tokens) holds for the first chunk too",
        ]
        if s.max_chunk_size < s.base_chunk_size:
            out.append(
                f"the policy's cap of {s.max_chunk_size} tokens from the second chunk on has no ATOM flag and is lost"
            )
        if policy.latency_model is not None and policy.latency_model.name == "pairs":
            out.append(
                "ATOM carries the prefix form: the pairs model's h term is folded into a and gamma by a "
                "least-squares fit over the profiled domain"
            )
        return out


def prefix_form(model: LatencyModel, domain: dict | None = None) -> LatencyModel:
    """`model` as ATOM's four coefficients: itself for prefix, g = 0 for quadratic, and for pairs the least-squares
    prefix model over the profiled domain (prefix lengths x chunk sizes), the h term folded into a and g."""
    if model.name == "prefix":
        return model
    if model.name == "quadratic":
        return LatencyModel("prefix", a=model.a, b=model.b, c=model.c, g=0.0)
    dom = domain or {}
    (p0, p1), (c0, c1) = dom.get("prefix_len", (0, 32768)), dom.get("chunk_size", (64, 8192))
    L, x = np.meshgrid(np.linspace(p0, p1, DOMAIN_GRID), np.linspace(max(c0, 1), max(c1, 2), DOMAIN_GRID))
    L, x = L.ravel(), x.ravel()
    t = model.chunk_latency_ms(L, x)
    design = np.column_stack([2 * L * x + x * x, x, np.ones_like(x), L])
    scale = np.abs(design).max(axis=0)
    coef, *_ = np.linalg.lstsq(design / scale, t, rcond=None)
    a, b, c, g = (float(v) for v in coef / scale)
    return LatencyModel("prefix", a=a, b=b, c=c, g=g)


def parse_calibration(name: str, value: str) -> LatencyModel:
    """a,b,c,gamma of --dynamic-chunking-calibration as a prefix model."""
    parts = value.split(",")
    if len(parts) != 4:
        raise ValueError(f"--current: {name} {value!r} must be four numbers a,b,c,gamma")
    try:
        a, b, c, g = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"--current: {name} {value!r} must be four numbers a,b,c,gamma") from None
    return LatencyModel("prefix", a=a, b=b, c=c, g=g)


ATOM = Atom()

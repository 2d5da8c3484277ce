"""SGLang, as its docs describe dynamic chunking (our re-derivation).

Flags: `--enable-dynamic-chunking`, `--chunked-prefill-size` B, `--max-prefill-tokens` (the cap from the second chunk
on), `--page-size`, SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR (default 0.75). At boot it fits f(l) = a l^2 + b l + c to
prefix-free forwards (a <= 0: dynamic chunking stays off; b < 0 -> 0). Its rule is ppprof's own (ppprof.policy.rule):
floor B // 4, aligned down to max(page, 64), capped at min(context - L - 100, max_prefill_tokens).
"""

from __future__ import annotations

from ppprof.chunks import align_down, default_floor
from ppprof.config import CONTEXT_MARGIN, ChunkSettings
from ppprof.policy.rule import LatencyModel, next_chunk_size
from ppprof.policy.runtime import Policy
from ppprof.servers.base import PP_SIZE, TP_SIZE, Server, ServerSetting, boot_quadratic_cause
from ppprof.servers.flags import DYNAMIC

SMOOTH_ENV = "SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR"
PARITY = "sglang"
"""The value of `ppprof fit --parity` that fits as SGLang does, and of a policy's diagnostics.parity after it."""


class SGLangRule:
    """ppprof's rule with SGLang's floor (B // 4) and margin; fixed chunks of B without a model."""

    def __init__(self, setting: ServerSetting, model: LatencyModel | None, context_len: int):
        self.setting, self.model, self.target = setting, model, None
        if setting.dynamic and model is not None:
            self.chunk_settings = ChunkSettings(
                base_chunk_size=setting.base_chunk_size,
                smooth_factor=setting.smooth_factor,
                page_size=setting.page_size,
                max_chunk_size=setting.max_chunk_size,
                context_len=context_len,
            )
            self.target = model.target_ms(setting.base_chunk_size)

    def next(self, prefix_len: int) -> int:
        if self.target is None:
            return self.setting.base_chunk_size
        return next_chunk_size(self.model, self.chunk_settings, self.target, prefix_len)


class SGLang(Server):
    name = "sglang"
    label = "SGLang"
    targets = "SGLang's documented dynamic chunking (--enable-dynamic-chunking, SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR)"
    form = "quadratic"
    context_margin = CONTEXT_MARGIN
    flag_keys = {
        "--chunked-prefill-size": "base_chunk_size",
        "--max-prefill-tokens": "max_chunk_size",
        "--page-size": "page_size",
        "--enable-dynamic-chunking": DYNAMIC,
        SMOOTH_ENV: "smooth_factor",
    }
    parallel_flags = {
        "--pp-size": PP_SIZE,
        "--tp-size": TP_SIZE,
        "--pipeline-parallel-size": PP_SIZE,
        "--tensor-parallel-size": TP_SIZE,
        "--tp": TP_SIZE,
    }

    def default_setting(self, page_size: int = 1) -> ServerSetting:
        """--chunked-prefill-size 8192 (its default on large GPUs), --max-prefill-tokens 16384, s 0.75."""
        return ServerSetting(
            server=self.name,
            base_chunk_size=8192,
            dynamic=False,
            smooth_factor=0.75,
            min_chunk_size=default_floor(8192),
            max_chunk_size=16384,
            page_size=page_size,
        )

    def setting_of(self, policy: Policy) -> ServerSetting:
        s = policy.settings
        return ServerSetting(
            server=self.name,
            base_chunk_size=s.base_chunk_size,
            dynamic=policy.status == "dynamic",
            smooth_factor=s.smooth_factor,
            min_chunk_size=default_floor(s.base_chunk_size),
            max_chunk_size=s.max_chunk_size,
            page_size=s.page_size,
        )

    def boot_model(self, model: LatencyModel | None, domain: dict | None = None) -> LatencyModel | None:
        """Every ppprof model's prefix-free latency c + b l + a l^2 is the quadratic SGLang fits, so a least-squares
        fit of noise-free forwards returns (a, b, c); then its clamps."""
        if model is None or model.a <= 0:
            return None
        return LatencyModel("quadratic", a=model.a, b=max(model.b, 0.0), c=model.c)

    def rule(self, setting: ServerSetting, model: LatencyModel | None, context_len: int) -> SGLangRule:
        return SGLangRule(setting, model, context_len)

    def format_flags(self, setting: ServerSetting, calibration: LatencyModel | None = None) -> tuple[dict, list[str]]:
        s = setting
        args = ["--chunked-prefill-size", str(s.base_chunk_size), "--max-prefill-tokens", str(s.max_chunk_size)]
        if s.page_size > 1:
            args += ["--page-size", str(s.page_size)]
        if not s.dynamic:
            return {}, args
        return {SMOOTH_ENV: f"{s.smooth_factor:g}"}, ["--enable-dynamic-chunking"] + args

    def complete(self, fields: dict, given: set[str]) -> dict:
        """The floor is B // 4, not a flag."""
        return {**fields, "min_chunk_size": default_floor(fields["base_chunk_size"])}

    def causes(self, policy: Policy) -> list[str]:
        s, name = policy.settings, policy.latency_model.name if policy.latency_model is not None else None
        out = boot_quadratic_cause(self.label, policy)
        if name == "quadratic" and not fitted_as_sglang(policy):
            out.append(
                "ppprof's fit (warm-up rows dropped, outliers trimmed, gated) may differ from SGLang's boot "
                "fit by one alignment unit at some L; `ppprof fit --latency-model quadratic --parity sglang` "
                "fits as SGLang does"
            )
        if s.min_chunk_size != default_floor(s.base_chunk_size):
            out.append(
                f"SGLang floors chunks at B // 4 = {default_floor(s.base_chunk_size)}, not at min_chunk_size "
                f"{s.min_chunk_size}"
            )
        return out

    def export_notes(self, policy: Policy) -> list[str]:
        if fitted_as_sglang(policy):
            return [
                "# fit: SGLang's own (ppprof fit --parity sglang): its start-up fit of these samples gives these "
                "coefficients"
            ]
        return [
            "# fit: ppprof's (warm-up rows dropped, outliers trimmed, gated); SGLang's own fit of the same "
            "samples may differ (ppprof fit --latency-model quadratic --parity sglang gives it)"
        ]

    # The floor is fixed (B // 4): tune tries the cap instead.

    def dynamic_candidates(self, B: int, smooth_factors, alignment: int, page_size: int) -> list[ServerSetting]:
        """Each smoothing factor with each cap: max(B, the default cap), 3B/4 and B/2 aligned down."""
        default_cap = self.default_setting().max_chunk_size
        caps = sorted(
            {max(B, default_cap)} | {align_down(v, alignment) for v in (B // 2, 3 * B // 4) if v >= alignment}
        )
        return [
            ServerSetting(
                server=self.name,
                base_chunk_size=B,
                dynamic=True,
                smooth_factor=s,
                min_chunk_size=default_floor(B),
                max_chunk_size=cap,
                page_size=page_size,
            )
            for s in smooth_factors
            for cap in caps
        ]

    def fixed_candidate(self, size: int, page_size: int) -> ServerSetting:
        d = self.default_setting()
        return ServerSetting(
            server=self.name,
            base_chunk_size=size,
            dynamic=False,
            smooth_factor=d.smooth_factor,
            min_chunk_size=default_floor(size),
            max_chunk_size=max(size, d.max_chunk_size),
            page_size=page_size,
        )

    def same_knob(self, candidate: ServerSetting, pick: ServerSetting, B: int) -> bool:
        """Refinement keeps the cap above B where the pick's is, else in the same proportion to B."""
        above = candidate.max_chunk_size >= B
        return above == (pick.max_chunk_size >= pick.base_chunk_size) and (
            above or abs(candidate.max_chunk_size / B - pick.max_chunk_size / pick.base_chunk_size) < 0.13
        )


def fitted_as_sglang(policy: Policy) -> bool:
    """The policy's coefficients are SGLang's own fit of its samples (`ppprof fit --parity sglang`)."""
    return (policy.report.diagnostics or {}).get("parity") == PARITY


SGLANG = SGLang()

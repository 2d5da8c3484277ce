"""vllm-ascend's profiling chunk, as its latest docs describe it (our re-derivation).

Flags: `--max-num-batched-tokens` B (the token budget), `--block-size`, `--additional-config` profiling_chunk_config
{enabled, smooth_factor (default 1.0), min_chunk (default 4096)} (since its docs moved it, under scheduler_config).
At boot it fits f(l) = a l^2 + b l + c on 64 prefix-free forwards, but a < 0 -> 1e-9 (a == 0 keeps B) and b is kept
as fitted; T = f(B) - f(0) (<= 0 -> 1 ms); the root, smoothed, floored at min_chunk, aligned UP to max(page, 64),
then limited by the token budget B and by max_model_len - 1 - L; the first chunk is the budget B. Online calibration
(need_timing, on by default) later refits a prefix-aware model on live batches: those chunk sizes are not predicted
here.
"""

from __future__ import annotations

import json

from ppprof.chunks import align_up
from ppprof.policy.rule import LatencyModel
from ppprof.policy.runtime import Policy
from ppprof.servers.base import (
    PP_SIZE,
    TP_SIZE,
    Server,
    ServerSetting,
    boot_quadratic_cause,
    concave_free_root,
    parse_number,
)

A_FLOOR = 1e-9
"""vllm-ascend replaces a negative fitted a with this."""
EMPTY_TARGET_MS = 1.0
"""The target it uses where f(B) - f(0) is not positive."""
ADDITIONAL_CONFIG = "additional_config"


class VllmAscendRule:
    """The equal-latency root after L tokens, smoothed, floored at min_chunk, aligned up, within the budget."""

    def __init__(self, setting: ServerSetting, model: LatencyModel | None, context_len: int):
        self.setting, self.model, self.context_len, self.target = setting, model, context_len, None
        if setting.dynamic and model is not None:
            B = float(setting.base_chunk_size)
            f = lambda l: model.a * l * l + model.b * l + model.c  # noqa: E731 - f(l) in its literal order
            self.target = f(B) - f(0.0)
            if self.target <= 0:
                self.target = EMPTY_TARGET_MS

    def next(self, prefix_len: int) -> int:
        s, m, L = self.setting, self.model, prefix_len
        budget = max(1, min(s.base_chunk_size, self.context_len - VLLM_ASCEND.context_margin - L))
        if self.target is None or L == 0 or m.a <= 0:
            return budget
        x = concave_free_root(m.a, 2.0 * m.a * L + m.b, -self.target)
        if x is None:
            return budget
        size = max(int(s.base_chunk_size + s.smooth_factor * (x - s.base_chunk_size)), s.min_chunk_size)
        align = VLLM_ASCEND.alignment(s.page_size)
        return min(max(align_up(size, align), align), budget)


class VllmAscend(Server):
    name = "vllm-ascend"
    label = "vllm-ascend"
    targets = (
        "vllm-ascend's latest docs (2026-11: --additional-config scheduler_config.profiling_chunk_config, "
        "smooth_factor default 1.0, min_chunk 4096); the v0.20.2rc and v0.22.1rc guides show the outermost "
        "profiling_chunk_config, which later releases still read (deprecated)"
    )
    form = "quadratic"
    context_margin = 1
    flag_keys = {
        "--max-num-batched-tokens": "base_chunk_size",
        "--block-size": "page_size",
        "--additional-config": ADDITIONAL_CONFIG,
    }
    parallel_flags = {
        "--pipeline-parallel-size": PP_SIZE,
        "--tensor-parallel-size": TP_SIZE,
        "-pp": PP_SIZE,
        "-tp": TP_SIZE,
    }

    def default_setting(self, page_size: int = 1) -> ServerSetting:
        """--max-num-batched-tokens 8192 (vllm serve's default), smooth_factor 1.0, min_chunk 4096."""
        return ServerSetting(
            server=self.name,
            base_chunk_size=8192,
            dynamic=False,
            smooth_factor=1.0,
            min_chunk_size=4096,
            max_chunk_size=8192,
            page_size=page_size,
        )

    def boot_model(self, model: LatencyModel | None, domain: dict | None = None) -> LatencyModel | None:
        """The prefix-free quadratic of `model` (as SGLang's), a negative a set to A_FLOOR."""
        if model is None:
            return None
        return LatencyModel("quadratic", a=A_FLOOR if model.a < 0 else model.a, b=model.b, c=model.c)

    def rule(self, setting: ServerSetting, model: LatencyModel | None, context_len: int) -> VllmAscendRule:
        return VllmAscendRule(setting, model, context_len)

    def format_flags(self, setting: ServerSetting, calibration: LatencyModel | None = None) -> tuple[dict, list[str]]:
        s = setting
        config = {
            "scheduler_config": {
                "profiling_chunk_config": {
                    "enabled": s.dynamic,
                    "smooth_factor": round(s.smooth_factor, 6),
                    "min_chunk": s.min_chunk_size,
                }
            }
        }
        args = ["--max-num-batched-tokens", str(s.base_chunk_size)]
        if s.page_size > 1:
            args += ["--block-size", str(s.page_size)]
        return {}, args + ["--additional-config", json.dumps(config, separators=(",", ":"))]

    def parse_value(self, key: str, name: str, value: str) -> dict:
        return parse_ascend_config(value) if key == ADDITIONAL_CONFIG else super().parse_value(key, name, value)

    def complete(self, fields: dict, given: set[str]) -> dict:
        """The cap is the token budget B."""
        return {**fields, "max_chunk_size": fields["base_chunk_size"]}

    def flag_name(self, field: str) -> str:
        return "--max-num-batched-tokens" if field == "max_chunk_size" else super().flag_name(field)

    def causes(self, policy: Policy) -> list[str]:
        s = policy.settings
        out = boot_quadratic_cause(self.label, policy)
        out += [
            "vllm-ascend aligns chunk sizes UP to max(page, 64) where ppprof aligns down",
            f"vllm-ascend floors at min_chunk {s.min_chunk_size} before aligning (ppprof floors, then aligns down)",
            "vllm-ascend caps a chunk only by the token budget B and by max_model_len - 1 - L (ppprof: "
            f"context - L - {s.context_margin})",
            "vllm-ascend sets a negative fitted a to 1e-9 instead of turning dynamic chunking off",
            "vllm-ascend's online calibration (need_timing, on by default) refits a prefix-aware model on live "
            "batches and then sizes chunks with it; set need_timing false to keep the boot fit",
        ]
        if s.max_chunk_size < s.base_chunk_size:
            out.append(f"the policy's cap of {s.max_chunk_size} tokens has no vllm-ascend flag and is lost")
        return out


def parse_ascend_config(value: str) -> dict:
    """dynamic, smooth_factor and min_chunk_size from --additional-config (either layout; the nested one wins)."""
    try:
        config = json.loads(value)
    except json.JSONDecodeError as e:
        raise ValueError(f"--current: --additional-config is not JSON ({e.msg}): quote the JSON") from None
    if not isinstance(config, dict):
        raise ValueError("--current: --additional-config must be a JSON object")
    nested = (
        (config.get("scheduler_config") or {}).get("profiling_chunk_config")
        if isinstance(config.get("scheduler_config"), dict)
        else None
    )
    legacy = config.get("profiling_chunk_config")
    merged = {**(legacy if isinstance(legacy, dict) else {}), **(nested if isinstance(nested, dict) else {})}
    out = {}
    if "enabled" in merged:
        if not isinstance(merged["enabled"], bool):
            raise ValueError(f"--current: profiling_chunk_config.enabled {merged['enabled']!r} must be true or false")
        out["dynamic"] = merged["enabled"]
    if "smooth_factor" in merged:
        out["smooth_factor"] = parse_number(
            "profiling_chunk_config.smooth_factor", str(merged["smooth_factor"]), float, 0.0, 1.0, low_open=True
        )
    if "min_chunk" in merged:
        out["min_chunk_size"] = parse_number("profiling_chunk_config.min_chunk", str(merged["min_chunk"]), int, 1)
    return out


VLLM_ASCEND = VllmAscend()

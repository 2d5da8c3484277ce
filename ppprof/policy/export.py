"""Server settings that carry a policy (`ppprof export`): SGLang, vllm-ascend and ATOM flags. The servers re-profile
their own model at start, so an export carries the settings; the policy's coefficients only inform them."""

from __future__ import annotations

import json
import shlex

from ppprof.policy.rule import FORMS, MODEL_COEFS
from ppprof.policy.schema import Policy

FORMATS = ("sglang", "vllm-ascend", "atom")
SERVER_FORMS = {"SGLang": "quadratic", "vllm-ascend": "quadratic", "ATOM": "prefix"}
"""The latency model each server fits at start (ppprof.policy.rule.FORMS)."""


def header(policy: Policy, server: str, source: str) -> list[str]:
    """Comment lines saying where the settings come from and what the policy's model is."""
    lines = [f"# {server} re-profiles its own latency model at start; these settings come from {source}",
             f"# (policy {policy.status}: {policy.reason});",
             "# the policy's coefficients inform them, they are not loaded."]
    if policy.model is not None:
        coefs = ", ".join(f"{k}={getattr(policy.model, k):.4g}" for k in MODEL_COEFS[policy.model.name])
        lines.append(f"# ppprof model {policy.model.name}: {coefs} (ms, tokens); target {policy.target_ms:.4g} ms")
        form = SERVER_FORMS[server]
        if policy.model.name != form:
            lines.append(f"# note: {server} can carry only the {form} form ({FORMS[form]}); ppprof's "
                         f"{policy.model.name} model does not carry over, only the settings below do")
    return lines


def export(policy: Policy, fmt: str, source: str = "the policy") -> str:
    """Lines for `fmt` (one of FORMATS): comment lines, then environment and command-line arguments."""
    s = policy.settings
    dynamic = policy.status == "dynamic"
    if fmt == "sglang":
        lines = header(policy, "SGLang", source)
        if (policy.data.get("diagnostics") or {}).get("parity") == "sglang":
            lines.append("# fit: SGLang's own (ppprof fit --parity sglang): its start-up fit of these samples gives "
                         "these coefficients")
        else:
            lines.append("# fit: ppprof's (warm-up rows dropped, outliers trimmed, gated); SGLang's own fit of the "
                         "same samples may differ (ppprof fit --latency-model quadratic --parity sglang gives it)")
        if s.min_chunk_size != s.base_chunk_size // 4:
            lines.append(f"# note: SGLang floors chunks at B // 4 = {s.base_chunk_size // 4}, not at "
                         f"min_chunk_size {s.min_chunk_size}")
        args = ["--chunked-prefill-size", str(s.base_chunk_size), "--max-prefill-tokens", str(s.max_chunk_size)]
        if dynamic:
            lines.append(f"export SGLANG_DYNAMIC_CHUNKING_SMOOTH_FACTOR={s.smooth_factor:g}")
            args = ["--enable-dynamic-chunking"] + args
    elif fmt == "vllm-ascend":
        lines = header(policy, "vllm-ascend", source)
        config = {"profiling_chunk_config": {"enabled": dynamic, "smooth_factor": s.smooth_factor,
                                             "min_chunk": s.min_chunk_size}}
        args = ["--max-num-batched-tokens", str(s.base_chunk_size),
                "--additional-config", json.dumps(config, separators=(",", ":"))]
    elif fmt == "atom":
        lines = header(policy, "ATOM", source)
        args = ["--max-num-batched-tokens", str(s.base_chunk_size)]
        if dynamic:
            args = ["--enable-dynamic-chunking", "--dynamic-chunking-smooth-factor", f"{s.smooth_factor:g}",
                    "--dynamic-chunking-min-chunk-size", str(s.min_chunk_size)] + args
    else:
        raise ValueError(f"--format {fmt} is unknown: use one of {', '.join(FORMATS)}")
    lines.append(" ".join(shlex.quote(a) for a in args))
    return "\n".join(lines)

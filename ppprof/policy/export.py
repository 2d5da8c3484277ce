"""Server settings that carry a policy (`ppprof export`): SGLang, vllm-ascend and ATOM flags, and where that server's
own rule (ppprof.policy.servers) would size chunks differently from the policy with those flags.

SGLang and vllm-ascend re-profile their own model at start, so an export carries the settings and the policy's
coefficients only inform them; ATOM takes the coefficients too (--dynamic-chunking-calibration)."""

from __future__ import annotations

import math

import numpy as np

from ppprof.policy.rule import FORMS, MODEL_COEFS, LatencyModel
from ppprof.policy.schema import Policy
from ppprof.policy.servers import (CONTEXT_MARGIN, LABELS, SERVERS, TARGETS, ServerRule, ServerSetting, boot_model,
                                   command_line, format_flags, prefix_form)

FORMATS = SERVERS
SERVER_FORMS = {"SGLang": "quadratic", "vllm-ascend": "quadratic", "ATOM": "prefix"}
"""The latency model each server sizes chunks with (ppprof.policy.rule.FORMS)."""
MAX_CHECKED = 20000  # prefix lengths compared per export (every alignment unit up to the context, coarser beyond)


def server_setting(policy: Policy, server: str) -> ServerSetting:
    """The policy's settings in `server`'s terms: B, the smoothing factor, the floor and the cap."""
    s = policy.settings
    dynamic = policy.status == "dynamic"
    if server == "sglang":
        return ServerSetting("sglang", s.base_chunk_size, dynamic, s.smooth_factor, max(s.base_chunk_size // 4, 1),
                             s.max_chunk_size, s.page_size)
    if server == "vllm-ascend":
        return ServerSetting("vllm-ascend", s.base_chunk_size, dynamic, s.smooth_factor, s.min_chunk_size,
                             s.base_chunk_size, s.page_size)
    if server == "atom":
        return ServerSetting("atom", s.base_chunk_size, dynamic, s.smooth_factor, s.min_chunk_size,
                             s.base_chunk_size, s.page_size)
    raise ValueError(f"--format {server} is unknown: use one of {', '.join(FORMATS)}")


def server_model(policy: Policy, server: str) -> LatencyModel | None:
    """The model `server` sizes chunks with when run with this policy's export (servers.boot_model)."""
    return boot_model(server, policy.model, policy.data.get("domain"))


def compare_rules(policy: Policy, server: str, setting: ServerSetting | None = None,
                  model: LatencyModel | None = None) -> dict:
    """The chunk after each prefix length L (every alignment unit up to the context; at most MAX_CHECKED of them)
    under the policy and under `server`'s own rule with `setting` (default: the export's) and the model it would
    have: how many L differ, the first, the largest difference, and a few examples."""
    setting = setting or server_setting(policy, server)
    model = model if model is not None else server_model(policy, server)
    context = policy.settings.context_len
    step = policy.settings.alignment
    step *= max(1, math.ceil(context / (step * MAX_CHECKED)))
    rule = ServerRule(setting, model, context)
    prefix_lens = np.arange(0, context - 1, step, dtype=np.int64)
    ours = np.array([policy.next_chunk_size(int(L)) for L in prefix_lens])
    theirs = np.array([rule.next(int(L)) for L in prefix_lens])
    # What the chunk can be at most there: the context left (every rule gives the rest of the prompt at the end).
    left = context - prefix_lens
    ours, theirs = np.minimum(ours, left), np.minimum(theirs, left)
    diff = theirs - ours
    where = np.flatnonzero(diff)
    out = {"prefix_lens_checked": int(len(prefix_lens)), "step_tokens": int(step), "differ": int(len(where)),
           "first_differs_at": None, "max_diff_tokens": 0, "max_diff_fraction": 0.0, "examples": []}
    if len(where):
        rel = np.abs(diff[where]) / ours[where]
        k = where[int(np.argmax(np.abs(diff[where])))]
        out.update(first_differs_at=int(prefix_lens[where[0]]), max_diff_tokens=int(diff[k]),
                   max_diff_fraction=round(float(rel.max()), 4))
        picks = sorted({int(where[0]), int(k), int(where[len(where) // 2]), int(where[-1])})
        out["examples"] = [{"prefix_len": int(prefix_lens[i]), "ppprof": int(ours[i]), LABELS[server]: int(theirs[i])}
                           for i in picks]
    return out


def causes(policy: Policy, server: str) -> list[str]:
    """Why `server`'s chunk sizes may differ from the policy's with the exported flags (those that apply here)."""
    s, name = policy.settings, policy.model.name if policy.model is not None else None
    out = []
    if server in ("sglang", "vllm-ascend") and name not in (None, "quadratic"):
        out.append(f"{LABELS[server]} sizes chunks with its own prefix-free quadratic fitted at boot, not ppprof's "
                   f"{name} model (its form: {FORMS['quadratic']}), so it cannot see the prefix cost")
    if server == "sglang":
        if name == "quadratic" and (policy.data.get("diagnostics") or {}).get("parity") != "sglang":
            out.append("ppprof's fit (warm-up rows dropped, outliers trimmed, gated) may differ from SGLang's boot "
                       "fit by one alignment unit at some L; `ppprof fit --latency-model quadratic --parity sglang` "
                       "fits as SGLang does")
        if s.min_chunk_size != s.base_chunk_size // 4:
            out.append(f"SGLang floors chunks at B // 4 = {s.base_chunk_size // 4}, not at min_chunk_size "
                       f"{s.min_chunk_size}")
    if server == "vllm-ascend":
        out += ["vllm-ascend aligns chunk sizes UP to max(page, 64) where ppprof aligns down",
                f"vllm-ascend floors at min_chunk {s.min_chunk_size} before aligning (ppprof floors, then aligns down)",
                "vllm-ascend caps a chunk only by the token budget B and by max_model_len - 1 - L (ppprof: "
                f"context - L - {CONTEXT_MARGIN['sglang']})",
                "vllm-ascend sets a negative fitted a to 1e-9 instead of turning dynamic chunking off",
                "vllm-ascend's online calibration (need_timing, on by default) refits a prefix-aware model on live "
                "batches and then sizes chunks with it; set need_timing false to keep the boot fit"]
        if s.max_chunk_size < s.base_chunk_size:
            out.append(f"the policy's cap of {s.max_chunk_size} tokens has no vllm-ascend flag and is lost")
    if server == "atom":
        out += [f"ATOM aligns down to the KV block size ({s.page_size}), ppprof to {s.alignment}",
                "ATOM floors a chunk at max(block, min chunk, the chunk whose prefix cost gamma*L is 20% of its "
                "latency); ppprof floors at min_chunk_size only",
                "ATOM has no context cap; its ceiling (--max-num-batched-tokens) holds for the first chunk too"]
        if s.max_chunk_size < s.base_chunk_size:
            out.append(f"the policy's cap of {s.max_chunk_size} tokens from the second chunk on has no ATOM flag "
                       f"and is lost")
        if name == "pairs":
            out.append("ATOM carries the prefix form: the pairs model's h term is folded into a and gamma by a "
                       "least-squares fit over the profiled domain")
    if policy.status == "static":
        out.append(f"the policy is static ({policy.reason}): every chunk is B")
    return out


def header(policy: Policy, server: str, source: str) -> list[str]:
    """Comment lines saying where the settings come from and what the policy's model is."""
    if server == "ATOM":
        lines = [f"# ATOM sizes chunks with the prefix model given by --dynamic-chunking-calibration (ppprof's); "
                 f"settings from {source}", f"# (policy {policy.status}: {policy.reason})."]
    else:
        lines = [f"# {server} re-profiles its own latency model at start; these settings come from {source}",
                 f"# (policy {policy.status}: {policy.reason});",
                 "# the policy's coefficients inform them, they are not loaded."]
    if policy.model is not None:
        coefs = ", ".join(f"{k}={getattr(policy.model, k):.4g}" for k in MODEL_COEFS[policy.model.name])
        lines.append(f"# ppprof model {policy.model.name}: {coefs} (ms, tokens); target {policy.target_ms:.4g} ms")
        form = SERVER_FORMS[server]
        if policy.model.name != form and server != "ATOM":
            lines.append(f"# note: {server} can carry only the {form} form ({FORMS[form]}); ppprof's "
                         f"{policy.model.name} model does not carry over, only the settings below do")
    return lines


def export_data(policy: Policy, fmt: str, source: str = "the policy") -> dict:
    """Everything `ppprof export --json` prints: the flags, the comments, and the rule comparison."""
    if fmt not in FORMATS:
        raise ValueError(f"--format {fmt} is unknown: use one of {', '.join(FORMATS)}")
    label = LABELS[fmt]
    setting = server_setting(policy, fmt)
    calibration = None
    if fmt == "atom" and policy.model is not None and setting.dynamic:
        calibration = prefix_form(policy.model, policy.data.get("domain"))
    model = server_model(policy, fmt)
    if setting.dynamic and model is None:
        # The server would keep chunks fixed with this model (SGLang: a <= 0; ATOM: a calibration it refuses).
        setting = ServerSetting(setting.server, setting.base_chunk_size, False, setting.smooth_factor,
                                setting.min_chunk_size, setting.max_chunk_size, setting.page_size)
        calibration = None
    env, args = format_flags(setting, calibration)
    comments = header(policy, label, source)
    comments.append(f"# targets: {TARGETS[fmt]}")
    if fmt == "sglang":
        if (policy.data.get("diagnostics") or {}).get("parity") == "sglang":
            comments.append("# fit: SGLang's own (ppprof fit --parity sglang): its start-up fit of these samples "
                            "gives these coefficients")
        else:
            comments.append("# fit: ppprof's (warm-up rows dropped, outliers trimmed, gated); SGLang's own fit of the "
                            "same samples may differ (ppprof fit --latency-model quadratic --parity sglang gives it)")
    if policy.status == "dynamic" and not setting.dynamic:
        comments.append(f"# note: {label} would keep dynamic chunking off with this model; fixed chunks of "
                        f"{setting.fixed_chunk_size}")
    comparison = compare_rules(policy, fmt, setting, model)
    if comparison["differ"] == 0:
        comments.append(f"# {label}'s rule with these flags gives the policy's chunk size at every one of "
                        f"{comparison['prefix_lens_checked']} prefix lengths checked")
    else:
        first = comparison["examples"][0]
        comments.append(f"# {label}'s rule with these flags differs from the policy at {comparison['differ']} of "
                        f"{comparison['prefix_lens_checked']} prefix lengths checked (from L = "
                        f"{comparison['first_differs_at']}, e.g. {first['ppprof']} -> {first[label]}; at most "
                        f"{comparison['max_diff_tokens']:+d} tokens, {comparison['max_diff_fraction']:.1%}), because:")
        comments += [f"#   - {c}" for c in causes(policy, fmt)]
    return {"server": fmt, "targets": TARGETS[fmt], "env": env, "args": args, "command": command_line(env, args),
            "setting": setting.to_dict(), "comments": comments, "differences": comparison,
            "causes": causes(policy, fmt)}


def export(policy: Policy, fmt: str, source: str = "the policy") -> str:
    """Lines for `fmt` (one of FORMATS): comment lines, then environment and command-line arguments."""
    data = export_data(policy, fmt, source)
    lines = list(data["comments"])
    lines += [f"export {k}={v}" for k, v in data["env"].items()]
    lines.append(command_line({}, data["args"]))
    return "\n".join(lines)

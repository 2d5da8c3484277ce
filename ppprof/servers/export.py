"""`ppprof export`: the flags that carry a policy on one server (ppprof.servers.registry), and where that server's
own rule would size chunks differently from the policy with those flags.

SGLang and vllm-ascend re-profile their own model at start, so an export carries the settings and the policy's
coefficients only inform them; ATOM takes the coefficients too (--dynamic-chunking-calibration)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import numpy as np

from ppprof.bounds import POLICY_ENV
from ppprof.policy.rule import FORMS, MODEL_COEFS, LatencyModel
from ppprof.policy.runtime import Policy, largest_chunk
from ppprof.servers.base import Server, ServerSetting
from ppprof.servers.flags import command_line
from ppprof.servers.registry import get

MAX_CHECKED = 20000  # prefix lengths compared per export (every alignment unit up to the context, coarser beyond)


def server_setting(policy: Policy, server: str) -> ServerSetting:
    """The policy's settings in `server`'s terms: B, the smoothing factor, the floor and the cap."""
    return get(server).setting_of(policy)


def server_model(policy: Policy, server: str) -> LatencyModel | None:
    """The model `server` sizes chunks with when run with this policy's export (Server.boot_model)."""
    return get(server).model_for(policy)


def compare_rules(
    policy: Policy, server: str, setting: ServerSetting | None = None, model: LatencyModel | None = None
) -> dict:
    """The chunk after each prefix length L (every alignment unit up to the context; at most MAX_CHECKED of them)
    under the policy and under `server`'s own rule with `setting` (default: the export's) and the model it would
    have: how many L differ, the first, the largest difference, and a few examples."""
    target = get(server)
    setting = setting or target.setting_of(policy)
    model = model if model is not None else target.model_for(policy)
    context = policy.settings.context_len
    step = policy.settings.alignment
    step *= max(1, math.ceil(context / (step * MAX_CHECKED)))
    rule = target.rule(setting, model, context)
    prefix_lens = np.arange(0, context - 1, step, dtype=np.int64)
    ours = np.array([policy.next_chunk_size(int(L)) for L in prefix_lens])
    theirs = np.array([rule.next(int(L)) for L in prefix_lens])
    # What the chunk can be at most there: the context left (every rule gives the rest of the prompt at the end).
    left = context - prefix_lens
    ours, theirs = np.minimum(ours, left), np.minimum(theirs, left)
    diff = theirs - ours
    where = np.flatnonzero(diff)
    out = {
        "prefix_lens_checked": int(len(prefix_lens)),
        "step_tokens": int(step),
        "differ": int(len(where)),
        "first_differs_at": None,
        "max_diff_tokens": 0,
        "max_diff_fraction": 0.0,
        "examples": [],
    }
    if len(where):
        rel = np.abs(diff[where]) / ours[where]
        k = where[int(np.argmax(np.abs(diff[where])))]
        out.update(
            first_differs_at=int(prefix_lens[where[0]]),
            max_diff_tokens=int(diff[k]),
            max_diff_fraction=round(float(rel.max()), 4),
        )
        picks = sorted({int(where[0]), int(k), int(where[len(where) // 2]), int(where[-1])})
        out["examples"] = [
            {"prefix_len": int(prefix_lens[i]), "ppprof": int(ours[i]), target.label: int(theirs[i])} for i in picks
        ]
    return out


def causes(policy: Policy, server: str) -> list[str]:
    """Why `server`'s chunk sizes may differ from the policy's with the exported flags (those that apply here)."""
    out = get(server).causes(policy)
    if policy.status == "static":
        out.append(f"the policy is static ({policy.reason}): every chunk is B")
    return out


def header(policy: Policy, server: Server, source: str) -> list[str]:
    """Comment lines saying where the settings come from and what the policy's model is."""
    label = server.label
    lines = server.export_header(policy, source)
    if policy.latency_model is not None:
        coefs = ", ".join(f"{k}={getattr(policy.latency_model, k):.4g}" for k in MODEL_COEFS[policy.latency_model.name])
        lines.append(
            f"# ppprof model {policy.latency_model.name}: {coefs} (ms, tokens); target {policy.target_ms:.4g} ms"
        )
        form = server.form
        if policy.latency_model.name != form and server.fits_at_boot:
            lines.append(
                f"# note: {label} can carry only the {form} form ({FORMS[form]}); ppprof's "
                f"{policy.latency_model.name} model does not carry over, only the settings below do"
            )
    return lines


def export_data(policy: Policy, server: str, source: str = "the policy") -> dict:
    """Everything `ppprof export --json` prints: the flags, the comments, and the rule comparison."""
    target = get(server)
    label = target.label
    setting = target.setting_of(policy)
    calibration = target.calibration(policy) if setting.dynamic else None
    model = target.model_for(policy)
    if setting.dynamic and model is None:
        # The server would keep chunks fixed with this model (SGLang: a <= 0; ATOM: a calibration it refuses).
        setting, calibration = replace(setting, dynamic=False), None
    env, args = target.format_flags(setting, calibration)
    args = target.format_parallel(policy.pp_size, policy.tp_size) + args
    comments = header(policy, target, source)
    comments.append(
        f"# profiled at {policy.pp_size} stages of {policy.tp_size} TP rank"
        f"{'s' if policy.tp_size > 1 else ''}: serve with the same layout, which the flags set"
    )
    comments.append(f"# targets: {target.targets}")
    comments += target.export_notes(policy)
    if policy.status == "dynamic" and not setting.dynamic:
        comments.append(
            f"# note: {label} would keep dynamic chunking off with this model; fixed chunks of "
            f"{target.fixed_chunk_size(setting)}"
        )
    comparison = compare_rules(policy, server, setting, model)
    comments += comparison_comments(policy, server, label, comparison)
    comments += load_notes(policy, server)
    loaded = {"policy_file": policy_file(policy, source)} if server == LOADS_POLICY else {}
    if loaded:
        comments += [
            f"# or {label} loads the policy file itself, with ppprof's rules and no start-up profile (docs/sglang.md):",
            f"#   {loaded['policy_file']['command']}",
            f"#   {loaded['policy_file']['launcher']}",
        ]
        if not isinstance(policy.provenance.get("model_shape"), dict):
            comments.append(
                "# note: this policy does not record the profiled model's shapes, which SGLang checks at "
                "load: refit it from its run folder first (ppprof fit RUN/samples.csv)"
            )
    return {
        "server": server,
        "targets": target.targets,
        "env": env,
        "args": args,
        "command": command_line(env, args),
        "setting": setting.to_dict(),
        "comments": comments,
        "differences": comparison,
        "causes": causes(policy, server),
        **loaded,
    }


def load_notes(policy: Policy, server: str) -> list[str]:
    """Whether the server can carry the policy's under-load rule (none: nothing to say)."""
    rule = policy.load_rule
    if rule is None:
        return []
    lines = {
        "sglang": "the flags cannot (SGLang's own sizer reads no load); the policy file loaded by ppprof's sizer "
        "does (it reads the scheduler's waiting queue and its micro-batch slots), below",
        "vllm-ascend": "vllm-ascend cannot: it sizes every prefill of a step against one time budget and reads no "
        "queue",
        "atom": "ATOM cannot carry its chunks; its guard (dynamic only while the request is the only one with "
        "prefill work, fixed chunks otherwise) hands over at 1 pending request, where the policy's reads whether "
        "the pipeline is full",
    }
    when = f"once the work fills {rule.fill:g} x {rule.slots} slots"
    return [f"# under load ({when}) the policy has its own rule: {lines[server]}"]


def comparison_comments(policy: Policy, server: str, label: str, comparison: dict) -> list[str]:
    """The export's comment lines on how the server's rule with the flags compares with the policy's, and why."""
    checked = comparison["prefix_lens_checked"]
    if comparison["differ"] == 0:
        return [
            f"# {label}'s rule with these flags gives the policy's chunk size at every one of {checked} prefix lengths checked"
        ]
    first = comparison["examples"][0]
    return [
        f"# {label}'s rule with these flags differs from the policy at {comparison['differ']} of "
        f"{checked} prefix lengths checked (from L = "
        f"{comparison['first_differs_at']}, e.g. {first['ppprof']} -> {first[label]}; at most "
        f"{comparison['max_diff_tokens']:+d} tokens, {comparison['max_diff_fraction']:.1%}), because:"
    ] + [f"#   - {c}" for c in causes(policy, server)]


LOADS_POLICY = "sglang"
"""The server that can load the policy file itself (ppprof.sglang's sizer behind its start-up hook)."""


def policy_file(policy: Policy, source: str) -> dict:
    """How SGLang loads the policy file itself: PPPROF_POLICY and the server arguments its sizer checks at load
    (stages, TP ranks, B, a chunk cap that takes the policy's largest chunk, the page), run directly with the
    start-up hook installed or through `python -m ppprof.sglang`."""
    path = str(Path(source).resolve()) if Path(source).is_file() else "POLICY"
    s, server = policy.settings, get(LOADS_POLICY)
    cap = max(largest_chunk(policy), server.default_setting().max_chunk_size)
    args = [
        "--model-path",
        "MODEL",
        *server.format_parallel(policy.pp_size, policy.tp_size),
        "--enable-dynamic-chunking",
        "--chunked-prefill-size",
        str(s.base_chunk_size),
        "--max-prefill-tokens",
        str(cap),
    ] + (["--page-size", str(s.page_size)] if s.page_size > 1 else [])
    return {
        "env": {POLICY_ENV: path},
        "args": args,
        "command": command_line({POLICY_ENV: path}, ["python", "-m", "sglang.launch_server", *args]),
        "launcher": command_line({}, ["python", "-m", "ppprof.sglang", "--policy", path, "--", *args]),
    }


def export(policy: Policy, server: str, source: str = "the policy") -> str:
    """Lines for `server` (one of ppprof.servers.SERVERS): comment lines, then environment and command-line
    arguments."""
    data = export_data(policy, server, source)
    lines = list(data["comments"])
    lines += [f"export {k}={v}" for k, v in data["env"].items()]
    lines.append(command_line({}, data["args"]))
    return "\n".join(lines)

"""Where the user's input enters a job: its settings resolved once (flags > --config YAML > defaults, typed by
ppprof.config), those of an interrupted run for --resume (its run.json, flags that may change winning), and a bench's
(the profile's run.json beside the policy, its flags winning)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from ppprof.bounds import MAX_TOKENS
from ppprof.checks import is_int, require_int
from ppprof.config import DEFAULT_STRATEGIES, BenchConfig, ProfileConfig
from ppprof.config import flag as config_flag
from ppprof.config.sections import setting_fields
from ppprof.config.workload import Workload, parse_prompt_spec
from ppprof.io import parse_json, parse_yaml, read_small_text
from ppprof.policy.policy_file import load
from ppprof.policy.runtime import Policy
from ppprof.run.forward_trace import check_trace_path
from ppprof.runfiles import COMPLETE, RunFolder, read_run_json, recorded_stages
from ppprof.serving.levels import parse_arms, parse_levels
from ppprof.serving.serve_config import ServeBenchConfig, TraceReplay
from ppprof.specs import parse_partition
from ppprof.traces.mooncake import parse_window

CONFIG_FIELDS = {f.name for f in setting_fields()}


def read_config_file(path: str) -> dict:
    """Settings from a YAML file; keys are ProfileConfig fields (dashes or underscores)."""
    try:
        data = parse_yaml(read_small_text(path, "--config", "give a YAML settings file"), f"--config {path}")
    except OSError as e:
        raise ValueError(f"--config {path}: cannot read it ({e.strerror}); give an existing YAML file") from None
    except yaml.YAMLError as e:
        raise ValueError(f"--config {path} is not valid YAML: {str(e).splitlines()[0]}") from None
    data = data or {}
    if not isinstance(data, dict):
        raise ValueError(f"--config {path} must hold a mapping of settings, e.g. 'base_chunk_size: 512'")
    out = {}
    for key, value in data.items():
        name = str(key).replace("-", "_")
        if name not in CONFIG_FIELDS:
            raise ValueError(f"--config {path}: unknown setting {key!r}; known: {', '.join(sorted(CONFIG_FIELDS))}")
        out[name] = value
    return out


def given_settings(config_path: str | None, flags: dict) -> dict:
    """The settings a user gave: the --config YAML's, the flags that were given (not None) winning."""
    merged = read_config_file(config_path) if config_path else {}
    merged.update({k: v for k, v in flags.items() if v is not None})
    return merged


def resolve_config(config_path: str | None, flags: dict) -> ProfileConfig:
    """The settings of a job: flags > --config YAML > defaults, each field typed and bounded (ProfileConfig); the
    list settings (layer_partition, prefix_lens) also as comma-separated text ("3,5") or, from YAML, one integer."""
    merged = given_settings(config_path, flags)
    for key in ("layer_partition", "prefix_lens"):
        value = merged.get(key)
        if isinstance(value, str):
            merged[key] = parse_partition(value) if key == "layer_partition" else _int_list(value, key)
        elif is_int(value):
            merged[key] = [value]
    try:
        return ProfileConfig(**merged)
    except TypeError as e:  # a YAML value of the wrong type
        raise ValueError(f"bad setting: {e}") from None


def _int_list(text: str, key: str) -> list[int]:
    try:
        return [int(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ValueError(
            f"--{key.replace('_', '-')} {text!r} must be comma-separated integers, e.g. 512,1024"
        ) from None


RESUMABLE_FIELDS = ("timeout", "fit", "overhead_repeats", "packed_forwards")
"""Settings a resumed run may change: they do not change what the probes measure."""


def resume_config(run_dir: str, config_path: str | None, flags: dict) -> ProfileConfig:
    """The settings of the interrupted run in `run_dir` (its run.json), out set to `run_dir`. A flag or --config
    setting that differs from the recorded one (but --timeout, --fit) is refused: the resumed probes must be those
    of the uninterrupted run."""
    run_file = RunFolder(run_dir).run_json
    if not run_file.is_file():
        raise ValueError(
            f"--resume {run_dir}: {run_file} does not exist; give the run folder of an interrupted `ppprof profile`"
        )
    run = read_run_json(run_file)
    if run["status"] == COMPLETE:
        raise ValueError(f"--resume {run_dir}: the run is complete (status in {run_file}); nothing to resume")
    recorded = ProfileConfig.recorded(run["config"])
    recorded["out"] = str(run_dir)
    base = resolve_config(None, recorded)
    given = given_settings(config_path, flags)
    given.pop("out", None)
    for key, value in given.items():
        if key in RESUMABLE_FIELDS:
            continue
        try:
            same = resolve_config(None, {**recorded, key: value}).setting(key) == base.setting(key)
        except ValueError:
            same = False
        if not same:
            flag = config_flag(key)
            raise ValueError(
                f"--resume {run_dir}: {flag} {value} differs from the run's recorded "
                f"{base.setting(key)!r}; drop {flag} (a resumed run keeps its settings) or start a new "
                "run with another --out"
            )
    return resolve_config(None, {**recorded, **given})


def profile_of_policy(policy_path: str, flags: dict, command: str) -> tuple[ProfileConfig, Policy, dict]:
    """The profile settings a job through the ranks runs a policy under (run.json beside it, `flags` winning, --out
    and torch threads as the profile measured), the policy loaded and checked once as `ppprof validate` checks it,
    and run.json, before any rank starts."""
    run_file = RunFolder.of(policy_path).run_json
    if not Path(policy_path).is_file():
        raise ValueError(f"policy file {policy_path} does not exist: give a policy.json written by `ppprof profile`")
    policy = load(policy_path)
    if not run_file.is_file():
        raise ValueError(
            f"{run_file} does not exist: `ppprof {command}` needs the run.json of the profile that wrote "
            f"{policy_path} (the model, split and device come from it)"
        )
    run = read_run_json(run_file)
    profile = ProfileConfig.recorded(run["config"])
    profile["torch_threads"] = run.get("torch_threads")  # measure under the profile's conditions
    profile.update({k: v for k, v in flags.pop("profile").items() if v is not None})
    profile["out"] = flags.get("out")
    return resolve_config(None, profile), policy, run


def resolve_bench(policy_path: str, flags: dict) -> tuple[BenchConfig, Policy]:
    """The bench's settings, the profile's (run.json beside the policy) with the flags winning, and the policy."""
    profile, policy, run = profile_of_policy(policy_path, flags, "bench")
    strategies = flags.pop("strategies")
    # "" is no strategy (refused), not the default: only a flag not given means every strategy
    strategies = (
        DEFAULT_STRATEGIES if strategies is None else tuple(s.strip() for s in strategies.split(",") if s.strip())
    )
    if flags.get("plans") is not None:
        flags["plans"] = read_plans(flags["plans"])
        if not flags.get("prompt_lens") and isinstance(flags["plans"], dict):
            flags["prompt_lens"] = tuple(sorted(int(n) for n in flags["plans"] if n.isdigit()))
    stages = run.get("layer_partition") or [None] * (recorded_stages(run) or 1)
    bench = BenchConfig(
        policy=str(policy_path),
        profile=profile,
        strategies=strategies,
        profiled_stages=len(stages),
        **{k: v for k, v in flags.items() if v is not None},
    )
    check_trace_path(bench.forward_trace)
    return bench, policy


def read_plans(path: str) -> dict:
    """The plans of a `--plans` file: `ppprof tune --json` output (its "plans") or {"<prompt_len>": {name: chunks}}."""
    fix = "give the JSON of `ppprof tune --json`"
    try:
        data = parse_json(read_small_text(path, "--plans file", fix), f"--plans file {path}")
    except FileNotFoundError:
        raise ValueError(
            f"--plans file {path} does not exist: write it with `ppprof tune ... --json > {path}`"
        ) from None
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"--plans file {path} is not readable JSON ({e.__class__.__name__}): {fix}") from None
    return data.get("plans", data) if isinstance(data, dict) else data


def resolve_serve(policy_path: str, flags: dict, trace: dict | None = None) -> tuple[ServeBenchConfig, Policy]:
    """A serving bench's settings through the ranks: the profile's (run.json beside the policy, `flags["profile"]`
    winning) with pools that hold the most requests a level has at once, each at the longest prompt; the levels,
    arms and prompts checked in one line each, before any rank starts. With `trace` (the --trace flags), a request
    trace's part replaces the levels: read and checked here too."""
    levels = parse_levels(flags["concurrency"], flags["request_rate"]) if trace is None else []
    arms = parse_arms(flags["strategies"])
    profile, policy, run = profile_of_policy(policy_path, {"profile": flags["profile"]}, "serve-bench")
    if policy.planning_model is None:
        raise ValueError(
            f"policy {policy_path} has no latency model ({policy.status}: {policy.reason}): the simulation beside "
            "the run prices batches with it; profile again"
        )
    if (trace is not None or levels[0].rate is not None) and profile.parallelism.tp_size > 1:
        what = "--trace" if trace is not None else "--request-rate"
        raise ValueError(
            f"{what} with the profile's --tp-size {profile.parallelism.tp_size}: the TP ranks of the first "
            "stage each run the scheduler, and arrivals by the wall clock could part them; use --concurrency "
            "(closed loops schedule alike on every rank), or --simulate"
        )
    stages = recorded_stages(run) or 1
    if flags["pp_size"] is not None and flags["pp_size"] != stages:
        raise ValueError(
            f"--pp-size {flags['pp_size']} differs from the {stages} stages the profile ran: a run through the "
            f"ranks serves on the profile's stages; drop --pp-size, or add --simulate"
        )
    spec = flags["spec"]
    workload = (
        parse_prompt_spec(spec, profile.probes.context_len) if spec else Workload.from_dict(policy.report.workload)
    )
    given = ("async_depth", "seed", "repeats", "out") + (("num_prompts",) if trace is None else ())
    serve = ServeBenchConfig(
        policy=str(policy_path),
        profile=profile,
        concurrency=tuple(lv.concurrency for lv in levels) if levels and levels[0].concurrency is not None else None,
        request_rates=tuple(lv.rate for lv in levels) if levels and levels[0].rate is not None else None,
        strategies=arms,
        workload=workload.to_dict(),
        **{k: flags[k] for k in given if flags[k] is not None},
        forward_trace=flags.get("forward_trace"),
        trace=None if trace is None else trace_replay(trace, flags["num_prompts"], policy),
    )
    check_trace_path(serve.forward_trace)
    return serve.with_pools(), policy


def trace_replay(trace: dict, num_prompts: int | None, policy: Policy) -> TraceReplay:
    """The --trace flags of a run through the ranks, checked (the part itself is read and checked by with_pools)."""
    if trace["cache_tokens"] is not None:
        require_int("--cache-tokens", trace["cache_tokens"], 0, MAX_TOKENS)
    check_output_file(trace["output_file"])
    return TraceReplay(
        path=str(trace["trace"]),
        window_s=parse_window(trace["trace_window"]),
        num_prompts=num_prompts,
        time_scale=trace["time_scale"],
        length_scale=trace["length_scale"],
        context_len=policy.settings.context_len,
        cache_tokens=trace["cache_tokens"],
        output_file=trace["output_file"],
        output_details=trace["output_details"],
    )


def check_output_file(path: str | None) -> None:
    """--output-file: a JSONL file to append to (or to create) in an existing folder; ValueError (one line)."""
    if path is None:
        return
    p = Path(path)
    if p.exists() and not p.is_file():
        raise ValueError(f"--output-file {path} is not a file: give a JSONL file to append to")
    if not p.parent.is_dir():
        raise ValueError(f"--output-file {path}: its folder {p.parent} does not exist; create it or give another path")

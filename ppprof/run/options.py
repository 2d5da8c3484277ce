"""Settings of a distributed job, resolved and checked before any rank starts: flags > --config YAML > defaults;
the output folder, the model and its split over the stages, the device, and whether each stage fits in memory."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path

import click
import yaml

from ppprof.checks import is_int
from ppprof.config import ProfileConfig, flag as config_flag
from ppprof.dist.launch import in_worker
from ppprof.runfiles import COMPLETE, LOCK_FILE, RUN_FILE, check_lock, read_run_json
from ppprof.model.attention_kernels import resolve_attention_backend
from ppprof.specs import ModelSpec, load_spec, parse_partition, split_layers
from ppprof.specs.accounting import describe, stage_accounts
from ppprof.specs.cli import format_memory_text, format_text
from ppprof.specs.memory import StageMemory, format_bytes, stage_memory

CONFIG_FIELDS = {f.name for f in dataclasses.fields(ProfileConfig)}


def read_config_file(path: str) -> dict:
    """Settings from a YAML file; keys are ProfileConfig fields (dashes or underscores)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
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
        raise ValueError(f"--{key.replace('_', '-')} {text!r} must be comma-separated integers, e.g. 512,1024") from None


def check_output_folder(out: str | None, overwrite: bool = False, resume: bool = False, folder: bool = True) -> None:
    """The run folder (or, by default, results/) can be created and written and (unless not `folder`) no live run
    holds it, and it holds no files unless `overwrite` (replace its run) or `resume` (finish its run)."""
    path = Path(out) if out else Path("results")
    if path.exists() and not path.is_dir():
        raise ValueError(f"--out {out or path}: exists and is not a folder; give a folder path")
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out or path}: {parent} is not a writable folder; choose another --out")
    if not out or not path.is_dir() or not folder:
        return
    check_lock(path)
    held = sorted(p.name for p in path.iterdir() if p.name != LOCK_FILE)
    if held and not (overwrite or resume):
        shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        raise ValueError(f"--out {out} is not empty (it holds {shown}): choose a new folder, add --overwrite to "
                         f"replace its run, or finish an interrupted run with --resume {out}")


RESUMABLE_FIELDS = ("timeout", "fit")
"""Settings a resumed run may change: they do not change what is measured."""


def resume_config(run_dir: str, config_path: str | None, flags: dict) -> ProfileConfig:
    """The settings of the interrupted run in `run_dir` (its run.json), out set to `run_dir`. A flag or --config
    setting that differs from the recorded one (but --timeout, --fit) is refused: the resumed probes must be those
    of the uninterrupted run."""
    run_file = Path(run_dir) / RUN_FILE
    if not run_file.is_file():
        raise ValueError(f"--resume {run_dir}: {run_file} does not exist; give the run folder of an interrupted "
                         "`ppprof profile`")
    run = read_run_json(run_file)
    if run["status"] == COMPLETE:
        raise ValueError(f"--resume {run_dir}: the run is complete (status in {run_file}); nothing to resume")
    if run["config"].get("design") == "adaptive":
        raise ValueError(f"--resume {run_dir}: an adaptive design chose its probes from what it had measured and "
                         f"cannot be resumed; start a new run with another --out (it costs a fraction of the grid)")
    recorded = {k: v for k, v in run["config"].items() if k in CONFIG_FIELDS}
    recorded["out"] = str(run_dir)
    base = resolve_config(None, recorded)
    given = given_settings(config_path, flags)
    given.pop("out", None)
    for key, value in given.items():
        if key in RESUMABLE_FIELDS:
            continue
        try:
            same = getattr(resolve_config(None, {**recorded, key: value}), key) == getattr(base, key)
        except ValueError:
            same = False
        if not same:
            flag = config_flag(key)
            raise ValueError(f"--resume {run_dir}: {flag} {value} differs from the run's recorded "
                             f"{getattr(base, key)!r}; drop {flag} (a resumed run keeps its settings) or start a new "
                             "run with another --out")
    return resolve_config(None, {**recorded, **given})


def check_before_launch(cfg: ProfileConfig, world_size: int, local_ranks: int,
                        torchrun: dict | None = None, overwrite: bool = False, resume: bool = False,
                        folder: bool = True) -> None:
    """What can be checked without any rank: the output folder (check_output_folder; what it holds only where
    `folder`), the model resolves and splits over the stages, the device exists, the attention backend runs there,
    the start method suits it, and this node's stages fit in its memory (check_memory)."""
    check_output_folder(cfg.out, overwrite, resume, folder)
    check_master_port(torchrun or {})
    check_design(cfg)
    spec = load_spec(cfg.model, num_layers=cfg.num_layers, dtype=cfg.dtype)
    split_layers(spec.num_layers, world_size, cfg.layer_partition)
    resolve_attention_backend(cfg.attention_backend, cfg.device)
    if cfg.device == "cuda":
        check_cuda(local_ranks, (torchrun or {}).get("start_method"))
    check_memory(cfg, world_size, local_ranks, torchrun, spec=spec)


LOCAL_HOSTS = (None, "", "localhost", "127.0.0.1", "::1", "0.0.0.0")
MAX_PORT = 65535


def check_master_port(torchrun: dict) -> None:
    """--master-port is a port number and, where this launcher's node 0 hosts the rendezvous store on this host, free
    (else every rank fails later on a bind error). Not under torchrun, which holds the port itself."""
    port = torchrun.get("master_port")
    if port is None or in_worker():
        return
    try:
        number = int(str(port))
    except ValueError:
        number = -1
    if not 1 <= number <= MAX_PORT:
        raise ValueError(f"--master-port {port} must be a port number in 1..{MAX_PORT}")
    if torchrun.get("master_addr") not in LOCAL_HOSTS or str(torchrun.get("node_rank") or 0) != "0":
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store binds it
        try:
            sock.bind(("", number))
        except OSError as e:
            raise ValueError(f"--master-port {number} is in use on this host ({e.strerror}): choose a free port, or "
                             "leave --master-port out for a one-node run") from None


def check_design(cfg: ProfileConfig) -> None:
    """The adaptive design's initial design exists on the candidate grid and fits in --max-requests."""
    if cfg.design != "adaptive":
        return
    from ppprof.adaptive.design import INITIAL_REQUESTS
    from ppprof.adaptive import initial_probes as make_probes

    try:
        make_probes(cfg)
    except ValueError as e:
        raise ValueError(f"--design adaptive with --prefix-lens {','.join(map(str, cfg.resolved_prefix_lens()))}: "
                         f"{e}; give at least two prefix lengths (or none, for the default)") from None
    if cfg.max_requests is not None and cfg.max_requests < INITIAL_REQUESTS:
        raise ValueError(f"--max-requests {cfg.max_requests} is below the {INITIAL_REQUESTS} requests of the "
                         f"adaptive design's initial design: use at least {INITIAL_REQUESTS}")


def warnings(cfg: ProfileConfig) -> list[str]:
    """Settings that run but do not measure what a server does, one line each."""
    out = []
    if cfg.max_mamba_cache_size < cfg.requests_per_probe:
        out.append(f"--max-mamba-cache-size {cfg.max_mamba_cache_size} is below --requests-per-probe "
                   f"{cfg.requests_per_probe}: a probe's Mamba slots cannot be taken in one grouped window (where the "
                   "model has Mamba layers), so every request takes its slot one by one; raise it to "
                   f"{cfg.requests_per_probe} to profile the grouped path")
    return out


def check_cuda(local_ranks: int, start_method: str | None) -> None:
    """CUDA is visible with a GPU per local rank, and the ranks are not forked from a process that may hold CUDA."""
    if start_method == "fork":
        raise ValueError("--start-method fork cannot be used with --device cuda: a forked child cannot use CUDA "
                         "once the parent touched it; use spawn (the default)")
    import torch  # only here: input errors should not wait for torch

    if not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is visible; use --device cpu")
    if torch.cuda.device_count() < local_ranks:
        raise ValueError(f"{local_ranks} ranks on this node exceed the {torch.cuda.device_count()} visible GPUs: "
                         "one rank a GPU; lower --nproc-per-node")


MEMINFO = Path("/proc/meminfo")
MEMORY_PARTS = (("weights", "weights"), ("kv_pool", "KV"), ("mamba_pool", "Mamba"), ("request_table", "requests"),
                ("activation_peak", "activations"))
"""StageMemory's parts, in the order and the words of the messages."""
MORE_STAGES = "use more stages (--nproc-per-node)"


def profile_memory(cfg: ProfileConfig, world_size: int, spec: ModelSpec | None = None) -> list[StageMemory]:
    """What each stage of the profile needs (ppprof.specs.memory): pools as configured, activations of its largest
    probe request, the largest probe chunk after the longest prefix."""
    spec = spec or load_spec(cfg.model, num_layers=cfg.num_layers, dtype=cfg.dtype)
    prefix_len = max(cfg.resolved_prefix_lens(), default=0)
    return [stage_memory(spec, layers, stage_idx=i, dtype=cfg.dtype, max_total_tokens=cfg.max_total_tokens,
                         page_size=cfg.page_size, max_mamba_cache_size=cfg.max_mamba_cache_size,
                         max_running_requests=cfg.max_running_requests, context_len=cfg.context_len,
                         chunk_size=cfg.max_probe_chunk_size, prefix_len=prefix_len,
                         attention_backend=cfg.attention_backend, device=cfg.device)
            for i, layers in enumerate(split_layers(spec.num_layers, world_size, cfg.layer_partition))]


def host_available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """MemAvailable of this host in bytes; None where /proc/meminfo cannot be read (not Linux)."""
    try:
        for line in meminfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "MemAvailable":
                return int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def gpu_total_bytes(count: int) -> list[int] | None:
    """total_memory of local GPUs 0..count-1 (local rank i runs on cuda:i); None where CUDA is not available."""
    import torch  # only here: a CPU run should not wait for CUDA

    if not torch.cuda.is_available():
        return None
    return [torch.cuda.get_device_properties(i).total_memory for i in range(min(count, torch.cuda.device_count()))]


def node_stages(world_size: int, local_ranks: int, torchrun: dict | None) -> range | None:
    """The stages (global ranks) of this node: from the rank's environment under torchrun, else from --node-rank
    with static rendezvous (ranks follow node ranks); None where it cannot be told (a c10d rendezvous orders
    nodes as they arrive)."""
    torchrun = torchrun or {}
    if "LOCAL_RANK" in os.environ and "RANK" in os.environ:
        start = int(os.environ["RANK"]) - int(os.environ["LOCAL_RANK"])
    elif world_size == local_ranks:
        start = 0
    elif torchrun.get("rdzv_backend") in (None, "static"):
        start = int(torchrun.get("node_rank") or 0) * local_ranks
    else:
        return None
    return range(start, min(start + local_ranks, world_size))


def stage_summary(m: StageMemory) -> str:
    """'weights 12.1 GiB, KV 40.0 GiB, ..., activations 38.2 GiB at chunk 10240 after 65536 tokens' (no zero parts),
    and the init draws where they make the peak."""
    parts = [f"{word} {format_bytes(getattr(m, key))}" for key, word in MEMORY_PARTS if getattr(m, key)]
    out = ", ".join(parts) + f" at chunk {m.chunk_size} after {m.prefix_len} tokens"
    if m.weights + m.weights_init > m.running:
        out += f"; drawing the weights takes {format_bytes(m.weights_init)} more at start"
    return out


def memory_fixes(cfg: ProfileConfig, m: StageMemory) -> str:
    """What lowers the parts that weigh most (each of at least a tenth of the total), as one phrase. Where the
    stages share a host (CPU), more stages do not shrink the weights and pools they hold together: fewer layers,
    a smaller dtype or more hosts do."""
    if cfg.device == "cuda":
        smaller_stages = [MORE_STAGES]
    else:
        smaller_stages = (["keep fewer layers (--num-layers)"] + (["use --dtype bfloat16"] if m.dtype == "float32"
                                                                  else []) + ["spread the stages over more hosts"])
    fixes = []
    for key, _ in sorted(MEMORY_PARTS, key=lambda kw: -getattr(m, kw[0])):
        if getattr(m, key) < m.total / 10:
            continue
        if key == "activation_peak":
            fixes.append("lower --base-chunk-size")
            if "attention" in m.activation_terms:
                fixes += (["use --attention-backend sdpa"] if m.attention_backend == "reference" else []) + [
                    "fewer/shorter --prefix-lens"]
        elif key == "kv_pool":
            if cfg.max_total_tokens > cfg.needed_total_tokens():
                fixes.append(f"lower --max-total-tokens (the probes need {cfg.needed_total_tokens()})")
            fixes += ["fewer/shorter --prefix-lens", *smaller_stages]
        elif key == "request_table":
            fixes.append("lower --max-running-requests or --context-len")
        else:
            fixes += (["lower --max-mamba-cache-size"] if key == "mamba_pool" else []) + smaller_stages
    if m.weights + m.weights_init > m.running:  # the draws of the largest tensor (embedding, LM head, experts)
        fixes.append("spread the stages over more hosts")
    fixes = list(dict.fromkeys(fixes))
    return fixes[0] if len(fixes) == 1 else ", ".join(fixes[:-1]) + ", or " + fixes[-1]


@dataclasses.dataclass(frozen=True, slots=True)
class MemoryVerdict:
    """Whether this node's stages fit in its memory, and against what."""

    limit: str
    """The limit this node's stages are checked against, in words."""
    checked: bool
    """False where it cannot be told here (no GPU visible, no /proc/meminfo)."""
    problem: str | None = None
    """One line when they do not fit: the stage, the estimate, the limit and the fix."""


def memory_verdict(cfg: ProfileConfig, stages: list[StageMemory], local_ranks: int,
                   local: range | None) -> MemoryVerdict:
    """Whether the stages of this node (`local`; None where unknown) fit: on CUDA each against its GPU's total
    memory, on CPU together against the host's MemAvailable."""
    mine = [stages[i] for i in local] if local is not None else []
    if cfg.device == "cuda":
        return gpu_verdict(cfg, mine or [max(stages, key=lambda s: s.total)] * local_ranks, local_ranks)
    return host_verdict(cfg, mine, max(mine or stages, key=lambda s: s.total), local_ranks)


def gpu_verdict(cfg: ProfileConfig, mine: list[StageMemory], local_ranks: int) -> MemoryVerdict:
    """Local stage j against the total memory of cuda:j (the largest stage against each where the node's stages are
    unknown; against GPUs alike where this machine has fewer than stages, as `ppprof model --memory` may)."""
    limits = gpu_total_bytes(local_ranks)
    if not limits:
        return MemoryVerdict("no CUDA device visible here: each stage must fit in its GPU's memory", False)
    limit_text = f"GPU memory {', '.join(format_bytes(b) for b in limits)} (cuda:0..{len(limits) - 1})"
    for j, m in enumerate(mine):
        limit = limits[min(j, len(limits) - 1)]
        if m.total > limit:
            return MemoryVerdict(limit_text, True, (
                f"stage {m.stage_idx} needs ~{format_bytes(m.total)} ({stage_summary(m)}) but its GPU (cuda:{j}) "
                f"has {format_bytes(limit)}: {memory_fixes(cfg, m)}"))
    return MemoryVerdict(limit_text, True)


def host_verdict(cfg: ProfileConfig, mine: list[StageMemory], largest: StageMemory,
                 local_ranks: int) -> MemoryVerdict:
    """This node's stages together (the largest x local ranks where they are unknown) against MemAvailable."""
    available = host_available_bytes()
    if available is None:
        return MemoryVerdict("host memory unknown here (no /proc/meminfo)", False)
    limit_text = (f"{format_bytes(available)} available on this host (MemAvailable), shared by its {local_ranks} "
                  f"stage{'s' * (local_ranks != 1)}")
    if len(mine) == 1:
        need, who, detail = mine[0].total, f"stage {mine[0].stage_idx} needs", stage_summary(largest)
    else:
        need = sum(m.total for m in mine) if mine else largest.total * local_ranks
        who = (f"stages {mine[0].stage_idx}-{mine[-1].stage_idx} of this host need" if mine else
               f"the {local_ranks} stages of this host need up to")
        detail = f"the largest, stage {largest.stage_idx}: {stage_summary(largest)}"
    if need <= available:
        return MemoryVerdict(limit_text, True)
    return MemoryVerdict(limit_text, True, (
        f"{who} ~{format_bytes(need)} ({detail}) but this host has {format_bytes(available)} available "
        f"(MemAvailable): {memory_fixes(cfg, largest)}"))


def check_memory(cfg: ProfileConfig, world_size: int, local_ranks: int, torchrun: dict | None = None,
                 spec: ModelSpec | None = None) -> None:
    """ValueError, one line, when this node's stages do not fit in its memory (memory_verdict); nothing where it
    cannot be told (no GPU visible, no /proc/meminfo)."""
    stages = profile_memory(cfg, world_size, spec)
    verdict = memory_verdict(cfg, stages, local_ranks, node_stages(world_size, local_ranks, torchrun))
    if verdict.problem:
        raise ValueError(verdict.problem)


MEMORY_OPTIONS = ("config_path", "device", "base_chunk_size", "requests_per_probe", "page_size", "max_mamba_cache_size",
                  "max_running_requests", "max_total_tokens", "context_len", "prefix_lens", "attention_backend")
"""The options of `ppprof profile` (by parameter name) that size what a stage holds: `ppprof model --memory` takes
them, the same click options, so that both resolve one ProfileConfig alike."""


def with_memory(model: click.Command, profile: click.Command) -> click.Command:
    """`ppprof model` (ppprof.specs.cli.model) plus --memory and the sizing options of `ppprof profile`: what each
    stage of that profile would need in memory, and the limit `ppprof profile` checks it against."""
    by_name = {p.name: p for p in profile.params}
    flag = click.Option(["--memory"], is_flag=True,
                        help="Also show what each stage of `ppprof profile` with these settings needs in memory "
                             "(stages: --pp, else --config's nproc_per_node, else 2) and the limit it is checked "
                             "against.")

    def callback(memory: bool, **options) -> None:
        sizing = {name: options.pop(name) for name in MEMORY_OPTIONS}
        if memory:
            return show_memory(options, sizing)
        given = [by_name[name].opts[0] for name, value in sizing.items() if value is not None]
        if given:
            raise ValueError(f"{given[0]} sizes the memory table only: add --memory")
        return model.callback(**options)

    params = [*model.params, flag, *(by_name[name] for name in MEMORY_OPTIONS)]
    return click.Command(model.name, params=params, callback=callback, help=model.help,
                         context_settings=model.context_settings, epilog=model.epilog)


def show_memory(options: dict, sizing: dict) -> None:
    """Print `ppprof model ... --memory`: the model, then each stage's memory (or one JSON object with both)."""
    pp_given = click.get_current_context().get_parameter_source("num_stages") != click.core.ParameterSource.DEFAULT
    flags = {**{k: v for k, v in sizing.items() if k != "config_path"}, "model": options["model"],
             "num_layers": options["num_layers"], "layer_partition": options["layer_partition"],
             "dtype": options["dtype"], "nproc_per_node": options["num_stages"] if pp_given else None}
    cfg = resolve_config(sizing["config_path"], flags)
    spec = load_spec(cfg.model, num_layers=cfg.num_layers, dtype=cfg.dtype)
    world_size = cfg.nproc_per_node  # flashinfer need not be installed here to estimate it (ppprof.specs.memory)
    stages = profile_memory(cfg, world_size, spec)
    verdict = memory_verdict(cfg, stages, world_size, range(world_size))
    dtype = stages[0].dtype
    if options["as_json"]:
        memory = {"settings": cfg.to_dict(), "stages": [m.to_dict() for m in stages], "limit": verdict.limit,
                  "checked": verdict.checked, "problem": verdict.problem}
        click.echo(json.dumps({**describe(spec, world_size, cfg.layer_partition, dtype), "memory": memory}))
        return
    settings = (f"pools: KV {cfg.max_total_tokens} slots (page {cfg.page_size}), {cfg.max_mamba_cache_size} Mamba "
                f"slots, {cfg.max_running_requests} requests x context {cfg.context_len}; {world_size} stages")
    click.echo(format_text(spec, stage_accounts(spec, world_size, cfg.layer_partition, dtype=dtype), dtype))
    click.echo("")
    click.echo(format_memory_text(stages, settings, verdict.limit, verdict.problem, checked=verdict.checked))

"""`ppprof model`: the resolved model spec and what each pipeline stage holds, before any rank starts; with --memory,
what each stage of a profile with the same sizing options as `ppprof profile` needs in memory, against the limit
`ppprof profile` checks it against."""

from __future__ import annotations

import json
from dataclasses import dataclass

import click

from ppprof.bounds import MAX_STAGES
from ppprof.checks import require_int
from ppprof.commands.options import SIZING_OPTIONS, option_name, sizing_options, taken, with_options
from ppprof.config import ProfileConfig
from ppprof.config.profile_config import DEFAULT_PP_SIZE
from ppprof.run.memory_check import memory_report
from ppprof.run.resolve import resolve_config
from ppprof.specs import load_spec, parse_partition
from ppprof.specs.accounting import accounting_dtype, describe, stage_accounts
from ppprof.specs.dtypes import DTYPE_BYTES
from ppprof.specs.text import format_memory_text, format_text
from ppprof.specs.tp import MAX_TP_SIZE, check_tp, rank_spec

DEFAULT_STAGES = 1
"""Stages `ppprof model` splits the model over without --pp (with --memory: the profile's, --config's or its default)."""


MODEL_OPTIONS = (
    (("--num-layers",), dict(type=int, default=None), "Keep N layers of the model (its mix of layer kinds kept)."),
    (
        ("--pp-size", "--pp", "pp_size"),
        dict(type=int, default=None),
        f"Pipeline stages. [{DEFAULT_STAGES}; with --memory: --config's nproc_per_node, else {DEFAULT_PP_SIZE}]",
    ),
    (
        ("--tp-size",),
        dict(type=int, default=None),
        "Tensor-parallel ranks of each stage: the stage table (and --memory) per TP rank. [1]",
    ),
    (("--layer-partition",), dict(default=None), "Layers per stage, e.g. 3,5 (default: even split)."),
    (
        ("--dtype",),
        dict(default=None),
        f"Weight/KV dtype: {', '.join(DTYPE_BYTES)} (default: bfloat16 on GPU, float32 on CPU).",
    ),
    (("--json", "as_json"), dict(is_flag=True), "Print one JSON object: the spec and its stages."),
    (
        ("--memory",),
        dict(is_flag=True),
        "Also show what each stage of `ppprof profile` with these settings needs in memory (stages as "
        "--pp says) and the limit it is checked against.",
    ),
)
"""The options of `ppprof model`, in the order --help shows them."""


@dataclass(frozen=True, slots=True)
class ModelOptions:
    """`ppprof model`'s own options (MODEL_OPTIONS) as click hands them, in one value; the sizing options
    (SIZING_OPTIONS) stay the flags of a profile's settings."""

    num_layers: int | None
    pp_size: int | None
    tp_size: int | None
    layer_partition: str | None
    dtype: str | None
    """The model's layers kept, its stages, each stage's TP ranks, the layers per stage and the dtype."""
    as_json: bool
    memory: bool
    """One JSON object or the text tables, and each stage's memory beside them."""


@click.command("model", epilog="Example: ppprof model nemotron-h-8b --pp 4 --memory --device cuda")
@click.argument("model")
@with_options(*MODEL_OPTIONS)
@sizing_options
def model(model: str, **options) -> None:
    """Show the resolved spec of MODEL (a preset name, a YAML file, a HF config.json or its folder) and what each
    pipeline stage holds: layers, parameters, KV bytes per token, Mamba bytes per slot."""
    opts, sizing = taken(ModelOptions, options), options
    num_layers, pp_size, tp_size, dtype, as_json = opts.num_layers, opts.pp_size, opts.tp_size, opts.dtype, opts.as_json
    layer_partition = opts.layer_partition
    for flag, value, top in (("--pp-size", pp_size, MAX_STAGES), ("--tp-size", tp_size, MAX_TP_SIZE)):
        if value is not None:  # 0 is a value, and out of range: not "not given"
            require_int(flag, value, 1, top)
    if opts.memory:
        flags = {
            **{k: v for k, v in sizing.items() if k != "config_path"},
            "model": model,
            "num_layers": num_layers,
            "layer_partition": layer_partition,
            "dtype": dtype,
            "tp_size": tp_size,
            "nproc_per_node": None if pp_size is None else pp_size * (tp_size or 1),
        }  # --pp-size wins over the config's
        return show_memory(resolve_config(sizing["config_path"], flags), as_json)
    given = [decls[0] for decls, _, _ in SIZING_OPTIONS if sizing[option_name(decls)] is not None]
    if given:
        raise ValueError(f"{given[0]} sizes the memory table only: add --memory")
    pp_size = DEFAULT_STAGES if pp_size is None else pp_size
    tp = 1 if tp_size is None else tp_size
    spec = load_spec(model, num_layers=num_layers, dtype=dtype)
    check_tp(spec, tp)
    partition = parse_partition(layer_partition)
    if as_json:
        doc = describe(spec, pp_size, partition, dtype)
        if tp > 1:  # the stages as one TP rank holds them
            doc.update(tp_size=tp, stages=describe(rank_spec(spec, tp), pp_size, partition, dtype)["stages"])
        click.echo(json.dumps(doc))
        return
    stages = stage_accounts(rank_spec(spec, tp), pp_size, partition, dtype=dtype)
    text = format_text(spec, stages, accounting_dtype(spec, dtype))
    click.echo(text if tp == 1 else text.replace("\nparams ", f"\n{tp_line(tp)}\nparams ", 1))


def tp_line(tp_size: int) -> str:
    """The line that says the figures below are one TP rank's."""
    return (
        f"tp          {tp_size} ranks a stage (heads, KV heads, intermediate, Mamba and DeltaNet heads and vocab "
        "split, MLA's latent whole); "
        "params and the stage table per TP rank"
    )


def show_memory(cfg: ProfileConfig, as_json: bool) -> None:
    """Print the model, then each stage's memory (or one JSON object with both)."""
    spec, stages, verdict = memory_report(cfg)
    pp_size, dtype = len(stages), stages[0].dtype
    spec = rank_spec(spec, cfg.parallelism.tp_size)
    if as_json:
        memory = {
            "settings": cfg.to_dict(),
            "stages": [m.to_dict() for m in stages],
            "limit": verdict.limit,
            "checked": verdict.checked,
            "problem": verdict.problem,
        }
        click.echo(json.dumps({**describe(spec, pp_size, cfg.parallelism.layer_partition, dtype), "memory": memory}))
        return
    settings = (
        f"pools: KV {cfg.pools.max_total_tokens} slots (page {cfg.pools.page_size}), {cfg.pools.max_mamba_cache_size} Mamba "
        f"slots, {cfg.pools.max_running_requests} requests x context {cfg.probes.context_len}; {pp_size} stages"
    )
    text = format_text(spec, stage_accounts(spec, pp_size, cfg.parallelism.layer_partition, dtype=dtype), dtype)
    click.echo(
        text
        if cfg.parallelism.tp_size == 1
        else text.replace("\nparams ", f"\n{tp_line(cfg.parallelism.tp_size)}\nparams ", 1)
    )
    click.echo("")
    click.echo(format_memory_text(stages, settings, verdict.limit, verdict.problem, checked=verdict.checked))

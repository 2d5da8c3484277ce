"""`ppprof model`: the resolved model spec and what each pipeline stage holds, before any rank starts; with --memory,
what each stage of a profile with the same sizing options as `ppprof profile` needs in memory, against the limit
`ppprof profile` checks it against."""

from __future__ import annotations

import json

import click

from ppprof.commands.options import SIZING_OPTIONS, option_name, shown, sizing_options
from ppprof.config import ProfileConfig
from ppprof.config.profile import DEFAULT_PP_SIZE
from ppprof.run.memory import memory_report
from ppprof.run.settings import resolve_config
from ppprof.specs import load_spec, parse_partition
from ppprof.specs.accounting import accounting_dtype, describe, stage_accounts
from ppprof.specs.dtypes import DTYPE_BYTES
from ppprof.specs.text import format_memory_text, format_text

DEFAULT_STAGES = 1
"""Stages `ppprof model` splits the model over without --pp (with --memory: the profile's, --config's or its default)."""


@click.command("model", epilog="Example: ppprof model nemotron-h-8b --pp 4 --memory --device cuda")
@click.argument("model")
@click.option("--num-layers", type=int, default=None, help="Keep N layers of the model (its mix of layer kinds kept).")
@click.option("--pp-size", "--pp", "num_stages", type=int, default=None,
              help=f"Pipeline stages. [{DEFAULT_STAGES}; with --memory: --config's nproc_per_node, else "
                   f"{DEFAULT_PP_SIZE}]")
@click.option("--layer-partition", default=None, help="Layers per stage, e.g. 3,5 (default: even split).")
@click.option("--dtype", default=None,
              help=f"Weight/KV dtype: {', '.join(DTYPE_BYTES)} (default: bfloat16 on GPU, float32 on CPU).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: the spec and its stages.")
@click.option("--memory", is_flag=True,
              help="Also show what each stage of `ppprof profile` with these settings needs in memory (stages as "
                   "--pp says) and the limit it is checked against.")
@sizing_options
def model(model: str, num_layers: int | None, num_stages: int | None, layer_partition: str | None,
          dtype: str | None, as_json: bool, memory: bool, **sizing) -> None:
    """Show the resolved spec of MODEL (a preset name, a YAML file, a HF config.json or its folder) and what each
    pipeline stage holds: layers, parameters, KV bytes per token, Mamba bytes per slot."""
    if memory:
        flags = {**{k: v for k, v in sizing.items() if k != "config_path"}, "model": model, "num_layers": num_layers,
                 "layer_partition": layer_partition, "dtype": dtype, "nproc_per_node": num_stages}
        return show_memory(resolve_config(sizing["config_path"], flags), as_json)
    given = [decls[0] for decls, _, _ in SIZING_OPTIONS if sizing[option_name(decls)] is not None]
    if given:
        raise ValueError(f"{given[0]} sizes the memory table only: add --memory")
    num_stages = num_stages or DEFAULT_STAGES
    spec = load_spec(model, num_layers=num_layers, dtype=dtype)
    partition = parse_partition(layer_partition)
    if as_json:
        click.echo(json.dumps(describe(spec, num_stages, partition, dtype)))
        return
    stages = stage_accounts(spec, num_stages, partition, dtype=dtype)
    click.echo(format_text(spec, stages, accounting_dtype(spec, dtype)))


def show_memory(cfg: ProfileConfig, as_json: bool) -> None:
    """Print the model, then each stage's memory (or one JSON object with both)."""
    spec, stages, verdict = memory_report(cfg)
    world_size, dtype = cfg.nproc_per_node, stages[0].dtype
    if as_json:
        memory = {"settings": cfg.to_dict(), "stages": [m.to_dict() for m in stages], "limit": verdict.limit,
                  "checked": verdict.checked, "problem": verdict.problem}
        click.echo(json.dumps({**describe(spec, world_size, cfg.layer_partition, dtype), "memory": memory}))
        return
    settings = (f"pools: KV {cfg.max_total_tokens} slots (page {cfg.page_size}), {cfg.max_mamba_cache_size} Mamba "
                f"slots, {cfg.max_running_requests} requests x context {cfg.context_len}; {world_size} stages")
    click.echo(format_text(spec, stage_accounts(spec, world_size, cfg.layer_partition, dtype=dtype), dtype))
    click.echo("")
    click.echo(format_memory_text(stages, settings, verdict.limit, verdict.problem, checked=verdict.checked))

"""`ppprof model`: print the resolved model spec and what each pipeline stage will hold, before any rank starts."""

from __future__ import annotations

import json

import click

from ppprof.specs.spec import ModelSpec
from ppprof.specs.partition import parse_partition
from ppprof.specs.accounting import StageAccount, accounting_dtype, describe, stage_accounts
from ppprof.specs.dtypes import AUTO_DTYPE_CPU, AUTO_DTYPE_GPU, DTYPE_BYTES
from ppprof.specs.load import load_spec
from ppprof.specs.pattern import format_layers

LAYOUT_LEGEND = "one char or token a layer: * attention, M mamba, - MLP, E MoE; \"*-\" = attention + MLP"


def _count(n: int) -> str:
    for unit, size in (("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def format_text(spec: ModelSpec, stages: list[StageAccount], dtype: str) -> str:
    lines = [
        f"model       {spec.name} (family {spec.family})",
        f"layers      {spec.num_layers}: {format_layers(spec.layers)}",
        f"            ({LAYOUT_LEGEND})",
        f"dims        hidden {spec.hidden_size}, vocab {spec.vocab_size}, intermediate {spec.intermediate_size}, "
        f"mlp {spec.mlp_act}",
    ]
    if any(layer.has_attention for layer in spec.layers):
        lines.append(f"attention   {spec.num_attention_heads} heads, {spec.num_key_value_heads} kv heads, "
                     f"head_dim {spec.head_dim}, rope_theta {spec.rope_theta:g}")
    if any(layer.has_mamba for layer in spec.layers):
        lines.append(f"mamba2      {spec.mamba_num_heads} heads x {spec.mamba_head_dim}, d_state {spec.ssm_state_size}, "
                     f"groups {spec.mamba_n_groups}, conv {spec.conv_kernel}, ssd chunk {spec.mamba_chunk_size}")
    if spec.num_experts and any(layer.ffn == "moe" for layer in spec.layers):
        lines.append(f"moe         {spec.num_experts} experts, top-{spec.num_experts_per_tok}, "
                     f"intermediate {spec.moe_intermediate_size}")
    auto = f"auto ({AUTO_DTYPE_GPU} on GPU, {AUTO_DTYPE_CPU} on CPU)"
    lines.append(f"dtype       {spec.dtype or auto}; bytes below for {dtype}, SSM state in float32")
    total = sum(s.num_params["total"] for s in stages)
    lines.append(f"params      {_count(total)} ({total:,})")
    lines.append("")
    header = ("stage", "layers", "params", "KV/token", "Mamba/slot", "layout")
    rows = [
        (str(s.stage_idx), f"{s.layers.start}-{s.layers.stop - 1}", _count(s.num_params["total"]),
         _bytes(s.kv_bytes_per_token), _bytes(s.mamba_bytes_per_slot), s.layout)
        for s in stages
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header) - 1)]
    for r in (header, *rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
    return "\n".join(lines)


@click.command("model")
@click.argument("model")
@click.option("--num-layers", type=int, default=None, help="Keep N layers of the model (its mix of layer kinds kept).")
@click.option("--pp", "num_stages", type=int, default=1, show_default=True, help="Pipeline stages.")
@click.option("--layer-partition", default=None, help="Layers per stage, e.g. 3,5 (default: even split).")
@click.option("--dtype", default=None,
              help=f"Weight/KV dtype: {', '.join(DTYPE_BYTES)} (default: bfloat16 on GPU, float32 on CPU).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object: the spec and its stages.")
def model(model: str, num_layers: int | None, num_stages: int, layer_partition: str | None, dtype: str | None,
          as_json: bool) -> None:
    """Show the resolved spec of MODEL (a preset name, a YAML file, a HF config.json or its folder) and what each
    pipeline stage holds: layers, parameters, KV bytes per token, Mamba bytes per slot."""
    spec = load_spec(model, num_layers=num_layers, dtype=dtype)
    partition = parse_partition(layer_partition)
    if as_json:
        click.echo(json.dumps(describe(spec, num_stages, partition, dtype)))
        return
    stages = stage_accounts(spec, num_stages, partition, dtype=dtype)
    click.echo(format_text(spec, stages, accounting_dtype(spec, dtype)))

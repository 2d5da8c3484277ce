"""The text `ppprof model` prints: the resolved model spec and what each pipeline stage will hold, and the table of
what each stage needs in memory (`--memory`)."""

from __future__ import annotations

from ppprof.specs.accounting import StageAccount, mtp_params
from ppprof.specs.dtypes import AUTO_DTYPE_CPU, AUTO_DTYPE_GPU
from ppprof.specs.memory import StageMemory, format_bytes
from ppprof.specs.pattern import format_layers
from ppprof.specs.spec import ModelSpec

LAYOUT_LEGEND = (
    'one char or token a layer: * attention, L MLA, M mamba, D Gated DeltaNet, - MLP, E MoE; "*-" = attention + MLP'
)


def _count(n: int) -> str:
    for unit, size in (("G", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.2f}{unit}"
    return str(n)


def format_text(spec: ModelSpec, stages: list[StageAccount], dtype: str) -> str:
    """What `ppprof model` prints: the resolved spec, a line a kind of layer part, then a row a stage."""
    lines = [
        f"model       {spec.name} (family {spec.family})",
        f"layers      {spec.num_layers}: {format_layers(spec.layers)}",
        f"            ({LAYOUT_LEGEND})",
        f"dims        hidden {spec.hidden_size}, vocab {spec.vocab_size}, intermediate {spec.intermediate_size}, "
        f"mlp {spec.mlp_act}",
        *_layer_kind_lines(spec),
    ]
    auto = f"auto ({AUTO_DTYPE_GPU} on GPU, {AUTO_DTYPE_CPU} on CPU)"
    lines.append(f"dtype       {spec.dtype or auto}; bytes below for {dtype}, SSM state in float32")
    total = sum(s.num_params["total"] for s in stages)
    active = sum(s.num_active_params for s in stages)
    lines.append(
        f"params      {_count(total)} ({total:,}); active a token {_count(active)} (no embedding, top-k experts only)"
    )
    if spec.num_mtp_layers:
        lines.append(f"mtp         {spec.num_mtp_layers} module(s), {_count(mtp_params(spec))} more: counted, not run")
    lines.append("")
    return "\n".join(lines + _stage_table(stages))


def _layer_kind_lines(spec: ModelSpec) -> list[str]:
    """One line for each kind of layer part the model has: attention, mla, deltanet, mamba2, moe."""
    lines = []
    if any(layer.has_attention for layer in spec.layers):
        extras = "".join(
            f", {name}" for name, on in (("q/k norm", spec.qk_norm), ("output gate", spec.attn_output_gate)) if on
        )
        lines.append(
            f"attention   {spec.num_attention_heads} heads, {spec.num_key_value_heads} kv heads, "
            f"head_dim {spec.head_dim}, rope_theta {spec.rope_theta:g}{extras}"
        )
    if any(layer.has_mla for layer in spec.layers):
        q = f"q_lora_rank {spec.q_lora_rank}" if spec.q_lora_rank else "q_proj"
        lines.append(
            f"mla         {spec.num_attention_heads} heads, {q}, kv_lora_rank {spec.kv_lora_rank}, qk "
            f"{spec.qk_nope_head_dim} nope + {spec.qk_rope_head_dim} rope, v {spec.v_head_dim}; cache "
            f"{spec.mla_latent_dim} values a token a layer; prefill decompresses the prefix's latents"
        )
    if any(layer.has_deltanet for layer in spec.layers):
        lines.append(
            f"deltanet    {spec.linear_num_key_heads} key heads x {spec.linear_key_head_dim}, "
            f"{spec.linear_num_value_heads} value heads x {spec.linear_value_head_dim}, conv "
            f"{spec.linear_conv_kernel_dim}, chunk {spec.deltanet_chunk_size}; state in the Mamba pool"
        )
    if any(layer.has_mamba for layer in spec.layers):
        lines.append(
            f"mamba2      {spec.mamba_num_heads} heads x {spec.mamba_head_dim}, d_state {spec.ssm_state_size}, "
            f"groups {spec.mamba_n_groups}, conv {spec.conv_kernel}, ssd chunk {spec.mamba_chunk_size}"
        )
    if spec.num_experts and any(layer.ffn == "moe" for layer in spec.layers):
        groups = f", top-{spec.moe_topk_group} of {spec.moe_n_group} groups" if spec.moe_n_group > 1 else ""
        shared = (
            f", shared {spec.shared_expert_intermediate_size}" + (" gated" if spec.shared_expert_gate else "")
            if spec.shared_expert_intermediate_size
            else ""
        )
        lines.append(
            f"moe         {spec.num_experts} experts, top-{spec.num_experts_per_tok}, "
            f"intermediate {spec.moe_intermediate_size}, {spec.moe_scoring}{groups}{shared}"
        )
    return lines


def _stage_table(stages: list[StageAccount]) -> list[str]:
    """The table of what each stage holds: its layers, parameters, cache bytes and layout."""
    header = ("stage", "layers", "params", "active", "KV/token", "Mamba/slot", "layout")
    rows = [
        (
            str(s.stage_idx),
            f"{s.layers.start}-{s.layers.stop - 1}",
            _count(s.num_params["total"]),
            _count(s.num_active_params),
            format_bytes(s.kv_bytes_per_token),
            format_bytes(s.mamba_bytes_per_slot),
            s.layout,
        )
        for s in stages
    ]
    return _table(header, rows)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    """Columns padded to their widest cell; the last column unpadded."""
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in (header, *rows)]


def format_memory_text(
    stages: list[StageMemory], settings: str, limit: str, problem: str | None, *, checked: bool = True
) -> str:
    """The memory table of `ppprof model --memory`: one row a stage, then the limit and the verdict (`problem`, None
    when they fit; `checked` False when the limit is unknown here). `settings` says what the pools are sized for."""
    first = stages[0]
    mamba = f", mamba {first.mamba_kernel}" if any(s.mamba_kernel for s in stages) else ""
    lines = [
        f"memory      the largest probe request: chunk {first.chunk_size} after {first.prefix_len} cached tokens; "
        f"{first.dtype} on {first.device}, attention {first.attention_backend}{mamba}",
        f"            {settings}",
        "",
    ]
    header = ("stage", "weights", "init draws", "KV pool", "Mamba pool", "requests", "activations", "total", "peak in")
    rows = [
        (
            str(s.stage_idx),
            format_bytes(s.weights),
            f"+{format_bytes(s.weights_init)}" if s.weights_init else "-",
            *(format_bytes(getattr(s, key)) for key in ("kv_pool", "mamba_pool", "request_table", "activation_peak")),
            format_bytes(s.total),
            f"layer {s.activation_layer} ({_peak_part(s)})",
        )
        for s in stages
    ]
    lines += _table(header, rows)
    if any(s.weights + s.weights_init > s.running for s in stages):
        lines.append("(total: the weights and their init draws, where that is more than the run's need)")
    verdict = "not checked here" if not checked else "fits" if problem is None else f"does not fit: {problem}"
    lines += ["", f"limit       {limit}", f"check       {verdict}"]
    return "\n".join(lines)


def _peak_part(s: StageMemory) -> str:
    """The part of the layer whose transient wins: 'attention', 'deltanet', 'mamba', 'mlp', 'moe' or 'norm'."""
    return next((k for k in s.activation_terms if k in ("attention", "deltanet", "mamba", "mlp", "moe", "norm")), "-")

"""Whether a policy fits the SGLang server it is loaded in: the server's configuration as SGLang's objects give it
(`ServerConfig`), and the checks, each a one-line refusal naming the field, both values and the fix."""

from __future__ import annotations

from dataclasses import dataclass, field

from ppprof.policy.runtime import Policy, largest_chunk

MODEL_CONFIG_FIELDS = (
    "context_len",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)
"""What the sizer reads of SGLang's ModelConfig (plus hf_config.model_type); the contract test finds each assigned
in SGLang's model_config.py."""
SHAPE_FIELDS = (
    "model_type",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
)
"""provenance.model_shape's keys, compared in this order (ppprof.fit.samples.model_shape writes them)."""


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """What SGLang says about itself when it builds the chunk sizer; None where it does not say."""

    pp_size: int | None
    tp_size: int | None
    page_size: int
    chunked_prefill_size: int
    max_prefill_tokens: int
    context_len: int | None
    device: str
    """SGLang's device argument ("cuda", "cuda:0", "cpu", ...)."""
    device_name: str | None
    """The accelerator's name as torch gives it ("NVIDIA H200"); None where SGLang's device module has none."""
    model_shape: dict = field(default_factory=dict)
    """SHAPE_FIELDS as SGLang's ModelConfig gives them (model_type from hf_config)."""


def model_shape_of(model_config) -> dict:
    """SHAPE_FIELDS of SGLang's ModelConfig; a field it lacks is None."""
    hf_config = getattr(model_config, "hf_config", None)
    shape = {"model_type": getattr(hf_config, "model_type", None)}
    shape.update({key: getattr(model_config, key, None) for key in SHAPE_FIELDS[1:]})
    return shape


def mismatch(policy: Policy, server: ServerConfig) -> str | None:
    """The first way the policy does not fit this server, as one line (field, policy's value, server's value, the
    fix), or None when it fits. Checked: stages, TP ranks, page size, B, the chunk cap, the context, the model's
    shapes and the device."""
    for check in (_pipeline, _chunks, _model, _device):
        line = check(policy, server)
        if line:
            return line
    return None


def _pipeline(policy: Policy, server: ServerConfig) -> str | None:
    prov = policy.provenance
    stages = prov.get("pp_size")
    if server.pp_size is not None and stages is not None and stages != server.pp_size:
        return (
            f"pp_size: the policy profiled {stages} stages (provenance.pp_size), the server runs "
            f"--pp-size {server.pp_size}: start SGLang with --pp-size {stages} or profile with --pp-size "
            f"{server.pp_size}"
        )
    if server.pp_size is not None and policy.pp_size != server.pp_size:
        return (
            f"num_stages: the policy's rules were chosen for {policy.pp_size} stages, the server runs "
            f"--pp-size {server.pp_size}: refit with `ppprof fit SAMPLES --pp {server.pp_size}`"
        )
    tp_size = prov.get("tp_size")
    if server.tp_size is not None and tp_size is not None and tp_size != server.tp_size:
        return (
            f"tp_size: the policy profiled {tp_size} TP ranks a stage (provenance.tp_size), the server runs "
            f"--tp-size {server.tp_size}: start SGLang with --tp-size {tp_size} or profile with --tp-size "
            f"{server.tp_size}"
        )
    return None


def _chunks(policy: Policy, server: ServerConfig) -> str | None:
    s = policy.settings
    if s.page_size != server.page_size:
        return (
            f"page_size: policy {s.page_size}, server {server.page_size}: start SGLang with --page-size "
            f"{s.page_size} or profile with --page-size {server.page_size}"
        )
    if s.base_chunk_size != server.chunked_prefill_size:
        return (
            f"chunked_prefill_size: server {server.chunked_prefill_size}, policy's base_chunk_size "
            f"{s.base_chunk_size}: start SGLang with --chunked-prefill-size {s.base_chunk_size} or profile with "
            f"--base-chunk-size {server.chunked_prefill_size}"
        )
    largest = largest_chunk(policy)
    if server.max_prefill_tokens < largest:
        return (
            f"max_prefill_tokens: server {server.max_prefill_tokens}, below the policy's largest chunk "
            f"{largest} (SGLang would cut its chunks): start SGLang with --max-prefill-tokens {largest}"
        )
    if server.context_len is not None and server.context_len > s.context_len:
        return (
            f"context_len: server {server.context_len}, policy {s.context_len} (its tables end there): start "
            f"SGLang with --context-length {s.context_len} or profile with --context-len {server.context_len}"
        )
    return None


def _model(policy: Policy, server: ServerConfig) -> str | None:
    shape = policy.provenance.get("model_shape")
    if not isinstance(shape, dict):
        return (
            "provenance.model_shape: the policy does not record the profiled model's shapes (fitted from a "
            "plain CSV, or by a ppprof before they were recorded): refit it from the profile's run folder, "
            "`ppprof fit RUN/samples.csv`"
        )
    for key in SHAPE_FIELDS:
        ours, theirs = shape.get(key), server.model_shape.get(key)
        if ours is not None and ours != theirs:
            return (
                f"model {key}: policy {ours!r} (provenance.model_shape), server {theirs!r}: profile the served "
                "model (its config.json, and the layers it runs) or serve the profiled one"
            )
    return None


def _device(policy: Policy, server: ServerConfig) -> str | None:
    hardware = policy.provenance.get("hardware") or {}
    kind, name = hardware.get("device"), hardware.get("device_name")
    server_kind = server.device.split(":")[0]
    if kind is not None and kind != server_kind:
        return (
            f"device: policy profiled on {kind} ({name}), server runs on {server_kind}: profile on the server's devices"
        )
    if name is not None and server.device_name is not None and name != server.device_name:
        return (
            f"device_name: policy profiled on {name!r} (provenance.hardware), server runs on "
            f"{server.device_name!r}: profile on the server's devices"
        )
    return None


def matched_line(policy: Policy, server: ServerConfig) -> str:
    """What a matched load says: the configuration it matched and the rules it answers with."""
    shape = policy.provenance.get("model_shape") or {}
    model = f"{shape.get('model_type')} {shape.get('num_hidden_layers')} layers x {shape.get('hidden_size')}"
    history = policy.data["table"]["chunk_size"]
    rules = (
        f"static, fixed chunks of {history[0]}"
        if policy.status == "static"
        else f"dynamic, prompt-aware rule of {len(policy.prompt_rule.prompt_len)} bands, history-only table of "
        f"{len(history)} entries"
    )
    return (
        f"pp {server.pp_size}, tp {server.tp_size}, page {server.page_size}, B {server.chunked_prefill_size}, "
        f"context {server.context_len} <= {policy.settings.context_len}, {model}, "
        f"{server.device_name or server.device}: {rules}"
    )

"""Reading fields of a HuggingFace config.json: typed, with a family's default, each error naming its key. Shared by
the family readers (hf.py, hf_moe.py)."""

from __future__ import annotations

import math
from typing import Any

from ppprof.checks import a_type, is_int, is_number, short
from ppprof.specs.spec import MAX_LAYERS


def read_int(cfg: dict, *keys: str, default: Any) -> int:
    """The first of `keys` the config gives (else `default`) as an integer; ValueError naming the key unless it is one
    (a float, 4096.0 too, a string, a bool or a list is refused, not truncated)."""
    key = next((k for k in keys if cfg.get(k) is not None), None)
    value = default if key is None else cfg[key]
    if not is_int(value):
        raise ValueError(f"{key or keys[0]}={short(value)} must be an integer, not {a_type(value)}; fix the config")
    return value


def read_float(cfg: dict, *keys: str, default: Any) -> float:
    """The first of `keys` the config gives (else `default`) as a finite number; ValueError naming the key."""
    key = next((k for k in keys if cfg.get(k) is not None), None)
    return read_number(key or keys[0], default if key is None else cfg[key])


def read_number(key: str, value) -> float:
    if not is_number(value) or not math.isfinite(value):
        raise ValueError(f"{key}={short(value)} must be a finite number; fix the config")
    return float(value)


def rope_theta(cfg: dict, default: float) -> float:
    # Newer transformers move rope_theta into rope_parameters (or the older rope_scaling).
    for holder in (cfg, cfg.get("rope_parameters") or {}, cfg.get("rope_scaling") or {}):
        if isinstance(holder, dict) and holder.get("rope_theta") is not None:
            return read_number("rope_theta", holder["rope_theta"])
    return float(default)


def attention_fields(cfg: dict, d: dict[str, Any]) -> dict[str, Any]:
    """Attention fields with the family defaults `d`; head_dim = hidden / heads unless given."""
    hidden = read_int(cfg, "hidden_size", default=d["hidden_size"])
    heads = read_int(cfg, "num_attention_heads", default=d["num_attention_heads"])
    kv_heads = read_int(cfg, "num_key_value_heads", default=d["num_key_value_heads"] or heads)
    head_dim = (
        None
        if cfg.get("head_dim") is None and d.get("head_dim") is None
        else read_int(cfg, "head_dim", default=d.get("head_dim"))
    )
    if head_dim is None:
        if heads <= 0 or hidden % heads:
            raise ValueError(
                f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads}): "
                "give head_dim in the config"
            )
        head_dim = hidden // heads
    return dict(
        hidden_size=hidden,
        vocab_size=read_int(cfg, "vocab_size", default=d["vocab_size"]),
        intermediate_size=read_int(cfg, "intermediate_size", default=d["intermediate_size"]),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=read_float(cfg, "rms_norm_eps", default=d.get("rms_norm_eps", 1e-5)),
        rope_theta=rope_theta(cfg, d.get("rope_theta", 10000.0)),
    )


def num_layers(cfg: dict, default: int) -> int:
    n = read_int(cfg, "num_hidden_layers", default=default)
    if not 1 <= n <= MAX_LAYERS:
        raise ValueError(f"num_hidden_layers={n} must be in 1..{MAX_LAYERS}; fix the config")
    return n

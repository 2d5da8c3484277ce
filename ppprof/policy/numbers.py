"""The bounds of every number a policy file holds, checked after the JSON Schema (which gives their types and lower
bounds): the contract's (ppprof.policy.contract.CONTRACT_FIELDS, which its parts check as they are read) and the
report's here (REPORT_FIELDS: stages, TP ranks and layers what ppprof takes, counts exact in a double, errors and
gains in their ranges). A number beyond its bound is a broken or hand-edited file: a server would overflow on it or
plan nonsense."""

from __future__ import annotations

import re
from functools import cache

from ppprof.bounds import MAX_LAYERS, MAX_STAGES, MAX_TOKENS, MAX_TP_SIZE
from ppprof.checks import is_number, short
from ppprof.policy.contract import (
    CONTRACT_FIELDS,
    COUNT,
    LATENCY,
    MAX_COUNT,
    MAX_FILL,
    MAX_LATENCY_MS,
    MAX_LINEAR_SCALE,
    RENAMED,
    REPORT_ORDER,
    SIGNED_LATENCY,
    STAGES,
    TOKENS,
    Bound,
    number_text,
)

__all__ = ["FIELDS", "MAX_COUNT", "MAX_FILL", "MAX_LATENCY_MS", "MAX_LINEAR_SCALE", "REPORT_FIELDS", "number_error"]

MAX_WALL_S = 1e7
"""The longest probing a policy records, seconds (about 116 days)."""
MAX_RELATIVE_ERROR = 1e6
"""The largest relative error of a prediction a policy records (1 is 100%)."""
MAX_THROUGHPUT = 1e12
"""The largest input throughput a policy records, tokens a second."""

INT32 = Bound(1, MAX_TOKENS, "a model dimension (an int32)")
TP_RANKS = Bound(1, MAX_TP_SIZE, "TP ranks a stage (ppprof's --tp-size bound)")
LAYERS = Bound(1, MAX_LAYERS, "layers (a model spec's bound)")
WALL_S = Bound(0, MAX_WALL_S, "seconds of probing")
FRACTION = Bound(0, 1, "a weight (the weights sum to 1)")
GAIN = Bound(-1, 1, "a gain over the best fixed chunk")
STAGE = Bound(0, MAX_STAGES - 1, "a stage's index")
PIECES = Bound(1, MAX_TOKENS, "pieces in one forward (a token each at least)")
RELATIVE_ERROR = Bound(0, MAX_RELATIVE_ERROR, "a relative error (1 is 100%)")
THROUGHPUT = Bound(0, MAX_THROUGHPUT, "an input throughput in tokens a second")
SEED = Bound(0, 2**32 - 1, "a seed")

APE_KEYS = ("mape", "median_ape", "worst_ape")
"""A prediction's absolute relative errors: their mean, median and largest."""
PACKED_ERRORS = ("additive", "additive_on_probes", "extra_piece")
"""packed_forwards' predictions of the packed forwards, each with APE_KEYS."""
REPORT_FIELDS = (
    ("target_chunk_latency_ms", SIGNED_LATENCY),
    ("packed_forwards.forwards", COUNT),
    ("packed_forwards.pieces[]", PIECES),
    ("packed_forwards.stage", STAGE),
    *((f"packed_forwards.{p}.{k}", RELATIVE_ERROR) for p in PACKED_ERRORS for k in APE_KEYS),
    ("packed_forwards.extra_piece.ms", SIGNED_LATENCY),
    ("packed_forwards.extra_piece.stderr_ms", LATENCY),
    ("packed_forwards.extra_piece_ms", LATENCY),
    ("provenance.pp_size", STAGES),
    ("provenance.tp_size", TP_RANKS),
    ("provenance.layer_partition[]", LAYERS),
    ("provenance.model_shape.num_hidden_layers", LAYERS),
    *((f"provenance.model_shape.{k}", INT32) for k in ("hidden_size", "num_attention_heads")),
    *((f"provenance.model_shape.{k}", INT32) for k in ("num_key_value_heads", "head_dim")),
    ("domain.prefix_len[]", TOKENS),
    ("domain.chunk_size[]", TOKENS),
    ("domain.prefix_lens[]", TOKENS),
    ("design.requests", COUNT),
    ("design.forward_tokens", COUNT),
    ("design.probe_wall_s", WALL_S),
    ("workload.prompt_lens[]", TOKENS),
    ("workload.weights[]", FRACTION),
    ("predicted.gain_vs_fixed_best", GAIN),
    ("predicted.fixed_best_chunk", TOKENS),
    ("load.worst_loss", RELATIVE_ERROR),
    ("load.idle_worst_loss", RELATIVE_ERROR),
    ("load.pending_requests[]", COUNT),
    ("load.bound_ms[]", LATENCY),
    ("load.chunk_cap[]", TOKENS),
    *((f"load.{k}[][]", TOKENS) for k in ("prefix_len", "chunk_size")),
    ("load.handover_tokens", TOKENS),
    ("load.num_prompts", COUNT),
    ("load.seed", SEED),
    ("load.async_depth", COUNT),
    ("load.levels[].concurrency", COUNT),
    ("load.levels[].throughput_tokens_per_s.*", THROUGHPUT),
    ("load.levels[].ttft_mean_ms.*", LATENCY),
)
"""Every number of the report (and of a schema 4 under-load rule, kept but not read) and its bound, by its path in the
report's object (schema 6); a field absent or null is not checked."""


@cache
def report_fields(nested: bool) -> tuple:
    """REPORT_FIELDS at their paths in a document of schema 6's layout (`nested`: the report's below `report`) or of
    the older one (the report's beside the contract's, RENAMED's under their old names)."""
    old = {f"{part}.{new}": f"{part}.{name}" for part, name, new in RENAMED}
    out = []
    for path, bound in REPORT_FIELDS:
        if nested:
            out.append((f"report.{path}" if path.split(".")[0] in REPORT_ORDER else path, bound))
        else:
            out.append((old.get(path, path), bound))
    return tuple(out)


FIELDS = CONTRACT_FIELDS + report_fields(nested=True)
"""Every number of a schema 6 file and its bound, by its path in the file."""


def values_at(node, steps: list[str], where: str = "$"):
    """(JSON path, value) of each value at `steps` below `node`, None and what is absent left out."""
    if not steps:
        if node is not None:
            yield where, node
        return
    step, rest = steps[0], steps[1:]
    if step == "[]":
        for i, item in enumerate(node if isinstance(node, list) else ()):
            yield from values_at(item, rest, f"{where}[{i}]")
    elif step == "*":
        for key, item in node.items() if isinstance(node, dict) else ():
            yield from values_at(item, rest, f"{where}.{key}")
    elif isinstance(node, dict) and step in node:
        yield from values_at(node[step], rest, f"{where}.{step}")


def number_error(data: dict, fields=FIELDS) -> str | None:
    """The first number of `data` outside its bound (`fields`, every one by default), one line naming the field, the
    value and its range; None where every one is within."""
    for path, bound in fields:
        for where, value in values_at(data, re.findall(r"\[\]|[^.\[\]]+", path)):
            if not is_number(value):
                return f"{where}: {short(value)} is not a number: it is {bound.what}"
            if not bound.low <= value <= bound.high:
                low, high = number_text(bound.low), number_text(bound.high)
                return f"{where}: {short(value)} is outside {low}..{high}, the range of {bound.what}"
    return None

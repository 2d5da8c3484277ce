"""The bounds of every number a policy file holds, checked after the JSON Schema (which gives their types and lower
bounds): token counts fit an int32, stages, TP ranks and layers what ppprof takes, latencies and coefficients a
chunk that ends within MAX_LATENCY_MS. A number beyond its bound is a broken or hand-edited file: a server would
overflow on it or plan nonsense."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ppprof.bounds import MAX_STAGES, MAX_TOKENS
from ppprof.checks import is_number, short
from ppprof.specs.spec import MAX_LAYERS
from ppprof.specs.tp import MAX_TP_SIZE

MAX_LATENCY_MS = 1e7
"""The largest latency a policy holds, ms (about 2.8 hours a chunk): a target, a bound, the overhead, the
calibration's shift; and the largest coefficient in its unit (ms per token^k: a one-token chunk's cost)."""
MAX_LINEAR_SCALE = 1e3
"""The largest calibration linear_scale read (a fit applies one in 0.5..2 only)."""
MAX_COUNT = 2**53
"""The largest count summed over a whole profile (requests, forward tokens): exact in a double, as JSON readers in
other languages hold numbers."""
MAX_WALL_S = 1e7
"""The longest probing a policy records, seconds (about 116 days)."""
MAX_RELATIVE_ERROR = 1e6
"""The largest relative error of a prediction a policy records (1 is 100%)."""
MAX_FILL = 1e3
"""The largest `fill` of an under-load rule read (a fit tries a few, about 1)."""
MAX_THROUGHPUT = 1e12
"""The largest input throughput a policy records, tokens a second."""


@dataclass(frozen=True, slots=True)
class Bound:
    """A number's range, low..high, and what the range is, in words."""

    low: float
    high: float
    what: str


TOKENS = Bound(0, MAX_TOKENS, "a token count (servers index tokens with int32)")
INT32 = Bound(1, MAX_TOKENS, "a model dimension (an int32)")
STAGES = Bound(1, MAX_STAGES, "pipeline stages (ppprof's --pp-size bound)")
TP_RANKS = Bound(1, MAX_TP_SIZE, "TP ranks a stage (ppprof's --tp-size bound)")
LAYERS = Bound(1, MAX_LAYERS, "layers (a model spec's bound)")
LATENCY = Bound(0, MAX_LATENCY_MS, "a latency in ms")
SIGNED_LATENCY = Bound(-MAX_LATENCY_MS, MAX_LATENCY_MS, "a latency in ms")
COEFFICIENT = Bound(-MAX_LATENCY_MS, MAX_LATENCY_MS, "a coefficient in its unit (a one-token chunk's cost)")
SCALE = Bound(0, MAX_LINEAR_SCALE, "a linear scale")
COUNT = Bound(0, MAX_COUNT, "a count exact in a double")
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
FIELDS = (
    *((f"settings.{k}", TOKENS) for k in ("base_chunk_size", "page_size", "alignment", "min_chunk_size")),
    *((f"settings.{k}", TOKENS) for k in ("max_chunk_size", "context_len", "context_margin")),
    ("latency_model.coefficients.*.value", COEFFICIENT),
    ("target_latency_ms", LATENCY),
    ("target_chunk_latency_ms", SIGNED_LATENCY),
    ("overhead.ms_per_chunk", LATENCY),
    ("overhead.stderr_ms", LATENCY),
    ("calibration.linear_scale", SCALE),
    ("calibration.shift_ms", SIGNED_LATENCY),
    ("packed_forwards.forwards", COUNT),
    ("packed_forwards.pieces[]", PIECES),
    ("packed_forwards.stage", STAGE),
    *((f"packed_forwards.{p}.{k}", RELATIVE_ERROR) for p in PACKED_ERRORS for k in APE_KEYS),
    ("packed_forwards.extra_piece.ms", SIGNED_LATENCY),
    ("packed_forwards.extra_piece.stderr_ms", LATENCY),
    ("packed_forwards.extra_piece_ms", LATENCY),
    ("num_stages", STAGES),
    ("provenance.world_size", STAGES),
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
    ("table.prefix_len[]", TOKENS),
    ("table.chunk_size[]", TOKENS),
    ("table.bound_ms", LATENCY),
    ("table.chunk_cap", TOKENS),
    *((f"prompt_table.{k}[]", TOKENS) for k in ("prompt_len", "merge_len")),
    ("prompt_table.bound_ms[]", LATENCY),
    *((f"prompt_table.{k}[][]", TOKENS) for k in ("prefix_len", "chunk_size")),
    *((f"prompt_table.{k}", TOKENS) for k in ("unit", "largest_chunk", "max_prompt_len")),
    ("load.slots", COUNT),
    ("load.fill", Bound(0, MAX_FILL, "how many times over the work fills the slots")),
    ("load.unit", TOKENS),
    ("load.floor", TOKENS),
    ("load.full.bound_ms", LATENCY),
    ("load.full.chunk_cap", TOKENS),
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
"""Every number of the file (a path's `[]` is each item of a list, `*` each value of an object) and its bound; a
field absent or null is not checked."""


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


def number_text(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:g}"


def number_error(data: dict) -> str | None:
    """The first number of `data` outside its bound (FIELDS), one line naming the field, the value and its range;
    None where every one is within."""
    for path, bound in FIELDS:
        for where, value in values_at(data, re.findall(r"\[\]|[^.\[\]]+", path)):
            if not is_number(value):
                return f"{where}: {short(value)} is not a number: it is {bound.what}"
            if not bound.low <= value <= bound.high:
                low, high = number_text(bound.low), number_text(bound.high)
                return f"{where}: {short(value)} is outside {low}..{high}, the range of {bound.what}"
    return None

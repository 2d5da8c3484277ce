"""Policy dicts built straight from coefficients (no fit), for the policy tests: the rules are chosen as `ppprof fit`
chooses them (ppprof.fit.build.carried), on a domain of chunks up to `largest` and prompts up to the context."""

import copy
from functools import cache
from pathlib import Path

import numpy as np

from ppprof.config import ChunkSettings, PolicyOptions
from ppprof.fit.build import Gated, carried
from ppprof.fit.packed import PackedRows, additive_ms, packed_forwards
from ppprof.fit.samples import Samples
from ppprof.policy.rule import LatencyModel
from ppprof.policy.runtime import nested
from ppprof.policy.schema import SCHEMA_VERSION


def policy_dict(
    model: LatencyModel, status="dynamic", largest=None, pp_size=4, min_gain=0.0, overhead_ms=None, **settings
) -> dict:
    """A policy of `model` (B 8192, context 131072, page 64 unless given); status "static" as a failed gate gives it;
    min_gain 0 by default so that the rules are dynamic (and tested) whatever they gain."""
    key = (model, status, largest, pp_size, min_gain, overhead_ms, tuple(sorted(settings.items())))
    return copy.deepcopy(_policy_dict(key))


@cache
def _policy_dict(key) -> dict:
    model, status, largest, pp_size, min_gain, overhead_ms, settings = key
    s = ChunkSettings(**{"base_chunk_size": 8192, "context_len": 131072, "page_size": 64, **dict(settings)})
    target = model.target_ms(s.base_chunk_size)
    measured = {"prefix_len": [0, s.context_len], "chunk_size": [1, largest or 4 * s.base_chunk_size]}
    options = PolicyOptions(min_gain=min_gain, overhead_ms=overhead_ms, pp_size=pp_size)
    rules = carried(Gated(model, status, "test"), s, measured, None, options)
    return nested(
        {
            "schema_version": SCHEMA_VERSION,
            "latency_model": model.to_dict(),
            "settings": s.to_dict(),
            "target_latency_ms": target,
            "provenance": {"pp_size": 4, "layer_partition": [8, 8, 8, 8]},
            "parity": None,
            **rules,
        }
    )


def with_packed_forwards(data: dict, model: LatencyModel, extra_piece_ms: float = 0.5) -> dict:
    """`data` with the packed_forwards `ppprof fit` writes for rows that `model`'s additive form misses by
    `extra_piece_ms` a piece beyond the first (two forwards of 2 and 3 pieces), scored on samples of their cells too."""
    lens, chunks = (np.array([0, 8192]), np.array([4096, 0, 0])), (np.array([1024, 64]), np.array([512, 256, 8]))
    rows = PackedRows(lens, chunks, {0: np.ones(2)}, Path("packed.csv"))
    measured = additive_ms(model, rows) + extra_piece_ms * (rows.pieces - 1)
    rows = PackedRows(lens, chunks, {0: measured, 1: 0.5 * measured}, Path("packed.csv"))
    L, x = np.concatenate(lens), np.concatenate(chunks)
    samples = Samples(L, x, model.chunk_latency_ms(L, x), None, 0, None, Path("samples.csv"), "")
    data = copy.deepcopy(data)
    return data | {"report": data["report"] | {"packed_forwards": packed_forwards(model, rows, 0, samples)}}

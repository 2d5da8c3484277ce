"""Forward traces for the tests, written by the real writer (ppprof.forwards.writer)."""

from __future__ import annotations

from pathlib import Path

from ppprof.forwards import ForwardTraceWriter, TraceIdentity, header
from ppprof.forwards.format import IDENTITY

TINY_HYBRID_SHAPE = {
    "model_type": "nemotron_h",
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
"""tests/runs/tiny-hybrid's provenance.model_shape."""


def trace_header(**changes) -> dict:
    fields = {
        "model_shape": TINY_HYBRID_SHAPE,
        "pp_size": 2,
        "tp_size": 1,
        "device": "cpu",
        "dtype": "float32",
        "server": "ppprof serve-bench",
        "server_version": "0.1.0",
        "context_len": 4096,
        "clock": "perf_counter",
        "max_records": 0,
        "started_at": "2026-12-05T08:00:00+00:00",
    } | changes
    identity = TraceIdentity(**{k: fields.pop(k) for k in IDENTITY})
    return header(identity, **fields)


def write_trace(path: Path, forwards, max_records: int = 1000, **changes) -> ForwardTraceWriter:
    """A trace of `forwards` ((stage, tp_rank, pieces, latency_ms, time_s) each) through the writer, closed."""
    writer = ForwardTraceWriter(path, trace_header(**changes), max_records)
    for stage, tp_rank, pieces, ms, t in forwards:
        writer.record(stage, tp_rank, pieces, ms, t)
    writer.close()
    return writer

"""Request traces a serving bench replays: Mooncake's JSONL (`mooncake`), the field's shared format. Pure: no torch."""

from ppprof.traces.mooncake import BLOCK_TOKENS, Trace, TraceRequest, read_trace

__all__ = ["BLOCK_TOKENS", "Trace", "TraceRequest", "read_trace"]

"""The forward trace (docs/forwards.md): a server's own forwards, one record per forward per stage, written without
blocking the serving loop (`writer`), read bounded and checked (`reader`), in one format (`format`). Pure: no torch."""

from ppprof.forwards.format import FORMAT, VERSION, TraceIdentity, forward, header
from ppprof.forwards.reader import Forwards, read_forwards
from ppprof.forwards.writer import ForwardTraceWriter

__all__ = ["FORMAT", "VERSION", "Forwards", "ForwardTraceWriter", "TraceIdentity", "forward", "header", "read_forwards"]

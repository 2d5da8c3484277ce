"""The servers ppprof knows, by name: `ppprof tune --server`, `ppprof export --server` and the bench's server arms
iterate this. A new server is one module (a Server subclass and its instance) and one entry here."""

from __future__ import annotations

from ppprof.servers.atom import ATOM
from ppprof.servers.base import Server
from ppprof.servers.sglang import SGLANG
from ppprof.servers.vllm_ascend import VLLM_ASCEND

REGISTRY: dict[str, Server] = {server.name: server for server in (SGLANG, VLLM_ASCEND, ATOM)}
SERVERS = tuple(REGISTRY)
"""The names --server takes."""
DEFAULT_SERVER = SGLANG.name


def get(name: str) -> Server:
    """The server called `name`; ValueError (one line) naming --server otherwise."""
    if name not in REGISTRY:
        raise ValueError(f"--server {name!r} is unknown: use one of {', '.join(SERVERS)}")
    return REGISTRY[name]

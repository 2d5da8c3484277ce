"""Servers that carry a policy (SGLang, vllm-ascend, ATOM): one module each behind one interface (base.Server), the
registry that names them, and what runs over them: `ppprof export` (export.py) and `ppprof tune` (tune.py).

Above ppprof.policy and ppprof.config, below ppprof.fit; pure Python and numpy."""

from ppprof.servers.base import Server, ServerSetting
from ppprof.servers.registry import DEFAULT_SERVER, REGISTRY, SERVERS, get

__all__ = ["DEFAULT_SERVER", "REGISTRY", "SERVERS", "Server", "ServerSetting", "get"]

"""Dynamic-chunk policies: the contract a server reads (`contract`, `runtime`: the file read, checked and answered),
the file written (`policy_file`), the next-chunk rule, planners and server exports.

Servers call `ppprof.policy.load(path)` and then `next_chunk_size(prefix_len)` or `plan(prompt_len)`. The names
below are resolved when first used (PEP 562), so that `import ppprof.policy.contract` loads the contract alone.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "SCHEMA_VERSION": "ppprof.policy.contract",
    "ChunkSettings": "ppprof.chunks",
    "LatencyModel": "ppprof.policy.contract",
    "Policy": "ppprof.policy.runtime",
    "from_dict": "ppprof.policy.runtime",
    "load": "ppprof.policy.runtime",
    "next_chunk_size": "ppprof.policy.rule",
    "save": "ppprof.policy.policy_file",
    "validate": "ppprof.policy.policy_file",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'ppprof.policy' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value  # once: the next use is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))

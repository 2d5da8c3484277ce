"""Dynamic-chunk policies: the file (schema, load, save), the next-chunk rule, planners and server exports.

Servers call `ppprof.policy.load(path)` and then `next_chunk_size(prefix_len)` or `plan(prompt_len)`.
"""

from ppprof.config import ChunkSettings
from ppprof.policy.policy_file import from_dict, load, save, validate
from ppprof.policy.rule import LatencyModel, next_chunk_size
from ppprof.policy.runtime import Policy
from ppprof.policy.schema import SCHEMA_VERSION

__all__ = [
    "SCHEMA_VERSION",
    "ChunkSettings",
    "LatencyModel",
    "Policy",
    "from_dict",
    "load",
    "next_chunk_size",
    "save",
    "validate",
]

"""Memory bookkeeping of a pipeline stage, as a serving engine does it.

allocators (kv.py, mamba.py, req.py: free-slot bookkeeping only, no tensors) sit below pools (pools.py: the tensors);
cache.py ties them together and owns the one release path (KV slots -> Mamba slot -> request entry).
"""

from ppprof.mem.cache import LeakError, Request, StageCache
from ppprof.mem.kv import KVAllocator
from ppprof.mem.mamba_slots import MambaAllocator
from ppprof.mem.req import ReqToTokenPool

__all__ = ["KVAllocator", "LeakError", "MambaAllocator", "ReqToTokenPool", "Request", "StageCache"]

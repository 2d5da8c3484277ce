"""Steady host memory for CPU timings: glibc's malloc by default moves its mmap threshold as blocks are freed, so the
same forward sometimes gets its large temporaries from fresh mmap'd pages (page faults on every first touch) and
sometimes from the heap. Measured on tiny-hybrid, 2 CPU ranks: p90-p10 spread of repeated (prefix, chunk) latencies
30-40% with the default, about 5% with fixed thresholds. Setting the thresholds fixes the choice."""

from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc refuses more than this on 64-bit
TRIM_THRESHOLD = 1 << 30
TOP_PAD = 64 * 1024 * 1024


def steady_malloc() -> bool:
    """Fix glibc's malloc thresholds in this process; False where this is not glibc (nothing changed)."""
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    ok = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)
    ok &= mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    ok &= mallopt(M_TOP_PAD, TOP_PAD)
    return bool(ok)

"""The settings tree: every setting a command takes, typed, bounded and with its one default, checked at
construction (before any rank starts). profile: ProfileConfig (what `ppprof profile` measures); chunk: ChunkSettings
(the next-chunk rule's, part of a profile's settings and of its policy); policy: PolicyOptions (what a
policy's rules are chosen with); bench: BenchConfig (a bench on a profile)."""

from ppprof.config.bench_config import BENCH_STRATEGIES, DEFAULT_STRATEGIES, BenchConfig
from ppprof.config.chunk import CONTEXT_MARGIN, DEFAULT_CONTEXT_LEN, DEFAULT_SMOOTH_FACTOR, ChunkSettings
from ppprof.config.policy import DEFAULT_MIN_GAIN, PolicyOptions
from ppprof.config.profile_config import ProfileConfig, sweep_chunk_sizes
from ppprof.config.sections import DESIGNS, flag

__all__ = [
    "BENCH_STRATEGIES",
    "DEFAULT_STRATEGIES",
    "CONTEXT_MARGIN",
    "DEFAULT_CONTEXT_LEN",
    "DEFAULT_MIN_GAIN",
    "DEFAULT_SMOOTH_FACTOR",
    "DESIGNS",
    "BenchConfig",
    "ChunkSettings",
    "PolicyOptions",
    "ProfileConfig",
    "flag",
    "sweep_chunk_sizes",
]

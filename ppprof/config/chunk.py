"""The settings of the next-chunk rule, part of the settings tree: ChunkSettings and its one check of B against its
units live on the ground floor (ppprof.chunks), where the policy contract a server imports reads them too."""

from ppprof.chunks import (
    CONTEXT_MARGIN,
    DEFAULT_CONTEXT_LEN,
    DEFAULT_SMOOTH_FACTOR,
    SETTINGS_ORDER,
    ChunkSettings,
    ChunkSizes,
    check_base_chunk,
)

__all__ = [
    "CONTEXT_MARGIN",
    "DEFAULT_CONTEXT_LEN",
    "DEFAULT_SMOOTH_FACTOR",
    "SETTINGS_ORDER",
    "ChunkSettings",
    "ChunkSizes",
    "check_base_chunk",
]

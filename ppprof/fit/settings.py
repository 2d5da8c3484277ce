"""The settings a policy is fitted with: the latency-model choices, and the chunk settings resolved from the options
given, then run.json's config, then the defaults here."""

from __future__ import annotations

from pathlib import Path

from ppprof.policy.rule import MODEL_NAMES, ChunkSettings

LATENCY_MODEL_CHOICES = MODEL_NAMES + ("auto",)
DEFAULT_SMOOTH_FACTOR = 0.75
DEFAULT_CONTEXT_LEN = 131072


def resolve_settings(run: dict | None, samples_path: Path, *, base_chunk_size=None, smooth_factor=None,
                     page_size=None, alignment=None, min_chunk_size=None, max_chunk_size=None,
                     context_len=None) -> ChunkSettings:
    """Options given win; the rest come from run.json's config, then from defaults."""
    config = (run or {}).get("config", {})
    if base_chunk_size is None:
        base_chunk_size = config.get("base_chunk_size")
        if base_chunk_size is None:
            raise ValueError(f"--base-chunk-size is required: there is no run.json with config.base_chunk_size "
                             f"beside {samples_path}")
    return ChunkSettings(
        base_chunk_size=base_chunk_size,
        smooth_factor=DEFAULT_SMOOTH_FACTOR if smooth_factor is None else smooth_factor,
        page_size=page_size if page_size is not None else config.get("page_size", 1),
        alignment=alignment or 0,
        min_chunk_size=min_chunk_size or 0,
        max_chunk_size=max_chunk_size or 0,
        context_len=context_len if context_len is not None else config.get("context_len", DEFAULT_CONTEXT_LEN),
    )

"""Every tiny family preset (the models the multirank tests profile or could) as a two-stage pipeline in this
process: a prompt prefilled in chunks through both stages' real pools gives the one-shot logits, and releasing it
(KV slots, then the Mamba slot, then the request entry) brings every pool back to full capacity."""

from __future__ import annotations

import pytest
import torch

from ppprof.model.stage import Stage, build_stage_cache
from ppprof.specs import load_spec
from ppprof.specs.memory import CacheSizes

from .helpers import prefill

TOL = dict(rtol=3e-5, atol=3e-5)


def two_stage_logits(name: str, chunk_sizes: list[int]) -> torch.Tensor:
    spec = load_spec(name)
    half = spec.num_layers // 2
    parts = [range(0, half), range(half, spec.num_layers)]
    stages = [Stage(spec, layers, dtype=torch.float32, seed=0) for layers in parts]
    caches = [
        build_stage_cache(
            spec,
            layers,
            CacheSizes(
                max_total_tokens=256, page_size=4, max_mamba_cache_size=2, max_running_requests=2, context_len=256
            ),
            dtype=torch.float32,
            device="cpu",
        )
        for layers in parts
    ]
    tokens = torch.randint(spec.vocab_size, (sum(chunk_sizes),), generator=torch.Generator().manual_seed(0))
    logits, reqs = prefill(stages, caches, tokens, chunk_sizes)
    for cache, req in zip(caches, reqs):
        assert any(cache.outstanding().values())
        cache.release(req)
        cache.check_no_leaks()
    return logits


@pytest.mark.parametrize("name", ["tiny-dense", "tiny-hybrid", "tiny-mla", "tiny-moe", "tiny-gdn"])
def test_a_tiny_preset_prefills_in_chunks_through_two_stages_as_in_one_shot_and_leaks_nothing(name):
    one = two_stage_logits(name, [72])
    torch.testing.assert_close(two_stage_logits(name, [5, 35, 32]), one, **TOL)

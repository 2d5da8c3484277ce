"""A serving bench's settings through the ranks: pools sized for the most requests a level holds at once at the
longest prompt, refused in one line where that is beyond a pool's bound, and the settings handed to the ranks whole."""

import pytest

from ppprof.config import ProfileConfig
from ppprof.config.workload import Workload
from ppprof.serving.settings import ServeBenchConfig


def config(**given) -> ServeBenchConfig:
    workload = Workload((300, 700), (1.0, 1.0)).to_dict()
    profile = ProfileConfig(page_size=64, base_chunk_size=64, context_len=512, max_running_requests=1)
    settings = dict(policy="p.json", profile=profile, workload=workload, num_prompts=6)
    return ServeBenchConfig(**{**settings, **given})


def test_the_pools_hold_the_largest_level_at_the_longest_prompt():
    serve = config(concurrency=(1, 4)).with_pools()
    pools = serve.profile.pools
    longest = -(-max(serve.prompts) // 64) * 64
    assert max(serve.prompts) == 700 and longest == 704
    assert (pools.max_total_tokens, pools.max_running_requests) == (4 * 704, 4)
    assert pools.max_mamba_cache_size == 128  # the profile's, larger
    assert serve.profile.probes.context_len >= 704


def test_poisson_levels_hold_a_servers_default_entries_at_most_the_prompts():
    assert config(request_rates=(0.5,)).with_pools().profile.pools.max_running_requests == 6


def test_pools_beyond_their_bound_are_refused_naming_the_prompts():
    serve = config(concurrency=(4096,), num_prompts=4096, workload=Workload((2**20,), (1.0,)).to_dict())
    with pytest.raises(ValueError, match=r"^--num-prompts 4096: 4096 requests at once at the longest prompt"):
        serve.with_pools()


def test_the_settings_reach_the_ranks_whole():
    serve = config(concurrency=(1, 2), strategies=("fixed", "policy"), repeats=2).with_pools()
    again = ServeBenchConfig.from_dict(serve.to_dict())
    assert again.to_dict() == serve.to_dict() and again.levels == serve.levels and again.prompts == serve.prompts

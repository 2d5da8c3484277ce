"""A serving bench's settings through the ranks: pools sized for the most requests a level holds at once at the
longest prompt, refused in one line where that is beyond a pool's bound, and the settings handed to the ranks whole."""

import json

import pytest

from ppprof.config import ProfileConfig
from ppprof.config.workload import Workload
from ppprof.serving.serve_config import ServeBenchConfig, TraceReplay


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


def test_a_trace_window_holds_its_requests_at_its_longest_prompt_and_reaches_the_ranks_whole(tmp_path):
    path = tmp_path / "t.jsonl"
    rows = [(0, 600, [1, 2]), (2000, 1200, [1, 2, 3]), (4000, 300, [9])]
    path.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": n, "output_length": 1, "hash_ids": ids}) + "\n"
            for t, n, ids in rows
        )
    )
    trace = TraceReplay(path=str(path), window_s=(0.0, 3.0), length_scale=0.5, context_len=1024, cache_tokens=256)
    serve = config(trace=trace, strategies=("fixed",)).with_pools()
    assert serve.prompts == [300, 600] and serve.levels == []  # the window's two, halved
    pools = serve.profile.pools
    assert (pools.max_total_tokens, pools.max_running_requests) == (2 * 640, 2)  # the longest, a whole page
    again = ServeBenchConfig.from_dict(json.loads(json.dumps(serve.to_dict())))
    assert again.to_dict() == serve.to_dict() and again.trace == trace and again.trace.read().block_tokens == 256
    with pytest.raises(ValueError, match=r"line 2: input_length 1200 .* beyond the policy's context of 1024"):
        config(trace=TraceReplay(path=str(path), context_len=1024)).with_pools()

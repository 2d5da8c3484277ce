"""Request traces replayed (ppprof.traces, ppprof.serving.prefix_cache, ppprof.serving.replay, `serve-bench --simulate
--trace`): the part of a trace taken and scaled, the block cache's hits and evictions, prefills that start at the
cached prefix on the simulated clock, and bench_serving's metric names appended a line a run. Bad traces: the corpus
(tests/corpus/mooncake/)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.policy import load
from ppprof.serving.arms import sizer
from ppprof.serving.prefix_cache import PrefixCache
from ppprof.serving.report import TRACE_FIGURES, trace_cell, trace_largest_miss, trace_measured_text
from ppprof.serving.scheduler import Capacity
from ppprof.serving.simulate import Arrivals, TraceArrivals, serve
from ppprof.traces import read_trace

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "results" / "baseline" / "policy.json"
MOONCAKE = REPO.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"


def write_trace(path: Path, rows) -> Path:
    """rows: (timestamp ms, input_length, hash_ids)."""
    lines = [json.dumps({"timestamp": t, "input_length": n, "output_length": 7, "hash_ids": ids}) for t, n, ids in rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_part_of_the_trace_is_taken_rebased_and_scaled(tmp_path):
    trace = write_trace(
        tmp_path / "t.jsonl", [(1000, 1024, [1, 2]), (3000, 1500, [1, 2, 3]), (5000, 600, [9, 8]), (9000, 512, [4])]
    )
    part = read_trace(trace, window_s=(2.0, 8.0), time_scale=0.5, length_scale=0.25)
    assert [r.line for r in part.requests] == [2, 3]  # the requests 2..8 s after the first
    assert [r.arrival_ms for r in part.requests] == [0.0, 1000.0]  # from the part's first, at half the time
    assert [r.prompt_len for r in part.requests] == [375, 150] and part.block_tokens == 128
    assert part.requests[0].blocks == (1, 2, 3) and part.requests[0].output_len == 7
    first = read_trace(trace, num_prompts=2)
    assert [r.prompt_len for r in first.requests] == [1024, 1500] and first.shared_prefix_tokens() == 1024
    with pytest.raises(ValueError, match=r"line 2: input_length 1500 .* beyond the policy's context of 1200: give "):
        read_trace(trace, context_len=1200)


@pytest.mark.skipif(not MOONCAKE.is_file(), reason="the shared Mooncake trace is not beside this checkout")
def test_the_conversation_trace_reads_whole_with_its_37_percent_of_shared_prefix():
    part = read_trace(MOONCAKE)
    assert len(part.requests) == 12031 and part.to_dict()["span_s"] == pytest.approx(3537, abs=1)
    assert part.shared_prefix_tokens() / part.input_tokens == pytest.approx(0.37, abs=0.01)


def test_the_block_cache_reuses_leading_blocks_holds_what_runs_and_evicts_the_least_recent():
    cache = PrefixCache(capacity_tokens=4 * 100, block_tokens=100)
    assert cache.match((1, 2, 3), 300) == (0, ())
    cache.insert((1, 2, 3))
    assert cache.match((1, 2, 9), 250) == (200, (1, 2))  # the leading run only
    assert cache.match((1, 2, 3), 300)[0] == 299  # a prefill computes at least its last token
    cache.release((1, 2))
    cache.release((1, 2, 3))
    held = cache.match((3,), 500)[1]  # 3 is held from here on
    cache.insert((5, 6))  # full at 4 blocks: 1, the least recently used, goes
    assert list(cache.blocks) == [2, 3, 5, 6] and cache.evicted_blocks == 1
    cache.insert((7, 8, 9, 10, 11, 12))  # longer than the cache: 2, 5, 6 make room, 3 is held
    assert list(cache.blocks) == [3, 7, 8, 9] and 3 in cache.held
    cache.release(held)
    cache.insert((13,))
    assert list(cache.blocks) == [7, 8, 9, 13]
    with pytest.raises(ValueError, match="holds no block"):
        PrefixCache(50, 100)


def test_a_replayed_prefill_starts_at_its_cached_prefix_at_its_arrival_on_the_simulated_clock():
    policy = load(POLICY)
    model = policy.planning_model
    stage_ms = lambda batch: [model.c + sum(model.one_chunk_ms(p.prefix_len, p.size) - model.c for p in batch.pieces)]  # noqa: E731
    prompts, arrivals, blocks = [2048, 3072], [0.0, 60_000.0], [(1, 2, 3, 4), (1, 2, 3, 4, 5, 6)]
    runs = {}
    for name, cache in (("cache", PrefixCache(10**6, 512)), ("cold", None)):
        trace = TraceArrivals(arrivals, blocks, cache)
        runs[name] = serve(1, sizer(policy, "fixed"), stage_ms, Capacity(8192, 4), Arrivals(prompts, trace=trace))
    warm, cold = runs["cache"], runs["cold"]
    assert [r.cached for r in warm.requests] == [0, 2048] and [r.cached for r in cold.requests] == [0, 0]
    second = [b for b, _, _ in warm.batches if b.pieces[0].rid == 1]
    assert second[0].pieces[0].prefix_len == 2048 and sum(r.chunks[0] for r in warm.requests[1:]) == 512
    assert [start for b, start, _ in warm.batches if b.pieces[0].rid == 1][0] == 60_000.0  # it waits for its arrival
    assert warm.requests[1].ttft < cold.requests[1].ttft and warm.requests[0].ttft == cold.requests[0].ttft


def test_serve_bench_replays_a_trace_and_appends_bench_servings_metrics(tmp_path):
    trace = write_trace(
        tmp_path / "t.jsonl", [(i * 400, 1024 + 512 * (i % 3), list(range(2 + i % 3))) for i in range(30)]
    )
    out, lines = tmp_path / "serving.json", tmp_path / "runs.jsonl"
    args = ["serve-bench", str(POLICY), "--simulate", "--trace", str(trace), "--strategies", "fixed,policy-load"]
    args += ["--out", str(out), "--output-file", str(lines)]
    for extra in ([], ["--output-details", "--cache-tokens", "0"]):
        result = CliRunner().invoke(main, args + extra)
        assert result.exit_code == 0, result.output
    assert "simulated trace" in result.output and "30 requests" in result.output
    runs = [json.loads(line) for line in lines.read_text().splitlines()]
    assert [r["arm"] for r in runs] == ["fixed", "policy-load"] * 2
    keys = {"completed", "duration", "request_throughput", "input_throughput", "mean_ttft_ms", "median_ttft_ms"}
    assert keys | {"p90_ttft_ms", "p99_ttft_ms", "prefix_hit_share"} <= set(runs[0])
    assert runs[0]["completed"] == 30 and runs[0]["prefix_hit_share"] > 0.3 and "details" not in runs[0]
    assert runs[2]["prefix_hit_share"] == 0 and runs[2]["mean_ttft_ms"] > runs[0]["mean_ttft_ms"]  # no cache: cold
    assert len(runs[3]["details"]["ttfts_ms"]) == 30 and runs[3]["details"]["cached_lens"] == [0] * 30
    doc = json.loads(out.read_text())
    assert doc["mode"] == "simulated trace" and doc["trace"]["requests"] == 30


def test_a_replayed_arm_through_the_ranks_is_the_median_of_its_repeats_beside_its_simulation():
    def run(scale, **extra):
        figures = dict.fromkeys(TRACE_FIGURES, 100.0 * scale) | {"prefix_hit_share": 0.25, "chunks_per_request": 2.0}
        return figures | {"arm": "fixed", "duration": 4.0 / scale, "completed": 3, **extra}

    repeats = [run(1.0), run(0.8), run(1.3)]
    cell = trace_cell(repeats, run(0.5, details={"ttfts_ms": [1.0]}))
    assert cell["measured"]["mean_ttft_ms"] == 100.0 and cell["measured"]["duration"] == 4.0
    assert cell["vs_simulated"]["p99_ttft_ms"] == pytest.approx(1.0) and "details" not in cell["simulated"]
    runs = [cell]
    text = trace_measured_text(
        {"trace": read_trace(REPO / "tests" / "data" / "mooncake-head.jsonl", num_prompts=3).to_dict(), "pp_size": 2,
         "async_depth": 0, "repeats": 3, "runs": runs, "largest_miss": trace_largest_miss(runs)}
    )  # fmt: skip
    lines = text.splitlines()
    assert lines[0].startswith("measured trace") and "median of 3 repeats" in lines[0]
    assert lines[2].split()[:2] == ["fixed", "measured"] and lines[3].split()[0] == "simulated"
    assert lines[4].split()[:3] == ["vs", "sim", "+100.0%"] and lines[-1].startswith("largest miss: 100.0%")

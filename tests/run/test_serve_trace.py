"""`ppprof serve-bench --trace` through real gloo ranks (no --simulate), one launch: a window of Mooncake's trace head
(tests/data/mooncake-head.jsonl, lengths x 0.04 for the tiny policy's context, time x 0.2) replayed under two arms;
requests 10-13 arrive 600 ms after the first ten and find the shared first block cached. Checked: hits occur, every
hit's prefill starts at its cached prefix on every stage (serving.csv's pieces), the pools are back to full capacity
after every run, and the bench_serving lines carry the measured figures. Timings are never asserted. The input checks,
which start no rank, are in tests/corpus/cases.txt."""

import json
from collections import defaultdict

import pandas as pd
import pytest

from tests.multirank import REPO, TINY_RUN, run_cli

pytestmark = pytest.mark.multirank
TRACE = REPO / "tests" / "data" / "mooncake-head.jsonl"
ARMS = ("fixed", "policy-load")


def pieces_by_request(rows: pd.DataFrame) -> dict[int, list[tuple[int, int]]]:
    """{rid: [(prefix_len, size) of each chunk, in batch order]} of one stage's rows."""
    out = defaultdict(list)
    for batch in rows.sort_values("batch").requests:
        for piece in batch.split():
            rid, rest = piece.split(":")
            prefix, size = (int(v) for v in rest.split("+"))
            out[int(rid)].append((prefix, size))
    return out


def test_serve_bench_replays_a_trace_window_with_cached_prefixes_through_the_real_pipeline(tmp_path):
    out, lines = tmp_path / "serve" / "serving.json", tmp_path / "runs.jsonl"
    r = run_cli(
        "serve-bench", str(TINY_RUN / "policy.json"), "--trace", str(TRACE), "--num-prompts", "14",
        "--length-scale", "0.04", "--time-scale", "0.2", "--strategies", ",".join(ARMS), "--repeats", "1",
        "--out", str(out), "--output-file", str(lines), "--output-details", "--verbose",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "measured trace" in r.stderr and "vs sim" in r.stderr
    doc = json.loads(out.read_text())
    assert doc["mode"] == "measured trace" and doc["trace"]["requests"] == 14 and doc["trace"]["block_tokens"] == 20
    assert [c["arm"] for c in doc["runs"]] == list(ARMS)
    for cell in doc["runs"]:
        assert cell["measured"]["input_throughput"] > 0 and cell["simulated"]["completed"] == 14
        assert set(cell["vs_simulated"]) >= {"request_throughput", "mean_ttft_ms", "p90_ttft_ms", "p99_ttft_ms"}
    runs = [json.loads(line) for line in lines.read_text().splitlines()]
    assert [(x["arm"], x["backend"], x["completed"]) for x in runs] == [(a, "ppprof", 14) for a in ARMS]
    rows = pd.read_csv(out.with_name("serving.csv"))
    rows = rows[rows.level == "trace"]
    for run in runs:
        d = run["details"]
        cached = dict(enumerate(d["cached_lens"]))
        assert run["prefix_hit_share"] > 0 and {c for c in cached.values() if c} == {20}, cached  # one block
        for stage in (0, 1):
            chunks = pieces_by_request(rows[(rows.arm == run["arm"]) & (rows.stage == stage)])
            for rid, pieces in chunks.items():
                assert pieces[0][0] == cached[rid], f"{run['arm']} stage {stage}: request {rid} starts at {pieces[0]}"
                assert all(p + n == q for (p, n), (q, _) in zip(pieces, pieces[1:])), (rid, pieces)
                assert pieces[-1][0] + pieces[-1][1] == d["input_lens"][rid], (rid, pieces)
            assert set(chunks) == set(range(14))
    full = [line for line in r.stderr.splitlines() if "pools back to full capacity" in line]
    assert len(full) == 2 * (1 + len(ARMS)), r.stderr[-2000:]  # --verbose: both ranks, the warm-up and every run

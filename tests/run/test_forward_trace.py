"""`--forward-trace` on real gloo ranks: serve-bench and bench write one forward trace from every stage (each
rank's part joined into one file, the parts removed), holding every forward serving.csv / bench.csv recorded, with
its time; `ppprof calibrate` refits the committed tiny policy from it. Timings are never asserted."""

import hashlib
from collections import Counter

import pandas as pd
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.forwards import read_forwards
from ppprof.policy import load
from tests.multirank import TINY_RUN, run_cli

pytestmark = pytest.mark.multirank


def pieces_of(requests: str) -> tuple:
    """serving.csv's `requests` ("rid:prefix+size ...") as the trace's pieces."""
    out = []
    for piece in requests.split():
        prefix, size = piece.split(":")[1].split("+")
        out.append((int(prefix), int(size)))
    return tuple(out)


def serve(out, trace):
    """serve-bench on the committed tiny policy, two arms at two levels (packed batches at concurrency 3)."""
    return run_cli(
        "serve-bench", str(TINY_RUN / "policy.json"), "--concurrency", "1,3", "--num-prompts", "6",
        "--prompt-lens", "300,700,1500", "--repeats", "1", "--strategies", "fixed,policy-load", "--out", str(out),
        "--forward-trace", str(trace),
    )  # fmt: skip


def test_serve_bench_writes_every_stages_forwards_and_calibrate_refits_from_them(tmp_path):
    out, trace = tmp_path / "serving.json", tmp_path / "trace.jsonl"
    r = serve(out, trace)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not list(out.parent.glob("trace.jsonl.rank*")), "the ranks' parts were not removed"
    got = read_forwards([trace])
    assert got.header["server"] == "ppprof serve-bench" and got.header["pp_size"] == 2
    assert got.header["model_shape"]["model_type"] == "nemotron_h"
    assert len(got.files) == 1 and got.dropped_by_writer == 0
    rows = pd.read_csv(out.with_name("serving.csv"))
    csv = Counter((int(s), pieces_of(q)) for s, q in zip(rows.stage, rows.requests))
    traced = Counter(zip(got.stage, got.pieces))
    assert not csv - traced, f"forwards of serving.csv missing from the trace: {csv - traced}"
    assert sum(traced.values()) > sum(csv.values()), "the warm-up level's forwards are not in the trace"
    assert set(got.stage) == {0, 1} and max(len(p) for p in got.pieces) > 1, "no packed batch traced"
    by_key = {}
    for s, p, ms in zip(got.stage, got.pieces, got.latency_ms):
        by_key.setdefault((s, p), []).append(ms)
    for s, q, ms in zip(rows.stage, rows.requests, rows.compute_ms):
        assert min(abs(ms - t) for t in by_key[(int(s), pieces_of(q))]) < 1e-3, f"{s=} {q=} {ms=}"
    calibrated = tmp_path / "calibrated.json"
    r = CliRunner().invoke(main, ["calibrate", str(TINY_RUN / "policy.json"), str(trace), "-o", str(calibrated)])
    assert r.exit_code == 0, r.output
    live = load(calibrated).data["provenance"]["live"]
    assert live["traces"][0]["sha256"] == hashlib.sha256(trace.read_bytes()).hexdigest()
    assert live["forwards_read"] == len(got) and live["forwards_used"]["single"] > 0


def test_bench_writes_every_chunks_forward_on_every_stage(tmp_path):
    out, trace = tmp_path / "bench", tmp_path / "trace.jsonl"
    r = run_cli(
        "bench", str(TINY_RUN / "policy.json"), "--prompt-len", "600", "--strategies", "fixed,policy",
        "--repeats", "1", "--out", str(out), "--forward-trace", str(trace),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    got = read_forwards([trace])
    assert got.header["server"] == "ppprof bench"
    rows = pd.read_csv(out / "bench.csv")
    csv = Counter((int(s), ((int(p), int(x)),)) for s, p, x in zip(rows.stage, rows.prefix_len, rows.chunk_size))
    traced = Counter(zip(got.stage, got.pieces))
    assert not csv - traced and set(got.stage) == {0, 1}, f"{csv - traced=}"

"""`--forward-trace` on real gloo ranks: serve-bench and bench write one forward trace from every stage (each
rank's part joined into one file, the parts removed), holding every forward serving.csv / bench.csv recorded, with
its time; `ppprof calibrate` refits the committed tiny policy from it. In the same serve-bench run the policy file is
replaced twice while it serves: a corrupted copy is refused and the old policy kept, a calibrated policy is taken by
every rank at the same batch. Timings are never asserted."""

import hashlib
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
from collections import Counter

import pandas as pd
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.forwards import read_forwards
from ppprof.policy import load
from ppprof.policy.reload import CHECK_ENV
from ppprof.serving.arms import sizer
from ppprof.serving.scheduler import Load
from tests.multirank import REPO, TIMEOUT_S, TINY_RUN, run_cli

pytestmark = pytest.mark.multirank


def pieces_of(requests: str) -> tuple:
    """serving.csv's `requests` ("rid:prefix+size ...") as the trace's pieces."""
    out = []
    for piece in requests.split():
        prefix, size = piece.split(":")[1].split("+")
        out.append((int(prefix), int(size)))
    return tuple(out)


def serve_and_reload(tmp_path, out, trace, policy):
    """serve-bench on a copy of the committed tiny policy, two arms at two levels (packed batches at concurrency 3),
    three times; while it serves, the policy file is replaced by a corrupted copy (refused), then by the committed tiny
    trace's calibration (taken), each once the ranks said what they did with the one before. Returns (the return
    code, stderr, the corrupted file's and the new policy's text)."""
    env = {**os.environ, "PPPROF_DIST_TIMEOUT": "120", "PYTHONUNBUFFERED": "1", CHECK_ENV: "0"}
    cmd = [
        sys.executable, "-m", "ppprof", "serve-bench", str(policy), "--concurrency", "1,3", "--num-prompts", "6",
        "--prompt-lens", "300,700,1500", "--repeats", "3", "--strategies", "fixed,policy-load", "--out", str(out),
        "--forward-trace", str(trace), "--verbose",
    ]  # fmt: skip
    good = (TINY_RUN / "calibrated.json").read_text()  # the committed trace's calibration (tests/runs/README.md)
    corrupted = policy.read_text()[:-200]  # cut mid-write
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env, cwd=REPO)
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True)
    reader.start()

    def wait_for(text: str) -> None:
        while not any(text in line for line in seen):
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                assert proc.poll() is None, f"serve-bench ended before {text!r}: " + "".join(seen)[-3000:]

    try:
        wait_for("warm-up, fixed, repeat -1: pools back to full capacity")
        replace(policy, corrupted)
        wait_for("refused, the policy in use")
        replace(policy, good)
        wait_for("taken by every rank")
        proc.wait(TIMEOUT_S)
    finally:
        proc.kill()
    reader.join(TIMEOUT_S)
    while not lines.empty():
        seen.append(lines.get_nowait())
    return proc.returncode, "".join(seen), corrupted, good


def replace(path, text: str) -> None:
    """`path` replaced in one rename, as an operator would install a new policy."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_serve_bench_traces_every_stage_reloads_its_policy_mid_run_and_calibrate_refits(tmp_path):
    out, trace, policy = tmp_path / "serving.json", tmp_path / "trace.jsonl", tmp_path / "policy.json"
    for name in ("policy.json", "run.json"):
        shutil.copy(TINY_RUN / name, tmp_path / name)
    old = sha(policy.read_text())
    rc, stderr, corrupted, good = serve_and_reload(tmp_path, out, trace, policy)
    assert rc == 0, stderr[-3000:]
    # the reloads: the corrupted file refused on every rank (the old policy kept), the good one taken by every
    # rank at the same batch, every stage serving each batch under the same policy
    doc = json.loads(out.read_text())
    refuse, switch = doc["reloads"]
    assert refuse["action"] == "refuse" and refuse["sha256"] == sha(corrupted)
    assert "is not readable JSON" in refuse["line"], refuse
    assert switch["action"] == "switch" and switch["sha256"] == sha(good)
    at = switch["batches_by_rank"]
    assert len(at) == 2 and at[0] == at[1], f"the ranks switched at different batches: {at}"
    rows = pd.read_csv(out.with_name("serving.csv"), dtype={"policy_sha256": str})
    per_batch = rows.groupby(["level", "arm", "repeat", "batch"]).policy_sha256.nunique()
    assert per_batch.max() == 1, "two stages served one batch under different policies"
    for stage, g in rows.groupby("stage"):
        shas = list(dict.fromkeys(g.policy_sha256))  # in the order served
        assert shas == [old[:12], sha(good)[:12]], f"{stage=} {shas=}"
        assert int((g.policy_sha256 == old[:12]).sum()) == at[0], f"{stage=}: not switched at batch {at[0]}"
    new = load(policy)
    alone = rows[(rows.stage == 0) & (rows.level == "concurrency-1") & (rows.policy_sha256 == sha(good)[:12])]
    assert len(alone), "no cell at concurrency 1 served after the switch"
    size = sizer(new, "policy-load")
    lens = doc["prompt_lens"]
    for arm, g in alone.groupby("arm"):
        for piece in g.requests:
            rid, rest = piece.split(":")
            prefix, got = (int(v) for v in rest.split("+"))
            want = min(size(prefix, lens[int(rid)], Load(0, 0, 0)) if arm != "fixed" else 256, lens[int(rid)] - prefix)
            assert got == want, f"{arm}: request {rid} at {prefix}: {got} tokens, the new policy says {want}"
    # the trace: every stage's forwards, those of serving.csv among them, with their times
    assert not list(out.parent.glob("trace.jsonl.rank*")), "the ranks' parts were not removed"
    got = read_forwards([trace])
    assert got.header["server"] == "ppprof serve-bench" and got.header["pp_size"] == 2
    assert got.header["model_shape"]["model_type"] == "nemotron_h"
    assert len(got.files) == 1 and got.dropped_by_writer == 0
    csv = Counter((int(s), pieces_of(q)) for s, q in zip(rows.stage, rows.requests))
    traced = Counter(zip(got.stage, got.pieces))
    assert not csv - traced, f"forwards of serving.csv missing from the trace: {csv - traced}"
    assert set(got.stage) == {0, 1} and max(len(p) for p in got.pieces) > 1, "no packed batch traced"
    by_key = {}
    for s, p, ms in zip(got.stage, got.pieces, got.latency_ms):
        by_key.setdefault((s, p), []).append(ms)
    for s, q, ms in zip(rows.stage, rows.requests, rows.compute_ms):
        assert min(abs(ms - t) for t in by_key[(int(s), pieces_of(q))]) < 1e-3, f"{s=} {q=} {ms=}"
    # calibrate refits the policy from the trace just written
    calibrated = tmp_path / "calibrated.json"
    r = CliRunner().invoke(main, ["calibrate", str(TINY_RUN / "policy.json"), str(trace), "-o", str(calibrated)])
    assert r.exit_code == 0, r.output
    live = load(calibrated).report.provenance["live"]
    assert live["traces"][0]["sha256"] == hashlib.sha256(trace.read_bytes()).hexdigest()
    assert live["forwards_read"] == len(got) and live["forwards_used"]["single"] > 0


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


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

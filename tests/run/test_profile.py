"""Real gloo ranks in subprocesses, each run bounded by a timeout: a hang fails the test."""

import fcntl
import json
import math
import os
import pty
import re
import struct
import subprocess
import sys
import termios

import numpy as np
import pandas as pd
import pytest

from ppprof.fit.build import PROFILE_LATENCY_MODEL, fit
from ppprof.policy.timeline import replay
from tests.multirank import REPO, TIMEOUT_S, TINY, free_port, run_cli

pytestmark = pytest.mark.multirank


def read_run(out):
    return pd.read_csv(out / "samples.csv"), json.loads((out / "run.json").read_text())


def test_profile_with_a_mamba_cache_much_smaller_than_the_requests_completes(tmp_path):
    out = tmp_path / "run"
    r = run_cli(
        "profile",
        "--out",
        str(out),
        "--model",
        "tiny-hybrid",
        "--max-mamba-cache-size",
        "8",
        "--requests-per-probe",
        "128",
        "--base-chunk-size",
        "32",
        "--prefix-lens",
        "32",
        "--warmup",
        "1",
        "--no-fit",
        "--design",
        "grid",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    samples, run = read_run(out)
    assert len(samples) == 128 + 16 + 128  # the sweep, the wide probe (128 / 8), the prefix probe
    assert set(samples["probe"]) == {0, 1, 2}
    assert samples["chunk_size"].max() == 128  # 4 B
    assert samples[["stage0_latency_ms", "stage1_latency_ms", "latency_ms"]].gt(0).all().all()
    # the end-to-end time covers both stages
    assert (samples["latency_ms"] >= samples[["stage0_latency_ms", "stage1_latency_ms"]].sum(axis=1) * 0.99).all()
    assert run["world_size"] == 2 and run["dist_backend"] == "gloo"
    assert run["layer_partition"] == [4, 4]
    assert run["config"]["max_mamba_cache_size"] == 8
    # one sweep-shaped warm-up request of 1.25 x 32, then each other probe's largest chunk (4 x 32) at its prefix
    assert run["warmup_tokens"] == 40 + 128 + 128 and run["warmup_requests"] == 3
    assert run["forward_tokens"] == samples["chunk_size"].sum() + 296
    assert "pools back to full capacity" in (out / "rank1.log").read_text()
    check_pipeline_overhead(run, out, pp_size=2, repeats=3)
    check_packed_forwards(samples, run, out, max_pieces=8)  # the Mamba pool (8 slots) holds at most 8 pieces
    manifest = json.loads((out / "manifest.json").read_text())  # written by the command, as every result's is
    assert manifest["recorded"] == "by the command" and "profile --out" in manifest["command"], manifest
    assert manifest["git_revision"] and manifest["cpu_count"] >= 1 and manifest["date"]


def check_pipeline_overhead(run: dict, out, pp_size: int, repeats: int) -> None:
    """run.json's pipeline_overhead: fixed plans at B/4, B and 2B (here 8, 32, 64), `repeats` runs of each within
    the KV pool (the longest probe request, 32 + 128 tokens), each solved against the replay of its stages."""
    o = run["pipeline_overhead"]
    assert o["num_stages"] == pp_size and o["method"]
    runs = o["runs"]
    assert sorted({x["chunk_size"] for x in runs}) == [8, 32, 64] and list(o["by_chunk_size"]) == ["8", "32", "64"]
    # the B/4 plan after as many chunks of B as the pool holds beside it (3 of 32 beside 8 x 8)
    assert {x["chunk_size"]: x["num_chunks"] for x in runs} == {8: 3 + 8, 32: 5, 64: 2}
    assert all(x["chunk_sizes"] == [32] * 3 + [8] * 8 for x in runs if x["chunk_size"] == 8)
    assert sorted((x["chunk_size"], x["repeat"]) for x in runs) == sorted(
        (c, r) for c in (8, 32, 64) for r in range(repeats)
    )
    for x in runs:
        assert 0 < x["replay_ms"] and 0 < x["measured_ms"], f"{x=}"
        want = (x["measured_ms"] - x["replay_ms"]) / (x["num_chunks"] + pp_size - 1)
        assert abs(x["ms_per_chunk"] - want) < 1e-3, f"{x=}"
        # every stage's forward of every chunk, which the replay composes (and the fit's calibration reads)
        stage_ms = np.array(x["stage_ms"])
        assert stage_ms.shape == (pp_size, x["num_chunks"]) and (stage_ms > 0).all(), f"{x=}"
        assert replay(stage_ms)[1][-1, -1] == pytest.approx(x["replay_ms"], abs=1e-3)
    # a pipeline step costs something beyond the forwards (transfers, the done message); never far below zero
    assert math.isfinite(o["ms_per_chunk"]) and o["ms_per_chunk"] > -1.0, f"{o=}"
    assert math.isfinite(o["stderr_ms"]) and o["stderr_ms"] >= 0
    assert run["overhead_wall_s"] > 0
    for rank in range(pp_size):
        assert "leak" not in (out / f"rank{rank}.log").read_text()
    assert "pipeline overhead: " in (out / "rank0.log").read_text()


def check_packed_forwards(samples, run: dict, out, max_pieces: int) -> None:
    """packed.csv: the default 28 packed forwards, 2 to `max_pieces` pieces, each within the largest probe chunk's
    tokens, every piece at a prefix and chunk size the probes ran, every stage timed; the pools full after
    (logged, no leak: check_pipeline_overhead reads the logs)."""
    packed = pd.read_csv(out / "packed.csv", dtype={"prefix_lens": str, "chunk_sizes": str})
    assert len(packed) == run["config"]["packed_forwards"] == 28 and run["packed_wall_s"] > 0
    assert packed["pieces"].min() == 2 and packed["pieces"].max() == max_pieces
    lens = [[int(v) for v in f.split()] for f in packed["prefix_lens"]]
    sizes = [[int(v) for v in f.split()] for f in packed["chunk_sizes"]]
    assert [len(x) for x in sizes] == [len(p) for p in lens] == list(packed["pieces"])
    assert list(packed["tokens"]) == [sum(x) for x in sizes] and packed["tokens"].max() <= 128  # 4 B
    assert {v for p in lens for v in p} <= set(samples["prefix_len"]) | {0}
    assert {v for x in sizes for v in x} <= set(samples["chunk_size"])
    assert packed[["stage0_latency_ms", "stage1_latency_ms"]].gt(0).all().all()
    assert f"28 packed forwards of 2-{max_pieces} pieces timed in " in (out / "rank0.log").read_text()


def test_a_release_that_skips_the_mamba_slot_stops_every_rank_naming_rank_pool_and_count(tmp_path):
    out = tmp_path / "run"
    r = run_cli("profile", "--out", str(out), *TINY, "--inject-fault", "skip-mamba-release")
    assert r.returncode == 1, r.stderr[-3000:]
    for rank in (0, 1):  # one warm-up request like the sweep's, one for each other probe (wide, 2 prefix)
        assert (
            f"error: [rank {rank}] leak check failed after the warm-up: rank 0: mamba pool leaked 4 slots; "
            "rank 1: mamba pool leaked 4 slots" in r.stderr
        )
    assert not (out / "samples.csv").exists()


def test_leaked_mamba_slots_are_named_when_the_pool_runs_dry_before_the_leak_check(tmp_path):
    out = tmp_path / "run"
    r = run_cli(
        "profile",
        "--out",
        str(out),
        "--base-chunk-size",
        "32",
        "--requests-per-probe",
        "16",
        "--warmup",
        "0",
        "--prefix-lens",
        "32",
        "--max-mamba-cache-size",
        "8",
        "--no-fit",
        "--design",
        "grid",
        "--inject-fault",
        "skip-mamba-release",
    )
    assert r.returncode == 1, r.stderr[-3000:]
    msg = (
        "rank 0: setup of request 8 failed: request 8 cannot be admitted although no request is live: mamba pool "
        "leaked 8 slots; rank 1: setup of request 8 failed"
    )
    for rank in (0, 1):
        assert f"error: [rank {rank}] {msg}" in r.stderr, r.stderr[-3000:]


def test_a_forward_that_raises_stops_every_rank_and_leaks_nothing(tmp_path):
    out = tmp_path / "run"
    r = run_cli("profile", "--out", str(out), *TINY, "--inject-fault", "raise-in-forward")
    assert r.returncode == 1, r.stderr[-3000:]
    msg = "rank 1: forward of request 2 (prefix 0, chunk 28) raised RuntimeError: injected fault"
    for rank in (0, 1):
        assert f"error: [rank {rank}] {msg}" in r.stderr, r.stderr[-3000:]
    assert "leak" not in r.stderr
    assert not (out / "samples.csv").exists()


def test_two_launches_with_nnodes_2_form_one_two_stage_pipeline(tmp_path):
    import subprocess

    from tests.multirank import REPO

    out = tmp_path / "run"
    port = free_port()
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "ppprof",
                "profile",
                "--nnodes",
                "2",
                "--node-rank",
                str(node),
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "ppprof-test",
                "--out",
                str(out),
                *TINY,
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # two "nodes" on one machine: each launcher would give its one rank every core (2 threads each on 2
            # cores, and the 28 packed forwards took 13 s instead of 0.5 s)
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for node in (0, 1)
    ]
    try:
        logs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(logs)[-3000:]
    samples, run = read_run(out)
    assert run["world_size"] == 2
    assert samples["stage1_latency_ms"].gt(0).all()


READS_LOGGED = r"""
import os
import sys

_names = ("samples.csv", "run.json", "packed.csv")
_log = os.open(os.environ["PPPROF_TEST_READS"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def _hook(event, args):
    if event != "open" or not args or not isinstance(args[0], (str, bytes, os.PathLike)):
        return
    path = os.fsdecode(args[0])
    if os.path.basename(path) not in _names:
        return
    mode, flags = args[1], args[2]
    if mode is None:  # os.open: its flags say
        read = flags & os.O_ACCMODE != os.O_WRONLY
    else:
        read = "r" in mode or "+" in mode
    if read:
        os.write(_log, f"{os.getpid()} {path} {mode} {flags}\n".encode())


sys.addaudithook(_hook)
"""
"""A sitecustomize.py that logs every opening of samples.csv, run.json or packed.csv for reading (an `open` audit
event, PEP 578: the builtin open, io.open, Path.read_bytes and os.open all raise it) to the file
$PPPROF_TEST_READS, one line a read: pid, path, mode, flags."""


def test_adaptive_design_chooses_probes_on_rank_0_and_every_rank_runs_them_without_a_leak(tmp_path):
    """... and hands the samples to the design and the fit in memory: no process of the run (the launcher, either
    rank) opens samples.csv, run.json or packed.csv for reading, though rank 0 appends samples.csv after every probe,
    the design chooses after every probe, and the fit reads all three. Counted from outside the code under test: a
    sitecustomize.py on the PYTHONPATH of the run (the launcher passes its environment to the ranks, and Python
    imports sitecustomize at start-up in every process) installs an audit hook (sys.addaudithook) that logs each
    `open` event of those names in a read mode to a file this test reads afterwards. The policy fitted in memory is
    the one `ppprof fit` writes from the files (but for its creation time)."""
    out = tmp_path / "run"
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(READS_LOGGED)
    reads = tmp_path / "reads.log"
    path = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    r = run_cli(
        "profile",
        "--out",
        str(out),
        "--model",
        "tiny-hybrid",
        "--base-chunk-size",
        "64",
        "--prefix-lens",
        "64,128,256",
        "--context-len",
        "1024",
        "--warmup",
        "1",
        "--design",
        "adaptive",
        "--max-requests",
        "40",
        "--requests-per-probe",
        "16",
        "--max-mamba-cache-size",
        "8",
        env={"PYTHONPATH": path, "PPPROF_TEST_READS": str(reads)},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert reads.is_file(), "the hook ran in no process"
    assert reads.read_text() == "", f"files read back within the run (pid, path, mode, flags):\n{reads.read_text()}"
    samples, run = read_run(out)
    design = run["design"]
    assert design["design"] == "adaptive"
    assert design["stopping_reason"] in ("stable", "max-requests")
    assert design["requests"] == len(samples) == run["timed_requests"] <= 40
    steps = sorted(samples["design_step"].unique())
    assert steps == list(range(design["steps"])) and design["steps"] == samples["probe"].nunique()
    assert samples.groupby("probe")["design_step"].nunique().eq(1).all()
    assert samples.groupby("probe").size().le(16).all()  # --requests-per-probe bounds every batch
    assert samples["request"].is_unique
    assert set(samples.prefix_len) <= {0, 64, 128, 256}  # the candidate grid: prefix 0 and --prefix-lens ...
    # ... x 1.25 B down to B / 8 and the wide sizes up to 4 B
    assert set(samples.chunk_size) <= {256, 174, 118, 80, 73, 67, 60, 54, 47, 41, 34, 28, 21, 15, 8}
    u = design["uncertainty"]
    assert len(u["table"]["within_one_unit"]) == len(u["table"]["prefix_len"])
    assert len(design["history"]) == design["steps"]
    for rank in (0, 1):  # every probe's leak check passed on every rank, the design's probes included
        log = (out / f"rank{rank}.log").read_text()
        assert log.count("pools back to full capacity") == design["steps"], log[-2000:]
    policy = json.loads((out / "policy.json").read_text())
    assert policy["report"]["design"] == design
    # The stability verdict is about the policy's own fit: its model, with its coefficients, on the same rows.
    model = policy["latency_model"]
    assert u["model"] == model["name"], f"{u['model']=} {model['name']=}"
    assert {k: c["value"] for k, c in u["coefficients"].items()} == {
        k: c["value"] for k, c in model["coefficients"].items()
    }
    assert_one_voice_and_a_summary(r, out)
    assert (out / "packed.csv").is_file()  # the fit scored its packed forwards, held in memory too
    refit = fit(out / "samples.csv", tmp_path / "refit.json", PROFILE_LATENCY_MODEL)[1]
    assert undated(policy) == undated(refit)


def undated(policy: dict) -> dict:
    """A policy document less its fit's time (provenance.created_at)."""
    report = policy["report"]
    return policy | {"report": report | {"provenance": report["provenance"] | {"created_at": None}}}


LOG_LINE = re.compile(r"^\[rank (\d+)\] \d\d:\d\d:\d\d (\w+) (.*)$")


def assert_one_voice_and_a_summary(r, out) -> None:
    """A piped run's console: rank 0 logs the run's events once, rank 1 only its own stage line (its full log is in
    its file); no progress bar; the last lines are the summary, with the run's real paths."""
    said = [m.groups() for m in map(LOG_LINE.match, r.stderr.splitlines()) if m]
    by_rank = {rank: [text for rk, _, text in said if rk == rank] for rank in ("0", "1")}
    assert by_rank["0"] and len(by_rank["1"]) == 1 and by_rank["1"][0].startswith("stage 1/2: "), r.stderr[-3000:]
    assert not set(by_rank["0"]) & set(by_rank["1"]), "no event printed by both ranks"
    assert "design step 0: " in r.stderr and r.stderr.count("design step 0: ") == 1
    assert "design step 0: " in (out / "rank1.log").read_text()  # every rank's file keeps its every line
    assert "%|" not in r.stderr and "req/s" not in r.stderr, "no progress bar where stderr is not a terminal"
    lines = r.stdout.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("profile done: "))
    summary = "\n".join(lines[start:])
    assert "  decision: " in summary and "  files: " in summary and "policy.json" in summary, summary
    assert f"    ppprof bench {out}/policy.json --prompt-len " in summary, summary


def test_a_profile_on_a_terminal_draws_rank_0s_progress_bar(tmp_path):
    """Under a pseudo-terminal the profile's bar shows: requests probed against the budget, elapsed / remaining."""
    out = tmp_path / "run"
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))  # a terminal has a size
    env = {**os.environ, "PPPROF_DIST_TIMEOUT": "120", "COLUMNS": "160"}
    cmd = [sys.executable, "-m", "ppprof", "profile", "--out", str(out), *TINY]
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=secondary, stderr=secondary, env=env, cwd=REPO)
    os.close(secondary)
    chunks = []
    while True:
        try:
            data = os.read(primary, 65536)
        except OSError:  # EIO: every writer closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(primary)
    assert proc.wait(timeout=TIMEOUT_S) == 0
    text = b"".join(chunks).decode(errors="replace")
    assert re.search(r"profile: +\d+%\|.*\| *\d+/\d+ \[\d\d:\d\d<\d\d:\d\d", text), text[-3000:]
    assert "Traceback" not in text

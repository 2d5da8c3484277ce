"""Faults of a real profile (gloo ranks in subprocesses, a small --timeout so that each test takes seconds): a stopped
rank ends the run within the deadline, a killed launcher leaves no rank, SIGINT / SIGTERM keep the samples so far in
a resumable folder, and --resume gives the probes of an uninterrupted run. The run folder is never clobbered."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from ppprof.adaptive.stop import MIN_STEPS
from ppprof.cli import main
from ppprof.distributed.watchdog import REQUEST_FACTOR
from ppprof.probe.synth import make_probes
from ppprof.run.resolve import resolve_config
from ppprof.runfiles import LOCK_FILE
from tests.multirank import REPO, TINY, run_cli

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]

TIMEOUT_S = 3
# Nine probes of 32 requests on the 4-layer tiny-dense model: long enough to stop a rank in the middle.
LONG = (
    "--model",
    "tiny-dense",
    "--base-chunk-size",
    "32",
    "--requests-per-probe",
    "32",
    "--prefix-lens",
    "32,64,96,128,160,192,224,256",
    "--warmup",
    "1",
    "--no-fit",
    "--design",
    "grid",
    "--seed",
    "5",
)
LONG_SETTINGS = {
    "model": "tiny-dense",
    "base_chunk_size": 32,
    "requests_per_probe": 32,
    "prefix_lens": "32,64,96,128,160,192,224,256",
    "warmup": 1,
    "fit": False,
    "design": "grid",
    "seed": 5,
}
"""LONG as the settings of a job (ppprof.run.resolve.resolve_config)."""
PROBE_COLUMNS = ["probe", "kind", "request", "prefix_len", "chunk_size"]


def design_rows(settings: dict) -> pd.DataFrame:
    """The PROBE_COLUMNS of every timed request the grid design of `settings` runs, in order."""
    probes = make_probes(resolve_config(None, settings))
    return pd.DataFrame(
        [(p.index, p.kind, r.rid, r.prefix_len, r.chunk_size) for p in probes for r in p.requests],
        columns=PROBE_COLUMNS,
    )


def start(*args: str, launcher=None) -> subprocess.Popen:
    cmd = (launcher or [sys.executable, "-m", "ppprof"]) + list(args)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)


def read_until(p: subprocess.Popen, text: str, rank: int | None = None) -> list[str]:
    """stderr lines of `p` up to the first that holds `text` (logged by `rank`, where given)."""
    lines = []
    for line in p.stderr:
        lines.append(line)
        if text in line and (rank is None or line.startswith(f"[rank {rank}]")):
            return lines
    raise AssertionError(f"{text!r} never came:\n" + "".join(lines[-30:]))


def interrupt(args: tuple[str, ...], text: str, after_s: float = 0.0) -> tuple[int, str]:
    """`ppprof profile ARGS`, sent SIGINT `after_s` seconds after rank 0 logs `text`: (its exit code, the stderr
    left after that line)."""
    p = start("profile", *args)
    try:
        read_until(p, text, rank=0)
        time.sleep(after_s)
        p.send_signal(signal.SIGINT)
        rest = p.stderr.read()
        p.wait(timeout=60)
    finally:
        p.kill()
    return p.returncode, rest


def resume(out: Path, *flags: str) -> dict:
    """`ppprof profile --resume out` with `flags`, run to its end (exit 0); its run.json."""
    r = run_cli("profile", "--resume", str(out), *flags, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads((out / "run.json").read_text())


def descendants(pid: int) -> list[int]:
    children = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                children.setdefault(int((d / "stat").read_text().rsplit(")", 1)[1].split()[1]), []).append(int(d.name))
            except (OSError, IndexError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def rank_pids(launcher_pid: int) -> dict[int, int]:
    """{rank: pid} of the ranks below the launcher (from their environment)."""
    out = {}
    for pid in descendants(launcher_pid):
        try:
            env = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
        except OSError:
            continue
        if b"RANK" in env and b"TORCHELASTIC_RUN_ID" in env:
            out[int(env[b"RANK"])] = pid
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def stop_rank(p: subprocess.Popen, pid: int) -> tuple[str, float]:
    """SIGSTOP the rank `pid` of the run `p`, then read p's stderr to its end: (what it said, seconds from the stop
    to p's exit)."""
    os.kill(pid, signal.SIGSTOP)
    stopped = time.monotonic()
    rest = p.stderr.read()
    p.wait(timeout=120)
    return rest, time.monotonic() - stopped


def deadline_line(rest: str, timeout_s: float) -> tuple[str, float]:
    """Rank 0's line naming rank 1 as the one that did not answer in the probes, and the deadline it names: the
    larger of --timeout and 20 x the slowest request measured so far (ppprof.distributed.watchdog.REQUEST_FACTOR), so
    more than `timeout_s` where a probe's request took over timeout_s / 20 (a slow or busy host)."""
    found = re.search(r"error: \[rank 0\] (rank 1 did not answer within ([0-9.]+) s during run the probes)", rest)
    assert found, rest[-3000:]
    within = float(found.group(2))
    assert timeout_s <= within <= max(timeout_s, REQUEST_FACTOR * 1.0), found.group(1)  # no request took over 1 s
    return found.group(1), within


def test_a_stopped_rank_ends_the_run_within_the_deadline(tmp_path):
    out = tmp_path / "run"
    p = start("profile", "--out", str(out), *LONG, "--timeout", str(TIMEOUT_S))
    try:
        read_until(p, "probe 2 (prefix")  # the first prefix probe, after the sweep and the wide probe
        ranks = rank_pids(p.pid)
        rest, took = stop_rank(p, ranks[1])
    finally:
        p.kill()
    assert p.returncode == 1, rest[-3000:]
    line, within = deadline_line(rest, TIMEOUT_S)
    assert "Traceback" not in rest
    # the deadline, a heartbeat to tell the rank stopped, the launcher's stop: seconds, not gloo's 600 s
    assert took < within + 15, took
    assert not any(alive(pid) for pid in ranks.values())
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == f"failed: {line}"
    samples = pd.read_csv(out / "samples.csv")
    assert set(samples["probe"]) >= {0, 1, 2}  # what was measured stays


def first_worker(launcher_pid: int, within_s: float = 60.0) -> int:
    """The pid of the first rank process that appears below the launcher (polled every few milliseconds)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for pid in descendants(launcher_pid):
            try:
                if b"--resolved-config" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                pass
        time.sleep(0.005)
    raise AssertionError(f"no rank appeared within {within_s} s")


def test_a_rank_stopped_while_it_starts_ends_the_run_within_the_deadline_naming_it(tmp_path):
    out = tmp_path / "run"
    p = start("profile", "--out", str(out), *LONG, "--timeout", str(TIMEOUT_S))
    try:
        pid = first_worker(p.pid)
        rank = int(
            dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)[b"RANK"]
        )
        rest, took = stop_rank(p, pid)  # before it imports torch, long before it joins the group
    finally:
        p.kill()
    assert p.returncode == 1, rest[-3000:]
    line = f"rank {rank} did not start within {TIMEOUT_S} s: its process (pid {pid}) is stopped"
    assert f"error: [rank {1 - rank}] {line}" in rest, rest[-3000:]
    assert "Traceback" not in rest and "died of" not in rest, rest[-3000:]
    # the other rank's start-up (a torch import), the deadline, the launcher's SIGKILL of the stopped rank 5 s on
    assert took < TIMEOUT_S + 20, took
    assert not alive(pid)


@pytest.mark.parametrize("victim,named", [(1, True), (0, True), (0, False)])
def test_a_killed_rank_fails_the_run_at_once_and_is_not_taken_for_an_interrupt(tmp_path, victim, named):
    out = tmp_path / "run"
    if named:
        p = start("profile", "--out", str(out), *LONG)
    else:  # rank 0 names the folder, under results/ here
        p = subprocess.Popen(
            [sys.executable, "-m", "ppprof", "profile", *LONG],
            cwd=tmp_path,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)},
        )
    try:
        read_until(p, "probe 2 (prefix")  # the first prefix probe, after the sweep and the wide probe
        ranks = rank_pids(p.pid)
        os.kill(ranks[victim], signal.SIGKILL)  # the launcher then SIGTERMs the other: a failure, not an interrupt
        killed = time.monotonic()
        rest = p.stderr.read()
        p.wait(timeout=60)
        took = time.monotonic() - killed
    finally:
        p.kill()
    assert p.returncode == 1, rest[-3000:]
    assert "interrupted by" not in rest and "GLHF" not in rest  # gloo's paragraph, cut to its one clause
    # the dead rank named in one line (not "failed on rank 0, 1"), and in run.json, even where rank 0 is the one
    died = f"rank {victim} died of SIGKILL (pid {ranks[victim]})"
    assert f"error: the profile failed: {died}" in rest, rest[-3000:]
    assert took < 15
    if not named:
        (out,) = (tmp_path / "results").iterdir()
    assert json.loads((out / "run.json").read_text())["status"].startswith(f"failed: {died}")


def test_a_sigkilled_launcher_leaves_no_process(tmp_path):
    out = tmp_path / "run"
    p = start("profile", "--out", str(out), *LONG)
    try:
        read_until(p, "probe 0 (sweep")
        ranks = rank_pids(p.pid)
        assert len(ranks) == 2
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(alive(pid) for pid in ranks.values()):
            time.sleep(0.05)
        rest = p.stderr.read()
    finally:
        p.kill()
    assert not any(alive(pid) for pid in ranks.values())
    # torch's C++ backtraces of the store that went away are in the rank logs, not among the messages
    assert "TCPStore.cpp" not in rest and "frame #" not in rest, rest[-3000:]
    # the ranks went as if interrupted: the folder can be resumed
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"


def test_sigint_keeps_the_samples_and_resume_gives_the_probes_of_an_uninterrupted_run(tmp_path):
    out = tmp_path / "run"
    p = start("profile", "--out", str(out), *LONG)
    try:
        read_until(p, "probe 2 (prefix", rank=0)  # logged once its rows are on disk (rank 1 may log first)
        p.send_signal(signal.SIGINT)
        interrupted = time.monotonic()
        rest = p.stderr.read()
        p.wait(timeout=60)
        took = time.monotonic() - interrupted
    finally:
        p.kill()
    assert p.returncode == 130, rest[-3000:]
    assert took < 15
    assert "Traceback" not in rest and "SignalException" not in rest
    lines = [line for line in rest.splitlines() if line.startswith("interrupted by SIGINT")]
    assert len(lines) == 1 and f"finish it with: ppprof profile --resume {out}" in lines[0], rest[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted"
    kept = pd.read_csv(out / "samples.csv")
    assert kept["probe"].nunique() >= 3 and (len(kept) - 32 - 4) % 32 == 0  # the sweep, the wide probe (32 / 8)

    # an interrupted run is fitted, and said so (a copy: the resume below needs the folder as it was)
    partial = tmp_path / "partial"
    partial.mkdir()
    for name in ("samples.csv", "run.json"):
        (partial / name).write_bytes((out / name).read_bytes())
    r = CliRunner().invoke(
        main, ["fit", str(partial / "samples.csv"), "--alignment", "8", "--latency-model", "quadratic"]
    )
    assert r.exit_code == 0, r.output
    assert f"warning: the run in {partial} is interrupted (run.json), not complete: fitted the" in r.stderr
    assert (partial / "policy.json").is_file()

    # a changed setting is refused, in one line, before any rank starts
    r = CliRunner().invoke(main, ["profile", "--resume", str(out), "--seed", "6"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert f"--resume {out}: --seed 6 differs from the run's recorded 5" in r.stderr

    run = resume(out, "--timeout", "30")
    assert run["status"] == "complete" and run["resumed_from_probe"] == kept["probe"].nunique()
    resumed = pd.read_csv(out / "samples.csv")
    assert resumed.iloc[: len(kept)].equals(kept)  # the samples kept are kept as they were

    # the probes of an uninterrupted run: the grid design of the same settings, row for row
    uninterrupted = design_rows(LONG_SETTINGS)
    assert len(resumed) == len(uninterrupted) == 9 * 32 + 4
    pd.testing.assert_frame_equal(resumed[PROBE_COLUMNS], uninterrupted[PROBE_COLUMNS])


def test_a_run_stopped_while_it_measures_the_pipeline_overhead_resumes_from_that_phase(tmp_path):
    out = tmp_path / "run"
    short = ("--model", "tiny-dense", *TINY, "--seed", "5")
    # the stage is built at "pools: KV"; the overhead phase (300 prompts: many seconds), before the probes, is next,
    # and building ends within milliseconds of that line
    code, rest = interrupt(("--out", str(out), *short, "--overhead-repeats", "100"), "pools: KV", after_s=1.5)
    assert code == 130, rest[-3000:]
    assert "pipeline overhead: " not in rest and "probe 0 (" not in rest  # stopped in the overhead phase
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted" and "pipeline_overhead" not in run
    assert not (out / "samples.csv").is_file() or pd.read_csv(out / "samples.csv").empty

    # --overhead-repeats may change on resume (it changes no probe): no probe is complete, so every phase runs
    run = resume(out, "--timeout", "30", "--overhead-repeats", "2")
    assert run["status"] == "complete" and run["resumed_from_probe"] == 0
    assert run["config"]["overhead_repeats"] == 2
    assert sorted({x["repeat"] for x in run["pipeline_overhead"]["runs"]}) == [0, 1]
    assert pd.read_csv(out / "samples.csv")["probe"].nunique() == 4


def test_sigterm_ends_every_rank_with_143_and_an_interrupted_folder(tmp_path):
    out = tmp_path / "run"
    p = start("profile", "--out", str(out), *LONG)
    try:
        read_until(p, "probe 0 (sweep")
        ranks = rank_pids(p.pid)
        p.send_signal(signal.SIGTERM)
        rest = p.stderr.read()
        p.wait(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 143, rest[-3000:]
    assert "Traceback" not in rest
    assert not any(alive(pid) for pid in ranks.values())
    assert json.loads((out / "run.json").read_text())["status"] == "interrupted"
    assert not (out / LOCK_FILE).exists()


def test_a_stale_lock_and_other_files_are_kept_by_overwrite(tmp_path):
    """A lock whose holder is gone is stale: --overwrite replaces the run and leaves other files alone (refusals of
    a folder in use or holding files: tests/run/test_fault_input.py)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    holder = subprocess.run(
        [sys.executable, "-c", "import sys; from ppprof.runfiles import take_lock; take_lock(sys.argv[1])", str(out)],
        cwd=REPO,
        timeout=60,
    )
    assert holder.returncode == 0 and (out / LOCK_FILE).exists()
    r = subprocess.run(
        [sys.executable, "-m", "ppprof", "profile", "--out", str(out), "--overwrite", *TINY],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "notes.txt").read_text() == "mine" and not (out / LOCK_FILE).exists()
    assert json.loads((out / "run.json").read_text())["status"] == "complete"


def test_an_adaptive_run_stopped_between_probes_resumes_where_its_design_left_off(tmp_path):
    out = tmp_path / "run"
    short = ("--model", "tiny-dense", "--base-chunk-size", "64", "--context-len", "2048", "--design", "adaptive")
    short += ("--warmup", "1", "--no-fit")
    short += ("--overhead-repeats", "1", "--packed-forwards", "0", "--seed", "5")
    # at "probe 0 (design" its rows are on disk, and rank 0 fits them to choose probe 1
    code, rest = interrupt(("--out", str(out), *short), "probe 0 (design")
    assert code == 130, rest[-3000:]
    kept = pd.read_csv(out / "samples.csv")
    assert kept["probe"].nunique() < MIN_STEPS  # the design cannot have stopped yet

    run = resume(out, "--timeout", "60")
    assert run["status"] == "complete" and run["resumed_from_probe"] == kept["probe"].nunique()
    assert run["design"]["stopping_reason"] in ("stable", "max-requests")
    samples = pd.read_csv(out / "samples.csv")
    # The probes before the interruption are kept as they ran; the design went on from them, in order.
    pd.testing.assert_frame_equal(samples.iloc[: len(kept)], kept)
    assert sorted(samples["probe"].unique()) == list(range(samples["probe"].nunique()))
    assert samples["probe"].nunique() >= MIN_STEPS or run["design"]["stopping_reason"] == "max-requests"
    assert samples["request"].is_unique

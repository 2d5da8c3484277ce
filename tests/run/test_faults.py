"""Faults of a real profile (gloo ranks in subprocesses, a small --timeout so that each test takes seconds): a stopped
rank ends the run within the deadline, a killed launcher leaves no rank, SIGINT / SIGTERM keep the samples so far in
a resumable folder, and --resume gives the probes of an uninterrupted run. The run folder is never clobbered."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.runfiles import LOCK_FILE
from tests.multirank import REPO, TINY

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]

TIMEOUT_S = 3
# Nine probes of 32 requests on the 4-layer tiny-dense model: long enough to stop a rank in the middle.
LONG = ("--model", "tiny-dense", "--base-chunk-size", "32", "--requests-per-probe", "32",
        "--prefix-lens", "32,64,96,128,160,192,224,256", "--warmup", "1", "--no-fit", "--seed", "5")
PROBE_COLUMNS = ["probe", "kind", "request", "prefix_len", "chunk_size"]


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


def test_a_stopped_rank_ends_the_run_within_the_deadline(tmp_path):
    out = tmp_path / "run"
    p = start("profile", "--out", str(out), *LONG, "--timeout", str(TIMEOUT_S))
    try:
        read_until(p, "probe 2 (prefix")  # the first prefix probe, after the sweep and the wide probe
        ranks = rank_pids(p.pid)
        os.kill(ranks[1], signal.SIGSTOP)
        stopped = time.monotonic()
        rest = p.stderr.read()
        p.wait(timeout=120)
        took = time.monotonic() - stopped
    finally:
        p.kill()
    assert p.returncode == 1, rest[-3000:]
    line = f"rank 1 did not answer within {TIMEOUT_S} s during run the probes"
    assert f"error: [rank 0] {line}" in rest, rest[-3000:]
    assert "Traceback" not in rest
    # the deadline, a heartbeat to tell the rank stopped, the launcher's stop: seconds, not gloo's 600 s
    assert took < TIMEOUT_S + 15, took
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
        os.kill(pid, signal.SIGSTOP)  # before it imports torch, long before it joins the group
        stopped = time.monotonic()
        rank = int(dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                        if b"=" in e)[b"RANK"])
        rest = p.stderr.read()
        p.wait(timeout=120)
        took = time.monotonic() - stopped
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
        p = subprocess.Popen([sys.executable, "-m", "ppprof", "profile", *LONG], cwd=tmp_path, stderr=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO)})
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


@pytest.mark.parametrize("launcher", ["ppprof", "torchrun"])
def test_a_sigkilled_launcher_leaves_no_process(tmp_path, launcher):
    out = tmp_path / "run"
    if launcher == "torchrun":
        p = start("--standalone", "--nproc-per-node", "2", "-m", "ppprof", "profile", "--out", str(out), *LONG,
                  launcher=[sys.executable, "-m", "torch.distributed.run"])
    else:
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
    out, whole = tmp_path / "run", tmp_path / "whole"
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

    # a changed setting is refused, in one line, before any rank starts
    r = CliRunner().invoke(main, ["profile", "--resume", str(out), "--seed", "6"])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert f"--resume {out}: --seed 6 differs from the run's recorded 5" in r.stderr

    r = subprocess.run([sys.executable, "-m", "ppprof", "profile", "--resume", str(out), "--timeout", "30"],
                       cwd=REPO, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "complete" and run["resumed_from_probe"] == kept["probe"].nunique()
    resumed = pd.read_csv(out / "samples.csv")
    assert resumed.iloc[:len(kept)].equals(kept)  # the samples kept are kept as they were

    r = subprocess.run([sys.executable, "-m", "ppprof", "profile", "--out", str(whole), *LONG], cwd=REPO,
                       capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    uninterrupted = pd.read_csv(whole / "samples.csv")
    assert len(resumed) == len(uninterrupted) == 9 * 32 + 4
    pd.testing.assert_frame_equal(resumed[PROBE_COLUMNS], uninterrupted[PROBE_COLUMNS])


def test_a_run_stopped_while_it_measures_the_pipeline_overhead_resumes_that_phase_alone(tmp_path):
    out = tmp_path / "run"
    short = ("--model", "tiny-dense", "--base-chunk-size", "32", "--requests-per-probe", "8", "--prefix-lens", "32,64",
             "--warmup", "1", "--no-fit", "--seed", "5")
    p = start("profile", "--out", str(out), *short, "--overhead-repeats", "100")  # 300 prompts: many seconds
    try:
        read_until(p, "probe 3 (prefix", rank=0)  # the last probe's rows are on disk; the overhead phase is next
        time.sleep(1.5)  # the probes' phase ends within milliseconds; the overhead phase takes far longer
        p.send_signal(signal.SIGINT)
        rest = p.stderr.read()
        p.wait(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, rest[-3000:]
    assert "pipeline overhead: " not in rest  # stopped before it ended
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "interrupted" and "pipeline_overhead" not in run
    kept = pd.read_csv(out / "samples.csv")
    assert kept["probe"].nunique() == 4

    # --overhead-repeats may change on resume (it changes no probe): every probe is complete, so only the
    # warm-up and the overhead phase run again
    r = subprocess.run([sys.executable, "-m", "ppprof", "profile", "--resume", str(out), "--timeout", "30",
                        "--overhead-repeats", "2"], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "probes 0..3 are complete, 0 to run" in r.stderr, r.stderr[-3000:]
    run = json.loads((out / "run.json").read_text())
    assert run["status"] == "complete" and run["resumed_from_probe"] == 4 and run["timed_requests"] == 0
    assert run["config"]["overhead_repeats"] == 2
    assert sorted({x["repeat"] for x in run["pipeline_overhead"]["runs"]}) == [0, 1]
    pd.testing.assert_frame_equal(pd.read_csv(out / "samples.csv"), kept)


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


def test_an_incomplete_run_is_fitted_and_said_so(tmp_path):
    out = tmp_path / "run"
    p = start("profile", "--out", str(out), *LONG)
    try:
        read_until(p, "probe 2 (prefix")
        p.send_signal(signal.SIGINT)
        p.communicate(timeout=60)
    finally:
        p.kill()
    r = CliRunner().invoke(main, ["fit", str(out / "samples.csv"), "--alignment", "8", "--latency-model",
                                  "quadratic"])
    assert r.exit_code == 0, r.output
    assert f"warning: the run in {out} is interrupted (run.json), not complete: fitted the" in r.stderr
    assert (out / "policy.json").is_file()


def test_a_run_folder_in_use_or_holding_a_run_is_refused_unless_overwrite(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = CliRunner().invoke(main, ["profile", "--out", str(out), *TINY])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith(f"error: --out {out} is not empty (it holds notes.txt): choose a new folder, add "
                               "--overwrite")
    # a live process holds the lock: refused even with --overwrite
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from ppprof.runfiles import take_lock; "
                               "take_lock(sys.argv[1]); print('held', flush=True); time.sleep(60)", str(out)],
                              cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        r = CliRunner().invoke(main, ["profile", "--out", str(out), "--overwrite", *TINY])
        assert r.exit_code == 2 and r.stderr.count("\n") == 1
        assert f"error: --out {out} is in use by another ppprof run (pid {holder.pid} on" in r.stderr
    finally:
        holder.kill()
        holder.wait()
    # its holder gone, the lock is stale; --overwrite replaces the run and leaves other files alone
    r = subprocess.run([sys.executable, "-m", "ppprof", "profile", "--out", str(out), "--overwrite", *TINY],
                       cwd=REPO, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (out / "notes.txt").read_text() == "mine" and not (out / LOCK_FILE).exists()
    assert json.loads((out / "run.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("args,message", [
    (["--timeout", "0"], "--timeout 0.0 must be a number of seconds in 0.5..86400"),
    (["--timeout", "nan"], "--timeout nan must be a number of seconds"),
    (["--timeout", "x"], "Invalid value for '--timeout'"),
    (["--resume", "/no/such/run"], "--resume /no/such/run: /no/such/run/run.json does not exist"),
    (["--resume", "/a", "--out", "/b"], "--out /b with --resume /a: a resumed run writes into the folder it resumes"),
    (["--resume", "/a", "--overwrite"], "--overwrite with --resume /a: a resumed run keeps the samples it has"),
])
def test_bad_fault_flags_are_one_line_before_any_rank(tmp_path, args, message):
    r = CliRunner().invoke(main, ["profile", *args])
    assert r.exit_code == 2, r.output
    assert message in r.stderr and r.stderr.count("\n") == 1


def test_timeout_is_read_from_yaml(tmp_path):
    from ppprof.run.settings import resolve_config

    cfg_file = tmp_path / "p.yaml"
    cfg_file.write_text("timeout: 12.5\n")
    assert resolve_config(str(cfg_file), {}).timeout == 12.5
    cfg_file.write_text("timeout: soon\n")
    r = CliRunner().invoke(main, ["profile", "--config", str(cfg_file)])
    assert r.exit_code == 2 and "--timeout 'soon' must be a number of seconds" in r.stderr


def test_an_adaptive_run_is_not_resumed(tmp_path):
    """The adaptive design chose its probes from its own measurements: resuming would change them."""
    run = json.loads((Path(__file__).resolve().parents[2] / "results" / "baseline" / "run.json").read_text())
    run.update(schema_version=3, status="interrupted")
    run["config"]["design"] = "adaptive"
    (tmp_path / "run.json").write_text(json.dumps(run))
    r = CliRunner().invoke(main, ["profile", "--resume", str(tmp_path)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert "an adaptive design chose its probes from what it had measured" in r.stderr


def test_a_write_refused_by_the_disk_names_the_file_and_leaves_nothing(tmp_path):
    import resource

    def no_room():  # every write that would grow a file fails, as on a full disk (EFBIG here, ENOSPC there)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "ppprof", "profile", "--out", str(out), *TINY], cwd=REPO,
                       capture_output=True, text=True, timeout=120, preexec_fn=no_room,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "JOBLIB_MULTIPROCESSING": "0"})
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr == f"error: cannot use {out / LOCK_FILE}: File too large; raise the file size limit (ulimit -f) "\
                       "or write elsewhere\n", r.stderr
    assert not out.exists(), f"{list(out.iterdir())=}"  # neither the folder nor an empty lock

"""A profile's fault-handling input, before any rank starts: bad --timeout / --resume flags and YAML, a run folder
that holds files or is in use, a disk that refuses the lock; each one line, exit 2, nothing written."""

import os
import signal
import subprocess
import sys

import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.runfiles import LOCK_FILE
from tests.multirank import REPO, TINY


def test_a_run_folder_in_use_or_holding_a_run_is_refused(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    r = CliRunner().invoke(main, ["profile", "--out", str(out), *TINY])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1
    assert r.stderr.startswith(
        f"error: --out {out} is not empty (it holds notes.txt): choose a new folder, add --overwrite"
    )
    # a live process holds the lock: refused even with --overwrite
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from ppprof.runfiles import take_lock; "
            "take_lock(sys.argv[1]); print('held', flush=True); time.sleep(60)",
            str(out),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        r = CliRunner().invoke(main, ["profile", "--out", str(out), "--overwrite", *TINY])
        assert r.exit_code == 2 and r.stderr.count("\n") == 1
        assert f"error: --out {out} is in use by another ppprof run (pid {holder.pid} on" in r.stderr
    finally:
        holder.kill()
        holder.wait()
    assert sorted(p.name for p in out.iterdir()) == sorted(["notes.txt", LOCK_FILE])


@pytest.mark.parametrize(
    "args,message",
    [
        (["--timeout", "0"], "--timeout 0.0 must be a number of seconds in 0.5..86400"),
        (["--timeout", "nan"], "--timeout nan must be a number of seconds"),
        (["--timeout", "x"], "Invalid value for '--timeout'"),
        (["--resume", "/no/such/run"], "--resume /no/such/run: /no/such/run/run.json does not exist"),
        (
            ["--resume", "/a", "--out", "/b"],
            "--out /b with --resume /a: a resumed run writes into the folder it resumes",
        ),
        (["--resume", "/a", "--overwrite"], "--overwrite with --resume /a: a resumed run keeps the samples it has"),
    ],
)
def test_bad_fault_flags_are_one_line_before_any_rank(tmp_path, args, message):
    r = CliRunner().invoke(main, ["profile", *args])
    assert r.exit_code == 2, r.output
    assert message in r.stderr and r.stderr.count("\n") == 1


def test_timeout_is_read_from_yaml(tmp_path):
    from ppprof.run.resolve import resolve_config

    cfg_file = tmp_path / "p.yaml"
    cfg_file.write_text("timeout: 12.5\n")
    assert resolve_config(str(cfg_file), {}).job.timeout == 12.5
    cfg_file.write_text("timeout: soon\n")
    r = CliRunner().invoke(main, ["profile", "--config", str(cfg_file)])
    assert r.exit_code == 2 and "--timeout 'soon' must be a number of seconds" in r.stderr


def test_a_write_refused_by_the_disk_names_the_file_and_leaves_nothing(tmp_path):
    import resource

    def no_room():  # every write that would grow a file fails, as on a full disk (EFBIG here, ENOSPC there)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))

    out = tmp_path / "run"
    r = subprocess.run(
        [sys.executable, "-m", "ppprof", "profile", "--out", str(out), *TINY],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=no_room,
        env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "JOBLIB_MULTIPROCESSING": "0"},
    )
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert (
        r.stderr == f"error: cannot use {out / LOCK_FILE}: File too large; raise the file size limit (ulimit -f) "
        "or write elsewhere\n"
    ), r.stderr
    assert not out.exists(), f"{list(out.iterdir())=}"  # neither the folder nor an empty lock

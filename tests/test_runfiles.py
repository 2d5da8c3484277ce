"""run.json: written and read with one schema; the run folder's paths, named once."""

import json

import pytest

from ppprof.runfiles import RUN_SCHEMA_VERSION, RunFolder, read_run_json, write_run_json


def test_run_json_round_trips_and_is_written_whole(tmp_path):
    write_run_json(tmp_path / "run.json", config={"base_chunk_size": 64}, world_size=2)
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["schema_version"] == RUN_SCHEMA_VERSION and doc["world_size"] == 2
    assert read_run_json(tmp_path / "run.json") == doc
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temporary files left


def test_a_run_folder_names_its_files_and_is_found_from_one_of_them(tmp_path):
    folder = RunFolder(str(tmp_path))
    assert folder == RunFolder.of(tmp_path / "policy.json") == RunFolder.of(folder.samples)
    assert [p.name for p in (folder.samples, folder.run_json, folder.policy, folder.lock, folder.rank_log(3))] == [
        "samples.csv",
        "run.json",
        "policy.json",
        ".ppprof.lock",
        "rank3.log",
    ]
    assert all(p.parent == tmp_path for p in (folder.samples, folder.run_json, folder.policy, folder.lock))
    assert folder.read_run() is None
    write_run_json(folder.run_json, config={"base_chunk_size": 64})
    assert folder.read_run()["config"] == {"base_chunk_size": 64}


@pytest.mark.parametrize(
    "text,match",
    [
        ("{", "is not readable JSON"),
        ('{"schema_version": 99, "config": {}}', "has schema_version 99"),
        ('{"schema_version": 2}', "lacks its 'config' object"),
    ],
)
def test_a_bad_run_json_is_one_line_naming_the_file(tmp_path, text, match):
    (tmp_path / "run.json").write_text(text)
    with pytest.raises(ValueError, match=match):
        read_run_json(tmp_path / "run.json")


def test_older_run_json_reads_as_complete_and_a_record_rewrites_its_status(tmp_path):
    from ppprof.runfiles import RunRecord

    (tmp_path / "run.json").write_text('{"schema_version": 2, "config": {"seed": 0}}')
    assert read_run_json(tmp_path / "run.json")["status"] == "complete"
    record = RunRecord(tmp_path / "run.json", config={"seed": 1}, world_size=2)
    record.write()
    assert read_run_json(tmp_path / "run.json")["status"] == "running"
    record.write(status="failed: rank 1 did not answer within 3 s during run the probes", probe_wall_s=1.5)
    run = read_run_json(tmp_path / "run.json")
    assert run["status"].startswith("failed: rank 1") and run["world_size"] == 2 and run["probe_wall_s"] == 1.5


def test_the_lock_is_taken_once_named_when_held_and_taken_over_when_stale(tmp_path):
    import os
    import socket
    import subprocess
    import sys

    from ppprof.runfiles import LOCK_FILE, lock_owner, release_lock, take_lock

    path = take_lock(tmp_path)
    assert path.read_text() == f"{os.getpid()} {socket.gethostname()}\n"
    assert lock_owner(tmp_path) == f"pid {os.getpid()} on {socket.gethostname()}"
    with pytest.raises(ValueError, match=rf"--out {tmp_path} is in use by another ppprof run \(pid {os.getpid()}"):
        take_lock(tmp_path)
    release_lock(tmp_path)
    assert not path.exists() and lock_owner(tmp_path) is None
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (tmp_path / LOCK_FILE).write_text(f"{dead.stdout.strip()} {socket.gethostname()}\n")
    assert lock_owner(tmp_path) is None  # its run died: stale
    take_lock(tmp_path)
    assert lock_owner(tmp_path) == f"pid {os.getpid()} on {socket.gethostname()}"


def _race_lock(folder, barrier, start, results, trials):
    """One of two racers: each trial, take the folder's stale lock at the same moment as the other racer (both spin
    until the start time the test set), say whether it got it, hold it until both have tried, then release it."""
    import time

    from ppprof.runfiles import release_lock, take_lock

    for _ in range(trials):
        barrier.wait()
        while time.monotonic() < start.value:
            pass
        try:
            take_lock(folder)
            won = True
        except ValueError:
            won = False
        results.put(won)
        barrier.wait()  # both have tried: the winner still holds the lock
        if won:
            release_lock(folder)
        barrier.wait()


def test_two_processes_taking_over_a_stale_lock_at_once_never_both_get_it(tmp_path):
    import multiprocessing as mp
    import socket
    import subprocess
    import sys
    import time

    from ppprof.runfiles import LOCK_FILE

    trials = 300
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = f"{dead.stdout.strip()} {socket.gethostname()}\n"
    ctx = mp.get_context("spawn")
    barrier, start, results = ctx.Barrier(3), ctx.Value("d", 0.0), ctx.Queue()
    racers = [ctx.Process(target=_race_lock, args=(tmp_path, barrier, start, results, trials)) for _ in range(2)]
    for p in racers:
        p.start()
    winners = []
    try:
        for _ in range(trials):
            (tmp_path / LOCK_FILE).write_text(stale)
            start.value = time.monotonic() + 0.002  # CLOCK_MONOTONIC: one clock for every process of the host
            barrier.wait(timeout=60)
            winners.append(results.get(timeout=60) + results.get(timeout=60))
            barrier.wait(timeout=60)
            barrier.wait(timeout=60)
    finally:
        for p in racers:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    both, none = winners.count(2), winners.count(0)
    assert both == 0 and none == 0, f"{both=} {none=} of {trials} trials"


def test_the_launcher_marks_a_run_failed_where_rank_0_could_not(tmp_path):
    from ppprof.runfiles import mark_failed, read_run_json, write_run_json

    path = tmp_path / "run.json"
    write_run_json(path, config={"seed": 1}, status="running", world_size=2)
    assert mark_failed(path, "rank 0 died of SIGKILL (pid 7)")
    run = read_run_json(path)
    assert run["status"] == "failed: rank 0 died of SIGKILL (pid 7)" and run["world_size"] == 2
    write_run_json(path, config={"seed": 1}, status="failed: lost the connection to another rank")
    assert not mark_failed(path, "rank 1 died of SIGKILL (pid 8)")  # rank 0 said why
    assert mark_failed(path, "rank 1 died of SIGKILL (pid 8)", replace_failure=True)  # the cause, not the echo
    write_run_json(path, config={"seed": 1}, status="interrupted")
    assert not mark_failed(path, "x", replace_failure=True) and read_run_json(path)["status"] == "interrupted"
    assert not mark_failed(tmp_path / "none.json", "x")

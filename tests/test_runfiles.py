"""run.json: written and read with one schema."""

import json

import pytest

from ppprof.runfiles import RUN_SCHEMA_VERSION, read_run_json, write_run_json


def test_run_json_round_trips_and_is_written_whole(tmp_path):
    write_run_json(tmp_path / "run.json", config={"base_chunk_size": 64}, world_size=2)
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["schema_version"] == RUN_SCHEMA_VERSION and doc["world_size"] == 2
    assert read_run_json(tmp_path / "run.json") == doc
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # no temporary files left


@pytest.mark.parametrize("text,match", [
    ("{", "is not readable JSON"),
    ('{"schema_version": 99, "config": {}}', "has schema_version 99"),
    ('{"schema_version": 2}', "lacks its 'config' object"),
])
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

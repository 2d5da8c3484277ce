import errno
import os

import pytest

from ppprof.io import atomic_write, atomic_write_json


def test_atomic_write_leaves_no_partial_file_when_the_writer_fails(tmp_path):
    target = tmp_path / "out.json"
    atomic_write_json(target, {"v": 1})

    def broken(tmp):
        tmp.write_text("half")
        raise RuntimeError("writer died")

    with pytest.raises(RuntimeError):
        atomic_write(target, broken)
    assert target.read_text() == '{\n  "v": 1\n}\n'
    assert os.listdir(tmp_path) == ["out.json"]


def test_unwritable_target_names_the_target(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("")
    with pytest.raises(OSError) as e:
        atomic_write_json(blocker / "x.json", {})
    assert e.value.filename == str(blocker / "x.json")
    assert e.value.errno in (errno.ENOTDIR, errno.EEXIST)


def test_written_files_get_the_usual_mode(tmp_path):
    old = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "p.json", {})
    finally:
        os.umask(old)
    assert (tmp_path / "p.json").stat().st_mode & 0o777 == 0o644


def test_a_failed_write_names_the_target_and_the_cause_not_the_temporary_file(tmp_path):
    target = tmp_path / "samples.csv"

    def disk_full(tmp):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp))

    with pytest.raises(OSError) as e:
        atomic_write(target, disk_full)
    assert e.value.filename == str(target) and e.value.errno == errno.ENOSPC
    assert os.listdir(tmp_path) == []

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


def private_null(tmp_path):
    """A character device like /dev/null (major 1, minor 3) in the test's folder, or a skip where mknod is not
    allowed (not root)."""
    import stat

    dev = tmp_path / "null"
    try:
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("mknod needs root")
    return dev


def test_a_character_device_given_as_output_is_written_into_and_stays_a_device(tmp_path):
    import stat
    from pathlib import Path

    from click.testing import CliRunner

    from ppprof.cli import main

    dev = private_null(tmp_path)
    samples = Path(__file__).resolve().parents[1] / "results/baseline/samples.csv"
    r = CliRunner().invoke(main, ["fit", str(samples), "-o", str(dev), "--no-load-rule"])
    assert r.exit_code == 0, r.output
    assert stat.S_ISCHR(os.lstat(dev).st_mode), "the device was replaced by a regular file"
    assert sorted(os.listdir(tmp_path)) == ["null"]  # no temporary file left beside it


def test_a_folder_or_pipe_as_target_is_refused_and_kept(tmp_path):
    import stat

    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    for target, kind in ((tmp_path, "a folder"), (pipe, "a pipe")):
        with pytest.raises(OSError, match=f"exists and is {kind}, not a file") as e:
            atomic_write_json(target, {"v": 1})
        assert e.value.filename == str(target)
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode) and sorted(os.listdir(tmp_path)) == ["pipe"]


def test_an_appended_file_is_not_written_through_a_symbolic_link(tmp_path):
    import pandas as pd

    from ppprof.probe.output import append_samples

    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    link = tmp_path / "samples.csv"
    link.symlink_to(victim)
    with pytest.raises(OSError, match="is a symbolic link") as e:
        append_samples(link, pd.DataFrame({"probe": [0]}))
    assert e.value.errno == errno.ELOOP and victim.read_text() == "keep\n"


def test_a_small_input_must_be_a_small_regular_utf8_file(tmp_path):
    from ppprof.io import read_small_text

    (tmp_path / "ok.yaml").write_text("a: 1\n")
    assert read_small_text(tmp_path / "ok.yaml", "--config", "fix") == "a: 1\n"
    with pytest.raises(ValueError, match=r"^--config /dev/zero is a character device, not a file: give a YAML"):
        read_small_text("/dev/zero", "--config", "give a YAML file")  # was read until memory ran out
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ValueError, match=r"pipe is a pipe, not a file"):  # neither blocks nor reads
        read_small_text(tmp_path / "pipe", "--config", "fix")
    (tmp_path / "big").write_bytes(b"a" * 2049)
    with pytest.raises(ValueError, match=r"big holds more than"):
        read_small_text(tmp_path / "big", "policy file", "fix", max_bytes=2048)
    (tmp_path / "bin").write_bytes(b"\xff\xfe")
    with pytest.raises(ValueError, match=r"bin is not UTF-8 text \(byte 0\): fix"):
        read_small_text(tmp_path / "bin", "policy file", "fix")
    with pytest.raises(IsADirectoryError):
        read_small_text(tmp_path, "policy file", "fix")
    with pytest.raises(FileNotFoundError):
        read_small_text(tmp_path / "none", "policy file", "fix")


@pytest.mark.parametrize("depth", [65, 200_000])  # caught by the walk, and a RecursionError caught in the parse
def test_json_and_yaml_nested_too_deep_are_refused_naming_where(depth):
    from ppprof.io import MAX_DEPTH, TooDeep, parse_json, parse_yaml

    text = '{"model": {"layers": ' + "[" * depth + "]" * depth + "}}"
    with pytest.raises(
        TooDeep,
        match=rf"^f nests lists or mappings deeper than {MAX_DEPTH} levels "
        r"\(at \$\.model\.layers\[0\]\[0\]\.\.\., \d+ levels down\)",
    ):
        parse_json(text, "f")
    with pytest.raises(TooDeep, match=r"^y nests .* \(at \$\.model\.layers\[0\]"):
        parse_yaml(text, "y")
    ok = '{"a": [' + "[" * (MAX_DEPTH - 2) + "]" * (MAX_DEPTH - 2) + "]}"
    assert parse_json(ok, "f")["a"] and parse_yaml(ok, "y")["a"]

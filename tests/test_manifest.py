"""ppprof.manifest: the command line as typed, the git revision, and the result written with its manifest first."""

import json
import os

from click.testing import CliRunner

from ppprof.cli import main
from ppprof.manifest import (
    COMMAND_ENV,
    FIELDS,
    MANIFEST_KEY,
    REPO,
    command_line,
    git_revision,
    manifest,
    read_manifest,
    write_manifest,
    write_result,
)


def test_the_command_line_names_ppprof_and_scripts_as_typed(monkeypatch):
    monkeypatch.delenv(COMMAND_ENV, raising=False)
    assert command_line(["/x/.venv/bin/ppprof", "profile", "--out", "a b"]) == "ppprof profile --out 'a b'"
    assert command_line([str(REPO / "ppprof" / "__main__.py"), "bench"]) == "ppprof bench"
    assert (
        command_line([str(REPO / "scripts" / "benchmarks" / "alloc.py"), "--quick"])
        == "python scripts/benchmarks/alloc.py --quick"
    )
    monkeypatch.setenv(COMMAND_ENV, "ppprof profile --out X")
    assert command_line() == "ppprof profile --out X"  # a rank records its launcher's


def test_the_click_group_sets_the_typed_command_for_the_ranks_and_restores_the_environment(monkeypatch):
    monkeypatch.delenv(COMMAND_ENV, raising=False)
    r = CliRunner().invoke(main, ["validate", "/nonexistent/policy.json"])
    assert r.exit_code == 2 and COMMAND_ENV not in os.environ
    monkeypatch.setenv(COMMAND_ENV, "ppprof profile --out X")  # a rank's, from its launcher: kept
    CliRunner().invoke(main, ["validate", "/nonexistent/policy.json"])
    assert os.environ[COMMAND_ENV] == "ppprof profile --out X"


def test_git_revision_outside_a_checkout_is_none(tmp_path):
    assert git_revision(tmp_path) is None
    assert git_revision() is None or len(git_revision().removesuffix("-dirty")) == 40


def test_a_result_is_written_with_its_manifest_first(tmp_path):
    path = write_result(tmp_path / "r.json", {"figure": 1.5, MANIFEST_KEY: "stale"}, "python x.py")
    data = json.loads(path.read_text())
    assert list(data) == [MANIFEST_KEY, "figure"] and data["figure"] == 1.5
    assert set(FIELDS) <= set(data[MANIFEST_KEY]) and data[MANIFEST_KEY]["command"] == "python x.py"
    assert sorted(os.listdir(tmp_path)) == ["r.json"]  # no temporary file left
    write_manifest(tmp_path, "ppprof profile")
    assert read_manifest(tmp_path)["command"] == "ppprof profile"
    assert read_manifest(tmp_path / "none") is None
    assert manifest("c", recorded="afterwards", source="run.json")["source"] == "run.json"

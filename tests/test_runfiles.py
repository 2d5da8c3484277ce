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

"""results/ explains itself: every entry (a folder or a top-level file) has its line in results/README.md's index and a
manifest (ppprof.manifest: a folder's manifest.json, a JSON file's "manifest" key), and the index names no entry that
is gone."""

import re
import sys
from pathlib import Path

from ppprof.manifest import AFTERWARDS, BY_THE_COMMAND, read_manifest

RESULTS = Path(__file__).resolve().parents[1] / "results"
INDEX = RESULTS / "README.md"
REQUIRED = ("command", "git_revision", "cpu_model", "date", "recorded")


def entries() -> list[str]:
    return sorted(
        p.name + ("/" if p.is_dir() else "")
        for p in RESULTS.iterdir()
        if p.name != "README.md" and not p.name.startswith(".")
    )


def indexed() -> dict[str, str]:
    """entry -> its command, from the index's table rows (| `entry` | what | command |)."""
    rows = {}
    for line in INDEX.read_text().splitlines():
        if m := re.match(r"^\| `([^`]+)` \| (.+?) \| (.+) \|$", line):
            assert m.group(1) not in rows, f"{m.group(1)} has two lines in results/README.md"
            rows[m.group(1)] = m.group(3)
    return rows


def test_every_entry_has_its_line_in_the_index_and_the_index_no_missing_entry():
    rows = indexed()
    assert [e for e in entries() if e not in rows] == [], "add a line (what it shows, its command) to results/README.md"
    assert [e for e in rows if e not in entries()] == [], "results/README.md names entries that are gone"
    assert all(cmd.strip("` ") for cmd in rows.values())


def test_every_entry_carries_its_manifest():
    missing, incomplete = [], []
    for entry in entries():
        manifest = read_manifest(RESULTS / entry.rstrip("/"))
        if manifest is None:
            missing.append(entry)
        elif any(not manifest.get(k) for k in REQUIRED) or manifest["recorded"] not in (BY_THE_COMMAND, AFTERWARDS):
            incomplete.append(f"{entry}: {manifest}")
    assert missing == [], "no manifest (ppprof.manifest: FOLDER/manifest.json, or FILE.json's 'manifest' key)"
    assert incomplete == []


def test_a_missing_line_or_manifest_is_found(tmp_path, monkeypatch):
    (tmp_path / "README.md").write_text("| entry | what | command |\n|---|---|---|\n| `gone/` | x | `y` |\n")
    (tmp_path / "new").mkdir()
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "RESULTS", tmp_path)
    monkeypatch.setattr(module, "INDEX", tmp_path / "README.md")
    assert entries() == ["new/"] and list(indexed()) == ["gone/"]
    assert read_manifest(tmp_path / "new") is None

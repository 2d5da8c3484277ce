"""results/ explains itself: every entry (a folder or a top-level file) has its line in results/README.md's index and a
manifest (ppprof.manifest: a folder's manifest.json, a JSON file's "manifest" key), and the index names no entry that
is gone."""

import re
import subprocess
import sys
from pathlib import Path

from ppprof.manifest import AFTERWARDS, BY_THE_COMMAND, read_manifest

RESULTS = Path(__file__).resolve().parents[1] / "results"
INDEX = RESULTS / "README.md"
LINE_LIMIT = 300
REQUIRED = ("command", "git_revision", "cpu_model", "date", "recorded")


def entries() -> list[str]:
    """The entries git tracks under results/ (a folder's name with a slash): what a run left there, such as the
    README's first command's run folder, is no entry until it is committed."""
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--", "."], cwd=RESULTS, capture_output=True, check=True
    ).stdout.decode()
    names = {Path(f).parts[0] + ("/" if len(Path(f).parts) > 1 else "") for f in tracked.split("\0") if f}
    return sorted(n for n in names if n != "README.md" and not n.startswith("."))


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


def test_a_missing_line_or_manifest_is_found_and_an_untracked_run_folder_is_no_entry(tmp_path, monkeypatch):
    (tmp_path / "README.md").write_text("| entry | what | command |\n|---|---|---|\n| `gone/` | x | `y` |\n")
    (tmp_path / "new").mkdir()
    (tmp_path / "new" / "result.json").write_text("{}")
    (tmp_path / "20261205-074635-tiny-hybrid").mkdir()  # what the README's first command leaves, never committed
    (tmp_path / "20261205-074635-tiny-hybrid" / "policy.json").write_text("{}")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run([*git, "add", "README.md", "new"], cwd=tmp_path, check=True)
    module = sys.modules[__name__]
    monkeypatch.setattr(module, "RESULTS", tmp_path)
    monkeypatch.setattr(module, "INDEX", tmp_path / "README.md")
    assert entries() == ["new/"] and list(indexed()) == ["gone/"]
    assert read_manifest(tmp_path / "new") is None


def test_every_line_of_the_index_is_short():
    """One line an entry, at most LINE_LIMIT characters; the figures and how to read them go to docs/results.md."""
    long = [line[:60] for line in INDEX.read_text().splitlines() if len(line) > LINE_LIMIT]
    assert long == [], f"results/README.md lines over {LINE_LIMIT} characters: move the detail to docs/results.md"

"""The files git tracks in this checkout: what the tests judge as committed, never what a run left beside them (the
README's first command writes its run folder under results/, ignored by git)."""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def tracked(pattern: str) -> list[Path]:
    """The tracked files matching `pattern` (git's pathspec glob, e.g. "results/*/policy.json"), sorted."""
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", f":(glob){pattern}"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    return sorted(REPO / f for f in out.split("\0") if f)

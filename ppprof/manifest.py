"""Where a result came from: the manifest every result carries (the command line, the git revision, the CPU, the
date), written by ppprof's commands into their run folder and by scripts/ into their result. Pure: no torch.

A folder's manifest is its `manifest.json`; a result that is one JSON file carries it as its outermost "manifest"
key. `python -m ppprof.manifest PATH --command "..."` writes it for a shell script's result."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

from ppprof.io import atomic_write_json

MANIFEST_FILE = "manifest.json"
MANIFEST_KEY = "manifest"
COMMAND_ENV = "PPPROF_COMMAND"
"""Set by ppprof's launcher for its ranks: the command line the user typed, which rank 0 records."""
BY_THE_COMMAND, AFTERWARDS = "by the command", "afterwards"
"""`recorded`: written by the command that made the result, or reconstructed later from what the result holds."""
FIELDS = ("command", "git_revision", "cpu_model", "cpu_count", "date", "python", "recorded")
"""What every manifest holds (torch too where the writer imported it)."""
REPO = Path(__file__).resolve().parents[1]


def git_revision(where: str | os.PathLike = REPO) -> str | None:
    """The git commit of the source tree at `where` (ppprof's own by default), with "-dirty" when tracked files
    changed; None outside a checkout."""

    def git(*args: str) -> subprocess.CompletedProcess | None:
        try:
            return subprocess.run(["git", *args], cwd=where, capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None

    head = git("rev-parse", "HEAD")
    if head is None or head.returncode != 0:
        return None
    status = git("status", "--porcelain", "--untracked-files=no")
    dirty = status is not None and bool(status.stdout.strip())
    return head.stdout.strip() + ("-dirty" if dirty else "")


def cpu_model() -> str:
    """/proc/cpuinfo's "model name", else what platform tells."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed: ppprof's launcher's (COMMAND_ENV) where set, else this process's argv, with ppprof's
    entry point as `ppprof` and a script as `python PATH` (relative to the repository where it lies inside)."""
    if argv is None and os.environ.get(COMMAND_ENV):
        return os.environ[COMMAND_ENV]
    argv = list(sys.argv if argv is None else argv)
    first = Path(argv[0]) if argv and argv[0] else Path("python")
    if first.name == "ppprof" or (first.name == "__main__.py" and first.parent.name == "ppprof"):
        head = ["ppprof"]
    elif first.suffix == ".py":
        resolved = first.resolve()
        head = ["python", str(resolved.relative_to(REPO) if resolved.is_relative_to(REPO) else first)]
    else:
        head = [str(first)]
    return shlex.join(head + argv[1:])


def manifest(command: str | None = None, *, recorded: str = BY_THE_COMMAND, **extra) -> dict:
    """The manifest of a result made now by `command` (this process's command line by default)."""
    out = {
        "command": command or command_line(),
        "git_revision": git_revision(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "recorded": recorded,
    }
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = torch.__version__
    return out | extra


def write_manifest(folder: str | os.PathLike, command: str | None = None, **extra) -> Path:
    """FOLDER/manifest.json, atomically."""
    return atomic_write_json(Path(folder) / MANIFEST_FILE, manifest(command, **extra))


def write_result(path: str | os.PathLike, result: dict, command: str | None = None) -> Path:
    """A one-file JSON result, its manifest first, atomically (a temporary file, then os.replace)."""
    return atomic_write_json(
        path, {MANIFEST_KEY: manifest(command)} | {k: v for k, v in result.items() if k != MANIFEST_KEY}
    )


def read_manifest(path: str | os.PathLike) -> dict | None:
    """The manifest of a result: a folder's manifest.json, or a JSON file's "manifest" key; None where it has none."""
    path = Path(path)
    if path.is_dir():
        path = path / MANIFEST_FILE
        if not path.is_file():
            return None
        return json.loads(path.read_text())
    if path.suffix != ".json" or not path.is_file():
        return None
    data = json.loads(path.read_text())
    return data.get(MANIFEST_KEY) if isinstance(data, dict) else None


def script_parser(doc: str | None, out: str | None, quick: str | None = None) -> argparse.ArgumentParser:
    """The options every script under scripts/ shares: -o/--out (where its result goes, `out` by default; None:
    printed only) and, where the script has one, --quick (a run of seconds on a tiny input, what
    tests/test_scripts.py runs: `quick` says what it cuts)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "-o", "--out", default=out, help=f"where the result goes (default: {out or 'nowhere, printed only'})"
    )
    if quick:
        parser.add_argument("--quick", action="store_true", help=f"a tiny run of seconds: {quick}")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ppprof.manifest", description=__doc__)
    parser.add_argument("path", type=Path, help="a result folder (gets manifest.json) or a JSON file (gets the key)")
    parser.add_argument("--command", required=True, help="the command line that made the result")
    args = parser.parse_args(argv)
    if args.path.is_dir():
        print(write_manifest(args.path, args.command))
    elif args.path.suffix == ".json" and args.path.is_file():
        data = json.loads(args.path.read_text())
        print(write_result(args.path, data, args.command))
    else:
        parser.error(f"{args.path} is neither a folder nor a JSON file: make the result first")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The README's shell examples name real things: every `ppprof COMMAND --option` in its code blocks is a command and
an option of it, and every script and config they run exists."""

import re
from pathlib import Path

from ppprof.cli import main

REPO = Path(__file__).resolve().parents[1]


def shell_lines() -> list[str]:
    """Command lines of the README's plain code blocks (not ```python), '$ ' prompts stripped, continuations joined,
    comments dropped."""
    blocks = re.findall(r"^```\n(.*?)^```", (REPO / "README.md").read_text(), flags=re.S | re.M)
    lines = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.removeprefix("$ ").split(" #")[0].strip()
            if re.match(r"(ppprof|torchrun|bash|\.venv/bin/ppprof)\s", line):
                lines.append(line)
    return lines


def test_readme_commands_and_options_exist():
    calls = 0
    for line in shell_lines():
        for m in re.finditer(r"(?:^|\s|/)ppprof\s+([a-z][a-z-]*)(.*?)(?=&&|;|$)", line):
            name, rest = m.group(1), m.group(2)
            assert name in main.commands, line
            known = {o for p in main.commands[name].params for o in p.opts}
            used = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest)
            assert all(o in known for o in used), (line, [o for o in used if o not in known])
            calls += 1
        for path in re.findall(r"(?:scripts|configs)/[\w./-]+\.(?:sh|py|yaml)", line):
            assert (REPO / path).is_file(), (line, path)
    assert calls >= 15

"""The README and docs/ name real things: every `ppprof COMMAND --option` in their shell blocks is a command and an
option of it, every script and config they run exists, and every relative link between them reaches a file (and,
where it names one, a heading of that file)."""

import re
from pathlib import Path

from ppprof.cli import main

REPO = Path(__file__).resolve().parents[1]

PENDING_FLAGS: dict[tuple[str, str], str] = {}
"""(command, new flag) -> the flag it replaces, for a rename the docs already use and the code has not made yet: the new
flag is accepted while the command still has the old one and not the new. Delete an entry once its rename lands
(test_pending_flags_are_still_pending says when)."""


def doc_files() -> list[Path]:
    """README.md and every page of docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """(info string, body) of every fenced code block, fences paired in order (a ```python block closes at its own
    fence, so the blocks after it stay blocks)."""
    blocks, info, body = [], None, []
    for line in text.splitlines():
        fence = re.match(r"^```(.*)$", line)
        if info is None and fence:
            info, body = fence.group(1).strip(), []
        elif info is not None and line.strip() == "```":
            blocks.append((info, "\n".join(body) + "\n"))
            info = None
        elif info is not None:
            body.append(line)
    assert info is None, f"an unclosed code block (```{info})"
    return blocks


def shell_lines(path: Path) -> list[str]:
    """Command lines of a file's plain code blocks (not ```python), '$ ' prompts stripped, continuations joined,
    comments dropped."""
    lines = []
    for info, block in fenced_blocks(path.read_text()):
        if info:
            continue
        for line in block.replace("\\\n", " ").splitlines():
            line = line.removeprefix("$ ").split(" #")[0].strip()
            if re.match(r"(ppprof|torchrun|bash|\.venv/bin/ppprof)\s", line):
                lines.append(line)
    return lines


def unquoted(text: str) -> str:
    """`text` without its quoted arguments: a server's flags in `--current "..."` are not ppprof's."""
    return re.sub(r"\"(?:\\.|[^\"\\])*\"|'[^']*'", "''", text)


def known_options(name: str) -> set[str]:
    known = {o for p in main.commands[name].params for o in p.opts}
    for (command, new), old in PENDING_FLAGS.items():
        if command == name and old in known and new not in known:
            known.add(new)
    return known


def test_readme_and_docs_commands_and_options_exist():
    calls = 0
    for path in doc_files():
        where = path.relative_to(REPO)
        for line in shell_lines(path):
            for m in re.finditer(r"(?:^|\s|/)ppprof\s+([a-z][a-z-]*)(.*?)(?=&&|;|$)", unquoted(line)):
                name, rest = m.group(1), m.group(2)
                assert name in main.commands, f"{where}: {line}"
                used = re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest)
                unknown = [o for o in used if o not in known_options(name)]
                assert not unknown, f"{where}: {line}: {unknown} not options of ppprof {name}"
                calls += 1
            for named in re.findall(r"(?:scripts|configs)/[\w./-]+\.(?:sh|py|yaml)", line):
                assert (REPO / named).is_file(), f"{where}: {line}: {named} does not exist"
    assert calls >= 15, f"{calls=}: the shell blocks of README.md and docs/ lost their examples"


def test_docs_examples_cover_every_command():
    used = {
        m.group(1)
        for path in doc_files()
        for line in shell_lines(path)
        for m in re.finditer(r"(?:^|\s|/)ppprof\s+([a-z][a-z-]*)", line)
    }
    assert set(main.commands) <= used, f"commands without an example in README.md or docs/: {set(main.commands) - used}"


def test_pending_flags_are_still_pending():
    for (command, new), old in PENDING_FLAGS.items():
        known = {o for p in main.commands[command].params for o in p.opts}
        assert old in known and new not in known, (
            f"ppprof {command} now has {new} (or no longer {old}): delete ({command!r}, {new!r}) from PENDING_FLAGS"
        )


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a markdown file's headings, outside code blocks, with GitHub's -1, -2 for repeats."""
    out, seen, in_code = set(), {}, False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        elif not in_code and (m := re.match(r"^#{1,6}\s+(.*)$", line)):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every markdown link and image outside code blocks and code spans."""
    out, in_code = [], False
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            continue
        prose = re.sub(r"`[^`]*`", "", line)
        out += [(number, m.group(1)) for m in re.finditer(r"!?\[[^\]]*\]\(([^)\s]+)\)", prose)]
    return out


def test_relative_links_resolve():
    checked = 0
    for path in doc_files():
        where = path.relative_to(REPO)
        for number, target in links(path):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            assert dest.exists(), f"{where}:{number}: link {target!r}: {file} does not exist"
            if anchor and dest.suffix == ".md":
                assert anchor in anchors(dest), (
                    f"{where}:{number}: link {target!r}: no heading of {dest.relative_to(REPO)} has the anchor "
                    f"#{anchor}; its anchors: {sorted(anchors(dest))}"
                )
            checked += 1
    assert checked >= 10, f"{checked=}: README.md and docs/ should link each other"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(REPO / t.partition("#")[0]).resolve() for _, t in links(REPO / "README.md")}
    pages = set((REPO / "docs").glob("*.md"))
    assert {p.resolve() for p in pages} <= linked, f"docs pages the README does not link: {pages - linked}"

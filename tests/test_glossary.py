"""One word per concept: the glossary in docs/architecture.md (word | meaning | retired synonyms) is parsed, and a retired
synonym found in ppprof/**/*.py, README.md or docs/*.md outside that table fails, naming the file, the line, the
synonym and the word to use."""

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GLOSSARY = REPO / "docs" / "architecture.md"
HEADER = ["word", "meaning", "retired synonyms"]

DOCS_ONLY: set[str] = set()
"""Retired synonyms checked in README.md and docs/ only, while the code still has them. Delete a line once its rename
lands, and the code is checked too (test_docs_only_entries_are_still_in_the_code says when)."""

FILE_FIELDS = {"num_stages"}
"""Retired identifiers that stay the names of file fields (policy.json, the commands' JSON): in Python they are
checked as identifiers only (a string may name the field), in README.md and docs/ not at all (the docs name the
fields). The glossary marks them "(a file field only)"."""

KEPT = {
    (
        "history_len",
        "ppprof/policy/runtime.py",
    ): "",  # Policy.next_chunk_size(history_len=...), the alias for 0.1 readers
    ("history_len", "docs/policy.md"): "ppprof 0.1",
    ("chunk_len", "ppprof/fit/samples.py"): "ppprof 0.1",  # samples.csv of ppprof 0.1: the column is read as chunk_size
    ("chunk_len", "docs/policy.md"): "ppprof 0.1",
    (
        "ppprof export --format",
        "ppprof/commands/export.py",
    ): "fmt",  # export's hidden --format, the old name of --server
}
"""(synonym, file) -> where an old name stays on purpose, for compatibility: on every line of the file (""), or on the
lines that hold the marker. An entry nothing needs any longer fails test_kept_entries_are_still_needed."""


@dataclass(frozen=True)
class Synonym:
    """A retired name, as the glossary writes it: an identifier (`chunk_len`), a flag (`--name`), or a flag of one
    command (`ppprof export --format`)."""

    text: str
    word: str
    command: str | None
    pattern: re.Pattern

    @classmethod
    def parse(cls, text: str, word: str) -> "Synonym":
        if m := re.fullmatch(r"ppprof ([a-z][a-z-]*) (--[a-z][a-z0-9-]*)", text):
            return cls(text, word, m.group(1), re.compile(rf"(?<![\w-]){re.escape(m.group(2))}(?![\w-])"))
        if re.fullmatch(r"--[a-z][a-z0-9-]*", text):
            return cls(text, word, None, re.compile(rf"(?<![\w-]){re.escape(text)}(?![\w-])"))
        if re.fullmatch(r"[A-Za-z_]\w*", text):
            return cls(text, word, None, re.compile(rf"(?<!\w){re.escape(text)}(?!\w)"))
        raise ValueError(
            f"glossary: retired synonym {text!r} (of {word}) is not an identifier, a --flag or 'ppprof COMMAND --flag'"
        )

    def hits(self, line: str, file_text: str, markdown: bool) -> bool:
        """Whether `line` uses this synonym. A command's flag counts in markdown after the command's name on the
        line, in Python anywhere in a module that names the command."""
        if self.command is None:
            return bool(self.pattern.search(line))
        command = re.compile(rf"(?<![\w-]){re.escape(self.command)}(?![\w-])")
        if markdown:
            return any(self.pattern.search(line, m.end()) for m in command.finditer(line))
        return bool(self.pattern.search(line)) and bool(command.search(file_text))


def cells(row: str) -> list[str]:
    """The cells of a markdown table row; `\\|` stays inside its cell."""
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))]


def glossary_rows() -> tuple[list[tuple[str, str, str]], range]:
    """The glossary table's rows (word, meaning, retired synonyms) and the 1-based line numbers the table spans."""
    lines = GLOSSARY.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|") and cells(line) == HEADER)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    rows = [tuple(cells(line)) for line in lines[start + 2 : end]]
    assert all(len(r) == 3 for r in rows), f"glossary rows without 3 cells: {[r for r in rows if len(r) != 3]}"
    return rows, range(start + 1, end + 1)


def synonyms() -> list[Synonym]:
    out = []
    for word, _, retired in glossary_rows()[0]:
        if retired.strip() in ("", "-"):
            continue
        for text in re.findall(r"`([^`]+)`", retired):
            out.append(Synonym.parse(text, word.replace("`", "")))
    return out


def scanned_files(markdown_only: bool = False) -> list[Path]:
    docs = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    return docs if markdown_only else docs + sorted((REPO / "ppprof").rglob("*.py"))


def uses(synonym: Synonym, path: Path) -> list[tuple[int, str]]:
    """(line number, line) where `path` uses `synonym`, the glossary table left out."""
    text = path.read_text()
    table = glossary_rows()[1] if path == GLOSSARY else range(0)
    return [
        (n, line)
        for n, line in enumerate(text.splitlines(), 1)
        if n not in table and synonym.hits(line, text, path.suffix == ".md")
    ]


def kept(synonym: Synonym, path: Path, line: str) -> bool:
    marker = KEPT.get((synonym.text, str(path.relative_to(REPO))))
    return marker is not None and marker in line


def test_the_glossary_table_parses():
    rows, _ = glossary_rows()
    assert len(rows) >= 10, f"{len(rows)=}"
    words = {w.replace("`", "") for w, _, _ in rows}
    found = synonyms()
    assert found, "the glossary retires no synonym"
    assert not [s.text for s in found if s.text in words], "a retired synonym is also a word of the glossary"
    assert {s.text for s in found} >= DOCS_ONLY | {s for s, _ in KEPT}, "DOCS_ONLY or KEPT names no glossary entry"


def identifiers(text: str) -> dict[str, int]:
    """{identifier: first line} of a module's names: variables, attributes, arguments, keywords, functions, classes
    and imported names; string contents are not identifiers."""
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(text)):
        names = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.keyword) and node.arg:
            names = [node.arg]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names = [node.name]
        elif isinstance(node, ast.alias):
            names = [node.asname or node.name.rsplit(".", 1)[-1]]
        for name in names:
            found.setdefault(name, getattr(node, "lineno", 0))
    return found


def test_no_identifier_of_the_package_is_a_retired_synonym():
    """The package's identifiers (not only its lines) against the glossary: none is a retired identifier."""
    retired = {s.text: s.word for s in synonyms() if s.command is None and not s.text.startswith("--")}
    problems = []
    for path in sorted((REPO / "ppprof").rglob("*.py")):
        for name, line in identifiers(path.read_text()).items():
            if name in retired and not kept(Synonym.parse(name, retired[name]), path, "\n"):
                problems.append(f"{path.relative_to(REPO)}:{line}: `{name}` is retired: use `{retired[name]}`")
    assert problems == [], "\n".join(problems)


def test_the_glossary_words_are_the_package_identifiers():
    """Every glossary word written as an identifier (`pp_size`, `chunk_unit`, ...) is one in the package, or the
    name of a file field it writes (a string: `slowest_stage`, a samples.csv column)."""
    used = set()
    for path in (REPO / "ppprof").rglob("*.py"):
        text = path.read_text()
        used |= set(identifiers(text))
        used |= {n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    words = [w.strip("`") for w, _, _ in glossary_rows()[0] if re.fullmatch(r"`[a-z_][a-z0-9_]*`", w)]
    assert words and [w for w in words if w not in used] == []


def test_the_identifier_check_sees_names_not_strings():
    found = identifiers('def f(num_stages):\n    x = obj.num_stages\n    return {"num_stages": x}\n')
    assert "num_stages" in found and found["num_stages"] == 1
    assert "num_stages" not in identifiers('d = {"num_stages": 2}\n')


def test_no_retired_synonym_comes_back():
    problems = []
    for synonym in synonyms():
        if synonym.text in FILE_FIELDS:  # checked as an identifier (above): a string names the file field
            continue
        for path in scanned_files(markdown_only=synonym.text in DOCS_ONLY):
            for n, line in uses(synonym, path):
                if not kept(synonym, path, line):
                    problems.append(
                        f"{path.relative_to(REPO)}:{n}: `{synonym.text}` is retired: use `{synonym.word}`"
                        f"  | {line.strip()[:100]}"
                    )
    if problems:
        pytest.fail("retired synonyms (see the glossary, docs/architecture.md):\n" + "\n".join(problems), pytrace=False)


def test_docs_only_entries_are_still_in_the_code():
    by_text = {s.text: s for s in synonyms()}
    for text in DOCS_ONLY:
        code = [p for p in scanned_files() if p.suffix == ".py" and uses(by_text[text], p)]
        assert code, f"`{text}` is gone from ppprof/: delete it from DOCS_ONLY, so the code is checked too"


def test_kept_entries_are_still_needed():
    by_text = {s.text: s for s in synonyms()}
    for (text, name), marker in KEPT.items():
        path = REPO / name
        assert path.is_file(), f"KEPT names {name}, which does not exist"
        assert any(marker in line for _, line in uses(by_text[text], path)), (
            f"{name} no longer uses `{text}`{f' on a line with {marker!r}' if marker else ''}: delete it from KEPT"
        )


@pytest.mark.parametrize(
    "text, line, markdown, expected",
    [
        ("chunk_len", "a `chunk_len` column", True, True),
        ("chunk_len", "max_chunk_len = 3", False, False),
        ("chunk_len", "chunk_length = 3", False, False),
        ("--format", "ppprof compare A B --format json", True, True),
        ("--format", "--format-version 2", True, False),
        ("ppprof export --format", "ppprof export POLICY --format sglang", True, True),
        ("ppprof export --format", "`export --format sglang` says which fit", True, True),
        ("ppprof export --format", "ppprof compare A B --format json", True, False),
        ("ppprof export --format", "--format before export", True, False),
    ],
)
def test_a_synonym_matches_precisely(text, line, markdown, expected):
    synonym = Synonym.parse(text, "new")
    assert synonym.hits(line, line, markdown) is expected, f"{text=} {line=} {markdown=}"


def test_a_command_flag_in_python_counts_only_in_a_module_that_names_the_command():
    synonym = Synonym.parse("ppprof export --format", "--server")
    line = '@click.option("--format", type=str)'
    assert synonym.hits(line, line + "\ndef export(fmt): ...", markdown=False)
    assert not synonym.hits(line, line + "\ndef compare(fmt): ...", markdown=False)

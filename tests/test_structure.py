"""The shape the package keeps: short functions, click only in the command layer, settings never made from a
hand-built run.json dict."""

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "ppprof"
MAX_FUNCTION_LINES = 60
MAX_MODULE_LINES = 330
LONGER = {"ppprof/policy/contract.py": 500}
"""Modules allowed past MAX_MODULE_LINES, each with its own most lines, and why: the policy contract a server imports
is one module (its parts, their checks and bounds), so that `import ppprof.sglang.sizer` loads at most 12 of ppprof's
modules (issue 47); cut in two, it would cost a thirteenth."""
COMMAND_LAYER = ("ppprof/cli.py", "ppprof/commands/")


def sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        yield path.relative_to(PACKAGE.parent).as_posix(), path.read_text()


def long_functions(files) -> list[str]:
    """'path:line name (N lines)' of every function (decorators included) longer than MAX_FUNCTION_LINES."""
    out = []
    for name, text in files:
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                lines = node.end_lineno - first + 1
                if lines > MAX_FUNCTION_LINES:
                    out.append(f"{name}:{first} {node.name} ({lines} lines)")
    return out


def test_no_function_is_over_60_lines():
    assert long_functions(sources()) == []


def test_the_length_check_catches_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions([("m.py", f"def f():\n{body}\n")]) == [f"m.py:1 f ({MAX_FUNCTION_LINES + 1} lines)"]


def long_modules(files) -> list[str]:
    """'path (N lines)' of every module longer than MAX_MODULE_LINES."""
    out = []
    for name, text in files:
        lines = len(text.splitlines())
        if lines > LONGER.get(name, MAX_MODULE_LINES):
            out.append(f"{name} ({lines} lines)")
    return out


def test_no_module_is_over_330_lines():
    assert long_modules(sources()) == []


def test_the_module_length_check_catches_a_long_module():
    short = "\n".join(f"x{i} = {i}" for i in range(MAX_MODULE_LINES))
    long = short + "\ny = 0\n"
    assert long_modules([("a.py", short + "\n"), ("b.py", long)]) == [f"b.py ({MAX_MODULE_LINES + 1} lines)"]


def test_only_the_command_layer_imports_click():
    users = [name for name, text in sources() if re.search(r"^\s*(import click|from click\b)", text, re.M)]
    assert [u for u in users if not u.startswith(COMMAND_LAYER)] == []


def test_no_settings_are_built_from_a_hand_made_run_json_dict():
    hits = [
        f"{name}:{text[: m.start()].count(chr(10)) + 1}"
        for name, text in sources()
        for m in re.finditer(r"\{\s*[\"']config[\"']\s*:", text)
    ]
    assert hits == []

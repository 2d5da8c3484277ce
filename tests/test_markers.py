"""The multirank mark means what scripts/test.sh runs it for: every test marked multirank starts real ranks (a
profile or bench through the launcher, torchrun, or spawned gloo processes), and no test that does is left unmarked,
so that the in-process phase, spread over workers, starts none."""

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
STARTERS = {"run_cli", "start", "start_processes"}
"""Calls that start ranks: tests.multirank.run_cli, tests.run.test_faults.start, torch.multiprocessing's."""
LAUNCHES = ("'-m', 'ppprof', 'profile'", "'-m', 'ppprof', 'bench'", "'-m', 'ppprof', 'serve-bench'")
"""A subprocess.run / Popen of `python -m ppprof profile`, `bench` or `serve-bench` starts ranks too (the
launcher's)."""
REFUSED_BEFORE_RANKS = {"run/test_fault_input.py::test_a_write_refused_by_the_disk_names_the_file_and_leaves_nothing"}
"""Subprocesses of `ppprof profile` that end before any rank starts (a limit set on the subprocess alone)."""


def is_multirank(node: ast.expr) -> bool:
    return "pytest.mark.multirank" in ast.unparse(node)


def starts_ranks(fn: ast.FunctionDef, helpers: dict[str, ast.FunctionDef], seen: frozenset = frozenset()) -> bool:
    assigned = {
        t.id: ast.unparse(n.value)
        for n in ast.walk(fn)
        if isinstance(n, ast.Assign)
        for t in n.targets
        if isinstance(t, ast.Name)
    }
    for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
        name = call.func.attr if isinstance(call.func, ast.Attribute) else getattr(call.func, "id", "")
        if name == "start_processes" or (isinstance(call.func, ast.Name) and name in STARTERS):
            return True
        if name in ("run", "Popen") and call.args:
            argv = assigned.get(getattr(call.args[0], "id", None)) or ast.unparse(call.args[0])
            if any(launch in argv for launch in LAUNCHES):
                return True
        if name in helpers and name not in seen and starts_ranks(helpers[name], helpers, seen | {name}):
            return True
    return False


def marks_of_every_test() -> dict[str, tuple[bool, bool]]:
    """{module::test: (marked multirank, starts ranks)} of every test module."""
    out = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_mark = any(
            isinstance(n, ast.Assign)
            and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
            and is_multirank(n.value)
            for n in tree.body
        )
        helpers = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        for fn in helpers.values():
            if fn.name.startswith("test_"):
                marked = module_mark or any(is_multirank(d) for d in fn.decorator_list)
                key = f"{path.relative_to(TESTS)}::{fn.name}"
                out[key] = (marked, starts_ranks(fn, helpers) and key not in REFUSED_BEFORE_RANKS)
    return out


def test_every_multirank_test_starts_ranks_and_every_test_that_starts_ranks_is_multirank():
    found = marks_of_every_test()
    assert sum(marked for marked, _ in found.values()) >= 20, found
    idle = [t for t, (marked, starts) in found.items() if marked and not starts]
    unmarked = [t for t, (marked, starts) in found.items() if starts and not marked]
    assert not idle, f"marked multirank but start no rank (move them out of the multirank module): {idle}"
    assert not unmarked, f"start ranks but are not marked multirank: {unmarked}"


def test_the_check_tells_a_rank_starter_from_an_input_check():
    tree = ast.parse(
        'def helper():\n    return run_cli("profile")\n'
        "def test_a():\n    helper()\n"
        'def test_b():\n    CliRunner().invoke(main, ["profile", "--tp-size", "3"])\n'
        'def test_c():\n    subprocess.run(["bash", "-n", "x.sh"])\n'
        'def test_d():\n    cmd = [sys.executable, "-m", "ppprof", "profile"]\n    subprocess.Popen(cmd)\n'
    )
    helpers = {n.name: n for n in tree.body}
    assert [starts_ranks(helpers[t], helpers) for t in ("test_a", "test_b", "test_c", "test_d")] == [
        True,
        False,
        False,
        True,
    ]


def test_pytest_recurses_into_every_folder_of_tests(request):
    # pytest skips folders named like its norecursedirs (build, dist, ...): tests/dist went unrun so
    import fnmatch

    patterns = request.config.getini("norecursedirs")
    skipped = [
        d
        for d in TESTS.rglob("*")
        if d.is_dir()
        and d.name != "__pycache__"
        and any(fnmatch.fnmatch(d.name, p) for p in patterns)
        and list(d.rglob("test_*.py"))
    ]
    assert not skipped, f"pytest never collects the tests in {skipped}: rename the folder"

"""The layers of ppprof, written down and kept: every import (inside functions too) goes down or sideways within a
package, never up, and no two modules import each other through any chain."""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "ppprof"

LAYERS = (
    ("ppprof", "ppprof.bounds", "ppprof.checks", "ppprof.io"),
    ("ppprof.chunks",),
    ("ppprof.mem",),
    ("ppprof.distributed",),
    ("ppprof.plotting", "ppprof.specs"),
    ("ppprof.config",),
    ("ppprof.forwards", "ppprof.manifest", "ppprof.model", "ppprof.policy", "ppprof.runfiles", "ppprof.traces"),
    ("ppprof.servers",),
    ("ppprof.serving",),
    ("ppprof.fit",),
    ("ppprof.compare",),
    ("ppprof.probe",),
    ("ppprof.adaptive",),
    ("ppprof.bench",),
    ("ppprof.run",),
    ("ppprof.commands",),
    ("ppprof.cli", "ppprof.sglang"),
    ("ppprof.__main__",),
)
"""Lowest first. A module may import modules of its own unit (its subpackage) and of any unit in a lower layer."""

TORCH_FREE = (
    "ppprof.bounds",
    "ppprof.checks",
    "ppprof.chunks",
    "ppprof.io",
    "ppprof.forwards",
    "ppprof.traces",
    "ppprof.plotting",
    "ppprof.policy",
    "ppprof.servers",
    "ppprof.fit",
    "ppprof.compare",
    "ppprof.serving",
    "ppprof.manifest",
    "ppprof.runfiles",
    "ppprof.config",
    "ppprof.specs",
    "ppprof.adaptive.design",
    "ppprof.adaptive.uncertainty",
    "ppprof.adaptive.probes",
    "ppprof.adaptive.step",
    "ppprof.sglang",
    "ppprof.distributed.coords",
    "ppprof.distributed.parent",
    "ppprof.distributed.procfs",
    "ppprof.distributed.rankstate",
    "ppprof.distributed.stop",
)
DISTRIBUTED = ("ppprof.distributed", "ppprof.run")
"""The only units that may touch torch.distributed."""


def module_name(path: Path) -> str:
    """ppprof/probe/loop.py -> ppprof.probe.loop, wherever the ppprof folder lies."""
    parts = list(path.with_suffix("").parts)
    parts = parts[len(parts) - 1 - parts[::-1].index("ppprof") :]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[str, int]]:
    """Every module `path` imports, anywhere in the file (module level, functions, classes), with the line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.append((base, node.lineno))
            out += [(f"{base}.{alias.name}", node.lineno) for alias in node.names]
    return out


def graph(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """module -> {imported ppprof module: line}; `from pkg import name` counts as importing pkg.name where that
    is a module, else pkg."""
    files = {module_name(p): p for p in package.rglob("*.py")}
    edges = {}
    for name, path in files.items():
        edges[name] = {}
        for target, line in imports(path):
            if target in files and target != name:
                edges[name].setdefault(target, line)
    return edges


def unit(module: str) -> str:
    """The layer unit of a module: the longest unit name in LAYERS that is the module or a package above it."""
    units = [u for layer in LAYERS for u in layer if module == u or module.startswith(u + ".")]
    return max(units, key=len)


def layer_of(module: str) -> int:
    u = unit(module)
    return next(i for i, layer in enumerate(LAYERS) if u in layer)


def upward_imports(edges) -> list[str]:
    bad = []
    for source, targets in edges.items():
        for target, line in targets.items():
            if unit(target) == unit(source) or target == "ppprof":
                continue
            if layer_of(target) >= layer_of(source):
                bad.append(f"{source}:{line} imports {target} (layer {layer_of(target)} >= {layer_of(source)})")
    return bad


def cycles(edges) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                out.append(sorted(scc))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def external_imports(prefixes: tuple[str, ...], forbidden: str) -> list[str]:
    bad = []
    for path in PACKAGE.rglob("*.py"):
        name = module_name(path)
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            bad += [
                f"{name}:{line} imports {target}"
                for target, line in imports(path)
                if target == forbidden or target.startswith(forbidden + ".")
            ]
    return bad


def without_package_inits(edges):
    """A package's __init__ re-exports its modules, and those modules may import siblings through it: that is one
    unit, not a cycle between modules, so edges into a package's own __init__ from inside it are dropped."""
    return {
        s: {t: n for t, n in ts.items() if not (t in edges and s.startswith(t + ".") and t != "ppprof")}
        for s, ts in edges.items()
    }


def test_every_module_has_a_layer():
    for name in graph():
        assert layer_of(name) is not None, f"{name=} is in no layer: add it to LAYERS"


def test_no_import_goes_up_a_layer():
    assert upward_imports(graph()) == []


def test_no_import_cycle_between_modules():
    assert cycles(without_package_inits(graph())) == []


def test_mem_imports_nothing_of_ppprof_outside_mem():
    assert [
        f"{s} imports {t}"
        for s, ts in graph().items()
        if s.startswith("ppprof.mem")
        for t in ts
        if not t.startswith("ppprof.mem")
    ] == []


def test_pure_layers_never_import_torch_and_only_dist_and_run_touch_torch_distributed():
    assert external_imports(TORCH_FREE, "torch") == []
    others = tuple(u for layer in LAYERS for u in layer if u not in DISTRIBUTED and u != "ppprof")
    assert external_imports(others, "torch.distributed") == []


@pytest.mark.parametrize(
    "line",
    [
        "from ppprof.run.profile_job import PHASES",
        "def phases():\n    from ppprof.run import profile_job\n    return profile_job.PHASES",
    ],
)
def test_the_check_catches_an_upward_import_into_probe_even_inside_a_function(tmp_path, line):
    import shutil

    copy = tmp_path / "ppprof"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "probe" / "synth.py").open("a") as f:
        f.write("\n" + line + "\n")
    edges = graph(copy)
    bad = upward_imports(edges)
    assert any(b.startswith("ppprof.probe.synth:") and "ppprof.run" in b for b in bad), f"{bad=}"
    assert ["ppprof.probe.synth", "ppprof.run.profile_job"] in [
        [m for m in c if m in ("ppprof.probe.synth", "ppprof.run.profile_job")]
        for c in cycles(without_package_inits(edges))
    ], "run.profile_job imports probe.synth, so the new import closes a cycle"


@pytest.mark.parametrize("line", ["from ppprof.runfiles import FAILED", "from ppprof.specs.tp import check_tp"])
def test_the_check_catches_distributed_importing_above_the_bottom_floors(tmp_path, line):
    import shutil

    copy = tmp_path / "ppprof"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    with (copy / "distributed" / "watchdog.py").open("a") as f:
        f.write("\n" + line + "\n")
    target = line.split()[1]
    assert any(b.startswith("ppprof.distributed.watchdog:") and target in b for b in upward_imports(graph(copy)))


def test_the_servers_import_no_click_sklearn_or_pandas():
    """ppprof.servers is pure: the commands that use it (click) and the fits below it (sklearn, pandas) stay out."""
    for forbidden in ("click", "sklearn", "pandas"):
        assert external_imports(("ppprof.servers",), forbidden) == [], forbidden


SERVER_CONTRACT = {
    "ppprof.policy.contract": (),
    "ppprof.policy.runtime": ("ppprof.policy.rebuilt", "ppprof.policy.structure", "ppprof.policy.rule"),
}
"""The policy contract a server imports (issue 47), and what each may import inside a function (runtime: the checks of
a load, SGLang's rule for a parity policy): at module level the standard library and ppprof's floors below
ppprof.policy that import nothing heavy (the ground, ppprof.chunks), and the contract itself."""
CONTRACT_MAY_IMPORT = ("ppprof.bounds", "ppprof.checks", "ppprof.chunks", "ppprof.io", "ppprof.policy.contract")


def top_and_inner_imports(path: Path) -> tuple[set[str], set[str]]:
    """(modules `path` imports at module level, modules it imports inside functions)."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    at_top, inner = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
            (at_top if id(node) in top else inner).update(names)
    return at_top, inner


@pytest.mark.parametrize("module", SERVER_CONTRACT)
def test_the_policy_contract_imports_the_standard_library_and_the_ground_only(module):
    import sys

    at_top, inner = top_and_inner_imports(PACKAGE.parent / (module.replace(".", "/") + ".py"))
    foreign = {m for m in at_top if m.split(".")[0] not in sys.stdlib_module_names and m not in CONTRACT_MAY_IMPORT}
    assert foreign == set(), f"{module}: {foreign=}"
    assert inner <= set(SERVER_CONTRACT[module]), f"{module}: {inner=}"

import subprocess
import sys

HEAVY = ("torch", "pandas", "sklearn", "matplotlib")


def loaded_after(statement: str) -> list[str]:
    code = f"import sys; {statement}; print(' '.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_policy_imports_no_heavy_module():
    assert loaded_after("import ppprof.policy") == []
    assert loaded_after("import ppprof.policy.planners, ppprof.policy.export, ppprof.policy.timeline") == []


def test_fit_does_not_import_torch():
    assert "torch" not in loaded_after("import ppprof.fit, ppprof.fit.cli, ppprof.fit.plots")

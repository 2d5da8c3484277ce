import subprocess
import sys
from pathlib import Path

HEAVY = ("torch", "pandas", "sklearn", "matplotlib")
POLICY = Path(__file__).resolve().parents[2] / "results" / "baseline" / "policy.json"


def loaded_after(statement: str, modules=HEAVY) -> list[str]:
    code = f"import sys; {statement}; print(' '.join(m for m in {modules!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_policy_imports_no_heavy_module():
    assert loaded_after("import ppprof.policy") == []
    assert (
        loaded_after(
            "import ppprof.policy.planners, ppprof.policy.timeline, ppprof.servers.export, ppprof.servers.tune"
        )
        == []
    )


def test_a_server_loading_a_policy_imports_no_heavy_module_and_jsonschema_only_when_it_loads():
    assert loaded_after("import ppprof.policy", ("jsonschema",)) == []
    statement = f"import ppprof.policy; ppprof.policy.load({str(POLICY)!r}).next_chunk_size(4096)"
    assert loaded_after(statement) == []
    assert loaded_after(statement, ("jsonschema",)) == ["jsonschema"]


def test_fit_does_not_import_torch():
    assert "torch" not in loaded_after("import ppprof.fit, ppprof.fit.plots")

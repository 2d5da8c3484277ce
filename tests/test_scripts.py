"""Every file under scripts/ runs in a test, so none rots: each benchmark and experiment on a tiny input (its --quick,
or the committed results it re-reads), where a run needs minutes or ranks its --help; each result it writes carries
its manifest (ppprof.manifest). A new file under scripts/ that no case here names fails the last test."""

import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from ppprof.manifest import FIELDS, read_manifest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"
BASELINE = "results/baseline"
BENCH = "results/bench-reference/pp2"
BENCH_POLICY = "results/bench-reference/profile/policy.json"

RUNS = {
    "benchmarks/alloc.py": ["--quick"],
    "benchmarks/fit_cost.py": ["--quick"],
    "benchmarks/forward.py": ["--quick"],
    "benchmarks/forward_trace.py": ["--quick"],
    "benchmarks/memory.py": ["--quick"],
    "benchmarks/planner.py": ["--quick"],
    "benchmarks/policy.py": ["--quick"],
    "experiments/atom_under_load.py": [],
    "experiments/calibrate.py": [BENCH, BENCH_POLICY],
    "experiments/confidence_offline.py": ["--quick"],
    "experiments/holdout.py": ["results/baseline-intel-xeon/policy.json", BASELINE],
    "experiments/repredict.py": [BENCH, BENCH_POLICY],
    "experiments/under_load_sim.py": ["--quick"],
    "experiments/trace_replay.py": ["--quick"],
    "experiments/serving_paired.py": ["results/serving-real"],
    "experiments/confidence_host.py": ["tests/runs"],
    "experiments/design_agreement.py": ["results/design-agreement", "--summary-only"],
}
"""Scripts run whole on a tiny input, each writing its one-file result to -o: its arguments but -o."""

HELP_ONLY = {
    "benchmarks/model_domain.py": "profiles and benches for minutes (ranks)",
    "benchmarks/profile_cost.py": "profiles for minutes (ranks)",
    "benchmarks/forward_trace_serving.py": "serves twenty times, tracing on and off, for minutes (ranks)",
    "experiments/bench_reference.sh": "profiles and benches for half an hour (ranks)",
    "experiments/bench_tune.sh": "profiles, tunes and benches for minutes (ranks)",
    "experiments/serving_real.sh": "profiles and serves for a quarter of an hour (ranks)",
    "experiments/trace_real.sh": "profiles and replays a trace window for about 20 minutes (ranks)",
    "experiments/confidence_host.sh": "profiles nine times, about 25 minutes (ranks)",
    "experiments/tp_compare.sh": "profiles at TP1 and TP2 (ranks)",
    "experiments/loop_closed.py": "serves, calibrates and serves again for minutes (ranks)",
    "experiments/robust_load.py": "fits four policies and serves about a thousand levels (3 minutes)",
    "sglang_check.py": "needs SGLang and two GPUs",
}
"""Scripts whose run needs minutes, ranks or GPUs: their --help exits 0 (Python ones in-process, without ranks)."""

OPERATIONS = {
    "setup.sh": "builds the .venv every test runs from (the suite cannot start without it)",
    "test.sh": "the suite's own command (.ci/run and tests/test_ci.py)",
    "ci_profile.sh": "tests/test_ci.py",
    "gpu_check.sh": "tests/run/test_tp.py (its syntax and its TP profile's flags); its syntax here too",
}
"""Operations scripts at the top of scripts/ and the test that runs or reads each."""


def every_script() -> list[str]:
    return sorted(
        str(p.relative_to(SCRIPTS)) for p in SCRIPTS.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )


@pytest.mark.parametrize("script", sorted(RUNS))
def test_the_script_runs_on_a_tiny_input_and_writes_its_manifest(script, tmp_path):
    out = tmp_path / "result.json"
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), *RUNS[script], "-o", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 0, f"{script}: {done.stderr[-3000:]}"
    manifest = read_manifest(out)
    assert manifest is not None, f"{script} wrote no manifest into {out}"
    assert set(FIELDS) <= set(manifest), f"{script}: {manifest=}"
    assert manifest["command"].startswith(f"python scripts/{script} "), manifest["command"]
    assert manifest["recorded"] == "by the command"
    assert len(json.loads(out.read_text())) > 1, "a manifest and nothing else"


@pytest.mark.parametrize("script", sorted(HELP_ONLY))
def test_the_long_script_has_a_help(script, capsys, monkeypatch):
    path = SCRIPTS / script
    if path.suffix == ".sh":
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
        done = subprocess.run(["bash", str(path), "--help"], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0 and f"bash scripts/{script}" in done.stdout, done.stdout + done.stderr
        assert "ppprof.manifest" in path.read_text(), f"{script} writes no manifest of its result"
        return
    monkeypatch.setattr(sys, "argv", [str(path), "--help"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(path), run_name="__main__")
    assert stop.value.code == 0
    assert "-o OUT" in capsys.readouterr().out  # the shared options (ppprof.manifest.script_parser)


@pytest.mark.parametrize("script", sorted(s for s in OPERATIONS if s.endswith(".sh")))
def test_the_operations_scripts_parse(script):
    assert subprocess.run(["bash", "-n", str(SCRIPTS / script)]).returncode == 0


def test_every_file_under_scripts_is_run_by_a_test():
    named = set(RUNS) | set(HELP_ONLY) | set(OPERATIONS)
    assert not set(RUNS) & set(HELP_ONLY)
    unrun = [s for s in every_script() if s not in named]
    assert unrun == [], (
        f"{unrun}: add each to RUNS (a tiny run, --quick) or HELP_ONLY (--help, where a run needs "
        "minutes, ranks or GPUs) in tests/test_scripts.py"
    )
    gone = sorted(named - set(every_script()))
    assert gone == [], f"{gone} named in tests/test_scripts.py are gone from scripts/"


def test_a_shell_result_gets_its_manifest_from_the_module(tmp_path):
    """What the shell scripts run at their end: `python -m ppprof.manifest OUT --command ...`."""
    folder, result = tmp_path / "run", tmp_path / "result.json"
    folder.mkdir()
    result.write_text('{"figure": 1}')
    for path in (folder, result):
        done = subprocess.run(
            [sys.executable, "-m", "ppprof.manifest", str(path), "--command", "bash x.sh a"],
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        assert done.returncode == 0, done.stderr
        assert read_manifest(path)["command"] == "bash x.sh a"
    assert json.loads(result.read_text())["figure"] == 1
    done = subprocess.run(
        [sys.executable, "-m", "ppprof.manifest", str(tmp_path / "none"), "--command", "x"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert done.returncode == 2 and "neither a folder nor a JSON file" in done.stderr


@pytest.mark.parametrize("script", sorted(str(p.relative_to(SCRIPTS)) for p in SCRIPTS.rglob("*.sh")))
def test_a_shell_script_runs_from_the_repository_root(script):
    # Scripts moved into scripts/experiments/ once kept `cd "$(dirname "$0")/.."`, which lands in scripts/, and every
    # `bash scripts/setup.sh` after it failed; only their --help ran in a test.
    text = (SCRIPTS / script).read_text()
    marker = 'cd "$(dirname "$0")/'
    assert marker in text, f"{script} does not cd to the repository root"
    up = text.split(marker, 1)[1].split('"', 1)[0]
    assert ((SCRIPTS / script).parent / up).resolve() == REPO, f"{script}: cd {up} from its folder is not the root"

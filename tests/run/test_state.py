"""The jobs' phases read only fields their state has: checked on the source, so that a misspelt field fails here and
not in the last phase of a multi-rank run."""

import ast
import dataclasses
from pathlib import Path

import pytest

from ppprof.run.bench_job import BenchState
from ppprof.run.profile_job import ProfileState
from ppprof.run.rank import RankRun

RUN = Path(__file__).resolve().parents[2] / "ppprof" / "run"


def reads(path: Path) -> tuple[set[str], set[str]]:
    """({name of every `run.<name>`}, {name of every `run.state.<name>`}) in the file."""
    on_run, on_state = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Attribute):
            continue
        if isinstance(node.value, ast.Name) and node.value.id == "run":
            on_run.add(node.attr)
        elif (
            isinstance(node.value, ast.Attribute)
            and node.value.attr == "state"
            and isinstance(node.value.value, ast.Name)
            and node.value.value.id == "run"
        ):
            on_state.add(node.attr)
    return on_run, on_state


def names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)} | {k for k, v in vars(cls).items() if isinstance(v, property)}


@pytest.mark.parametrize(
    "module,state",
    [
        ("profile_job.py", ProfileState),
        ("measure.py", ProfileState),
        ("profile_results.py", ProfileState),
        ("bench_job.py", BenchState),
        ("rank.py", None),
    ],
)
def test_every_field_a_phase_reads_is_one_of_its_run_and_state(module, state):
    on_run, on_state = reads(RUN / module)
    assert on_run - names(RankRun) == set(), f"{module}: RankRun has no {sorted(on_run - names(RankRun))}"
    assert on_state - (names(state) if state else set()) == set(), (
        f"{module}: {state and state.__name__} has no {sorted(on_state - names(state) if state else on_state)}"
    )
    if state is not None:
        assert on_state, f"{module=} reads no run.state field: the check would pass on anything"


def test_the_check_catches_a_misspelt_field(tmp_path):
    path = tmp_path / "phase.py"
    path.write_text("def phase(run):\n    return run.state.probes_don + run.t_strat\n")
    on_run, on_state = reads(path)
    assert on_state - names(ProfileState) == {"probes_don"}
    assert on_run - names(RankRun) == {"t_strat"}

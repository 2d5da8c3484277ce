"""The CI files: the GitHub Actions workflow parses, is triggered by hand and nightly, runs scripts/ci_profile.sh with
a config that exists, names only real ppprof commands and options, uploads its artifacts and fails on drift; the
profile job refuses bad input in one line, exit 2, before any setup."""

import re
import shlex
import subprocess
from pathlib import Path

import yaml

from ppprof.cli import main

REPO = Path(__file__).resolve().parents[1]
WORKFLOW = REPO / ".github/workflows/profile.yml"
SCRIPT = REPO / "scripts/ci_profile.sh"


def workflow() -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text())
    doc["on"] = doc.pop(True, doc.get("on"))  # YAML 1.1 reads the key `on` as true
    return doc


def ppprof_calls(text: str) -> list[list[str]]:
    """Each `ppprof SUBCOMMAND ...` call in shell text (also `python -m ppprof ...`), as its words up to a pipe,
    redirection or the end of the line (continuation lines joined)."""
    calls = []
    for line in text.replace("\\\n", " ").splitlines():
        for m in re.finditer(r"(?:^|[\s;(|&])(?:\S*/)?ppprof\s+([a-z][a-z-]*)\b(.*)", line):
            rest = re.split(r"[|>;]|\|\||&&", m.group(2))[0]
            calls.append([m.group(1)] + re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", rest))
    return calls


def test_workflow_triggers_artifacts_and_failure_on_drift():
    doc = workflow()
    assert set(doc["on"]) == {"workflow_dispatch", "schedule"} and doc["on"]["schedule"][0]["cron"]
    (job,) = doc["jobs"].values()
    steps = job["steps"]
    upload = [s for s in steps if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert upload and upload[0]["if"] == "always()" and upload[0]["with"]["path"] == "${{ env.PPPROF_ARTIFACTS }}"
    assert "PPPROF_ARTIFACTS" in job["env"]
    runs = [s["run"] for s in steps if "run" in s]
    profile = next(r for r in runs if "scripts/ci_profile.sh" in r)
    assert not any(s.get("continue-on-error") for s in steps)  # the script's exit 1 on drift fails the job
    assert "set +e" not in profile and "|| true" not in profile


def test_workflow_command_exists():
    doc = workflow()
    (job,) = doc["jobs"].values()
    profile = next(s["run"] for s in job["steps"] if "scripts/ci_profile.sh" in s.get("run", ""))
    words = shlex.split(next(line for line in profile.splitlines() if "scripts/ci_profile.sh" in line))
    script = words[words.index("bash") + 1]
    assert (REPO / script).is_file()
    configs = {doc["on"]["workflow_dispatch"]["inputs"]["config"]["default"]}
    configs |= set(re.findall(r"'([^']+\.yaml)'", job["env"]["CONFIG"]))
    assert configs and all((REPO / c).is_file() for c in configs), configs
    # Options after `--` go to `ppprof profile`: each must be one of its options.
    profile_options = {o for p in main.commands["profile"].params for o in p.opts}
    after = words[words.index("--") + 1 :]
    assert [w for w in after if w.startswith("--")] and all(w in profile_options for w in after if w.startswith("--"))


def test_every_ppprof_call_in_the_ci_files_is_a_real_command_and_option():
    texts = [SCRIPT.read_text(), (REPO / ".ci/run").read_text(), WORKFLOW.read_text()]
    calls = [c for t in texts for c in ppprof_calls(t)]
    assert {c[0] for c in calls} >= {"profile", "validate", "compare"}, calls
    for name, *options in calls:
        assert name in main.commands, name
        known = {o for p in main.commands[name].params for o in p.opts}
        assert all(o in known for o in options), (name, options)
    assert "bash scripts/test.sh" in texts[1] and "scripts/ci_profile.sh" in texts[1]


def test_profile_job_refuses_bad_input_before_setup(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "PPPROF_ARTIFACTS": str(tmp_path / "artifacts")}
    for args, message in [
        (["missing.yaml"], "CONFIG missing.yaml does not exist"),
        (["", str(tmp_path / "none")], "does not exist: pass a run folder or policy file"),
        (["a", "b", "c"], "too many arguments"),
    ]:
        out = subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 2 and message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out
    assert not (tmp_path / "artifacts").exists()


def test_the_multirank_tests_run_in_this_checkout_whatever_its_folder_is_named():
    # The subprocesses of the multirank tests run in tests.multirank.REPO: it must be this checkout (a clone in a
    # folder named ppprof, the name `git clone` gives, once took its parent folder and failed every one of them).
    from tests.multirank import REPO as MULTIRANK_REPO

    assert MULTIRANK_REPO == REPO and (REPO / "pyproject.toml").is_file() and (REPO / "ppprof/__init__.py").is_file()


def test_ci_runs_the_tests_from_a_clone_in_a_folder_named_ppprof():
    text = (REPO / ".ci/run").read_text()
    assert re.search(r'git clone -q \. "\$\w+/ppprof"', text) and 'basename "$PWD"' in text


def test_ci_runs_the_readmes_two_commands_in_the_order_it_writes_them():
    readme = (REPO / "README.md").read_text().split("```")[1].strip().splitlines()
    lines = [line.strip() for line in (REPO / ".ci/run").read_text().splitlines()]
    assert len(readme) == 2 and readme[1] == "bash scripts/test.sh"
    assert lines.index(readme[0]) + 1 == lines.index(readme[1]), "the README's first command, then its second"


def test_ci_checks_the_format_and_the_lint_before_the_tests_with_the_pinned_ruff():
    lines = [line.strip() for line in (REPO / ".ci/run").read_text().splitlines()]
    order = [lines.index(cmd) for cmd in (".venv/bin/ruff format --check .", ".venv/bin/ruff check .")]
    assert order == sorted(order) and order[-1] < lines.index("bash scripts/test.sh")
    extras = (REPO / "pyproject.toml").read_text()
    assert re.search(r'^test = \[.*"ruff==[0-9.]+"', extras, re.M), "ruff is pinned in the test extras"


def test_the_profile_job_profiles_with_the_baselines_design(tmp_path):
    """The CI profile is compared cell by cell with the baseline, so it runs the baseline's probe design: the one its
    run.json records (beside a policy file too), grid where it records none or cannot be read."""
    function = re.search(r"^baseline_design\(\) \{.*?^\}$", SCRIPT.read_text(), re.S | re.M).group(0)

    def design_of(path) -> str:
        script = f"{function}\nbaseline_design {shlex.quote(str(path))}"
        out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert design_of(REPO / "results/baseline") == "grid"
    adaptive = tmp_path / "adaptive"
    adaptive.mkdir()
    (adaptive / "run.json").write_text('{"design": {"design": "adaptive", "steps": 3}}')
    assert design_of(adaptive) == "adaptive" and design_of(adaptive / "policy.json") == "adaptive"
    (adaptive / "run.json").write_text("{not json")
    assert design_of(adaptive) == "grid" and design_of(tmp_path / "policy.json") == "grid"


def test_the_profile_job_adds_a_design_only_where_none_is_chosen(tmp_path):
    """--design, or the adaptive design's budgets, in the options or CONFIG choose the design; otherwise the
    baseline's is added, and grid for a first baseline (`none`), so that later profiles share its cells."""
    text = SCRIPT.read_text()
    functions = "\n".join(
        re.search(rf"^{name}\(\) \{{.*?^\}}$", text, re.S | re.M).group(0)
        for name in ("baseline_design", "chosen_design")
    )
    adaptive = tmp_path / "adaptive"
    adaptive.mkdir()
    (adaptive / "run.json").write_text('{"design": {"design": "adaptive"}}')
    budget = tmp_path / "budget.yaml"
    budget.write_text("model: tiny-dense\nmax-seconds: 30\n")
    plain = tmp_path / "plain.yaml"
    plain.write_text("model: tiny-dense\n")

    def chosen(baseline, config="", *extra: str) -> str:
        words = " ".join(shlex.quote(w) for w in extra)
        script = f"{functions}\nbaseline={shlex.quote(str(baseline))}\nconfig={shlex.quote(str(config))}\nextra=({words})\nchosen_design"
        out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()

    assert chosen(REPO / "results/baseline") == "grid" and chosen(adaptive) == "adaptive"
    assert chosen("none") == "grid" and chosen("none", plain) == "grid"
    for extra in (["--design", "adaptive"], ["--max-seconds", "30"], ["--max-requests=100"]):
        assert chosen(REPO / "results/baseline", "", "--nproc-per-node", "2", *extra) == "", extra
    assert chosen(REPO / "results/baseline", budget) == ""

"""The package list in pyproject.toml is explicit (ppprof.presets maps to configs/models); keep it complete."""

from pathlib import Path

import tomllib

REPO = Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_and_presets_map_to_configs():
    conf = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {"ppprof"} | {f"ppprof.{p.parent.name}" for p in (REPO / "ppprof").glob("*/__init__.py")}
    assert on_disk | {"ppprof.presets"} == set(conf["packages"]), f"{on_disk=}"
    assert conf["package-dir"]["ppprof.presets"] == "configs/models"
    # the schemas ship: schema 6's, schema 5's (older policies still read) and the report's part
    assert conf["package-data"]["ppprof.policy"] == [
        "policy.schema.json",
        "policy-v5.schema.json",
        "report.schema.json",
    ]
    assert sorted(p.name for p in (REPO / "configs" / "models").glob("*.yaml"))


def test_installed_copy_finds_presets_without_the_repository(tmp_path):
    import subprocess
    import sys

    target = tmp_path / "site"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(REPO),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    code = (
        "from ppprof.specs import load_spec; from ppprof.policy.schema import policy_schema; "
        "print(load_spec('tiny-hybrid').pattern, policy_schema()['$schema'])"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "M-*EM-*- https://json-schema.org/draft/2020-12/schema"
    # SGLang's start-up hook ships: the .pth at the top of site-packages (setup.py), the launcher's PYTHONPATH hook inside
    assert (target / "ppprof-sglang.pth").is_file() and (
        target / "ppprof/sglang/on-pythonpath/sitecustomize.py"
    ).is_file()
    code = f"import site, sys; site.addsitedir({str(target)!r}); print('ppprof.sglang.hook' in sys.modules)"
    for policy, hooked in (("policy.json", "True"), ("", "False")):
        r = subprocess.run(
            [sys.executable, "-S", "-c", code],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=120,
            env={"PATH": "/usr/bin:/bin", "PPPROF_POLICY": policy},
        )
        assert r.returncode == 0 and r.stdout.strip() == hooked, (policy, r.stdout, r.stderr[-2000:])


def test_no_package_folder_has_a_name_linters_and_build_tools_skip():
    # ruff's and black's default excludes (and pytest's norecursedirs) skip folders named so: ppprof/dist was one
    skipped = {
        "build",
        "dist",
        "venv",
        ".venv",
        "_build",
        "buck-out",
        "node_modules",
        "site-packages",
        "__pypackages__",
    }
    names = {p.parent.name for p in (REPO / "ppprof").rglob("__init__.py")}
    assert not names & skipped, names & skipped

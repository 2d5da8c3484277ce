"""The model families on 2 gloo ranks: the MLA preset (its latent KV pool, MoE layers) end to end, profile, fit and
bench, as the README runs them; the Gated DeltaNet's states kept in a Mamba pool much smaller than a probe, released
with no leak. MoE layers run in every profile of the default model (tiny-hybrid); every preset's layers, and its
caches, are checked in process by tests/model."""

import json

import pandas as pd
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from tests.multirank import run_cli

pytestmark = pytest.mark.multirank

SMALL = (
    "--base-chunk-size",
    "64",
    "--requests-per-probe",
    "16",
    "--prefix-lens",
    "64,128,192",
    "--warmup",
    "1",
    "--overhead-repeats",
    "1",
)


def test_the_mla_preset_profiles_fits_and_benches(tmp_path):
    preset = "tiny-mla"
    out = tmp_path / "run"
    r = run_cli("profile", "--out", str(out), "--model", preset, *SMALL)
    assert r.returncode == 0, r.stderr[-3000:]
    samples = pd.read_csv(out / "samples.csv")
    assert samples[["stage0_latency_ms", "stage1_latency_ms"]].gt(0).all().all()
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["model"] == preset
    for rank in (0, 1):
        log = (out / f"rank{rank}.log").read_text()
        assert "pools back to full capacity" in log and "leak" not in log
    refit = ["fit", str(out / "samples.csv"), "-o", str(tmp_path / "refit.json"), "--no-load-rule"]
    r = CliRunner().invoke(main, refit)
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "refit.json").read_text())["report"]["provenance"]["model"] == preset
    r = run_cli(
        "bench",
        str(out / "policy.json"),
        "--prompt-len",
        "256",
        "--repeats",
        "1",
        "--strategies",
        "fixed,policy",
        "--out",
        str(tmp_path / "bench"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "prompt 256" in r.stdout + r.stderr
    assert list((tmp_path / "bench").iterdir())


def test_deltanet_states_in_a_mamba_pool_smaller_than_the_probe_leave_no_leak(tmp_path):
    """128 requests a probe, 8 Mamba slots: the grouped window cannot take the probe's slots and falls back to the
    per-call path, as for Mamba2; every probe ends with every pool at full capacity."""
    out = tmp_path / "run"
    r = run_cli(
        "profile",
        "--out",
        str(out),
        "--model",
        "tiny-gdn",
        "--max-mamba-cache-size",
        "8",
        "--requests-per-probe",
        "128",
        "--base-chunk-size",
        "64",
        "--prefix-lens",
        "64",
        "--warmup",
        "1",
        "--overhead-repeats",
        "0",
        "--no-fit",
        "--design",
        "grid",
    )
    assert r.returncode == 0, r.stderr[-3000:]
    samples = pd.read_csv(out / "samples.csv")
    assert (samples["probe"] == 0).sum() == 128 and (samples["probe"] == 2).sum() == 128
    for rank in (0, 1):
        log = (out / f"rank{rank}.log").read_text()
        assert log.count("pools back to full capacity") == 3 and "leak" not in log, log[-2000:]

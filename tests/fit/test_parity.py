"""`ppprof fit --latency-model quadratic --parity sglang`: SGLang's fit and nothing else, checked against a
re-derivation of SGLang's documented procedure on clean, noisy and outlier-laden samples (exact equality)."""

import json

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner

from ppprof.cli import main
from ppprof.fit.synthetic import SyntheticProbes, SyntheticRun, make_samples, write_run_dir
from ppprof.policy import LatencyModel, load

TRUE = LatencyModel("quadratic", a=3e-7, b=0.02, c=4.0)


def sglang_rederived(csv) -> tuple[float, float, float] | None:
    """SGLang's start-up fit as documented: its prefix-free profile in order, the first sample dropped, least squares
    of f(l) = a l^2 + b l + c; a <= 0 disables; b < 0 becomes 0."""
    frame = pd.read_csv(csv)
    free = frame[frame.prefix_len == 0].iloc[1:]
    lengths = free.chunk_size.to_numpy(dtype=float)
    latency = free[[c for c in frame.columns if c.startswith("stage") and c.endswith("_latency_ms")]].to_numpy()
    latency = latency[:, np.argmax(latency.sum(axis=0))] if latency.size else free.latency_ms.to_numpy()
    A = np.vstack([lengths**2, lengths, np.ones(len(lengths))]).T
    a, b, c = np.linalg.lstsq(A, latency, rcond=None)[0]
    return None if a <= 0 else (a, max(b, 0.0), c)


@pytest.mark.parametrize(
    "noise,num_outliers,seed", [(0.0, 0, 0), (0.03, 0, 1), (0.02, 6, 2), (0.05, 12, 4), (0.1, 12, 3)]
)
def test_parity_fit_equals_the_rederivation_exactly(tmp_path, noise, num_outliers, seed):
    frame = make_samples(
        TRUE,
        SyntheticProbes(
            base_chunk_size=4096,
            prefixes=(4096, 8192),
            chunk_sizes=(512, 2048),
            noise=noise,
            num_outliers=num_outliers,
            seed=seed,
        ),
    )
    csv = write_run_dir(tmp_path, frame, SyntheticRun(base_chunk_size=4096))
    r = CliRunner().invoke(
        main, ["fit", str(csv), "--latency-model", "quadratic", "--parity", "sglang", "-o", str(tmp_path / "p.json")]
    )
    assert r.exit_code == 0, r.output
    policy = load(tmp_path / "p.json")
    want = sglang_rederived(csv)
    if want is None:  # a <= 0 in this draw: SGLang turns dynamic chunking off, and so does the parity fit
        assert policy.status == "static" and "SGLang turns dynamic chunking off" in policy.reason
        return
    assert policy.status == "dynamic"
    assert (policy.latency_model.a, policy.latency_model.b, policy.latency_model.c) == tuple(float(v) for v in want)
    assert json.loads((tmp_path / "p.json").read_text())["report"]["diagnostics"]["parity"] == "sglang"
    out = CliRunner().invoke(main, ["export", str(tmp_path / "p.json"), "--server", "sglang"]).output
    assert "# fit: SGLang's own" in out


def test_parity_with_a_non_positive_a_is_static_with_sglangs_reason(tmp_path):
    concave = LatencyModel("quadratic", a=-1e-7, b=0.05, c=4.0)
    frame = make_samples(concave, SyntheticProbes(base_chunk_size=4096, noise=0.0))
    csv = write_run_dir(tmp_path, frame, SyntheticRun(base_chunk_size=4096))
    assert sglang_rederived(csv) is None
    r = CliRunner().invoke(main, ["fit", str(csv), "--latency-model", "quadratic", "--parity", "sglang"])
    assert r.exit_code == 0 and "static" in r.output and "SGLang turns dynamic chunking off" in r.output


def test_parity_needs_the_quadratic_model(tmp_path):
    csv = write_run_dir(
        tmp_path, make_samples(TRUE, SyntheticProbes(base_chunk_size=4096)), SyntheticRun(base_chunk_size=4096)
    )
    r = CliRunner().invoke(main, ["fit", str(csv), "--parity", "sglang"])
    assert r.exit_code == 2 and "needs --latency-model quadratic" in r.stderr


def test_the_parity_fit_is_the_sglang_modules_boot_fit(tmp_path):
    from ppprof.fit.parity import sglang_fit
    from ppprof.fit.samples import read_samples
    from ppprof.servers.sglang import SGLANG

    frame = make_samples(
        TRUE, SyntheticProbes(base_chunk_size=4096, prefixes=(4096,), chunk_sizes=(512, 2048), noise=0.05, seed=5)
    )
    samples = read_samples(write_run_dir(tmp_path, frame, SyntheticRun(base_chunk_size=4096)))
    model, reason, diag = sglang_fit(samples)
    assert model == SGLANG.boot_fit(samples) and reason == "SGLang parity fit" and diag["dropped_rows"] == [1]

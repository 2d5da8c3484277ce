import json

import pandas as pd
import pytest

from ppprof.fit import fit, fit_run
from ppprof.fit.samples import make_samples, write_run_dir
from ppprof.policy import load, validate
from ppprof.policy.rule import LatencyModel

PREFIX_TRUE = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=4e-4)


def run_dir(tmp_path, model=PREFIX_TRUE, noise=0.01, **kw):
    frame = make_samples(model, base_chunk_size=4096, prefixes=[0, 8192, 32768, 65536],
                         chunk_sizes=[512, 1024, 2048, 4096], noise=noise, bottleneck_stage=1, **kw)
    write_run_dir(tmp_path, frame, base_chunk_size=4096, context_len=131072)
    return tmp_path


def test_fit_run_writes_dynamic_policy_and_plots(tmp_path):
    path = fit_run(run_dir(tmp_path))
    assert path == tmp_path / "policy.json"
    assert (tmp_path / "fit.png").stat().st_size > 1000 and (tmp_path / "chunks.png").stat().st_size > 1000
    data = json.loads(path.read_text())
    assert data["status"] == "dynamic", data["reason"]
    assert data["latency_model"]["name"] == "prefix"
    assert data["latency_model"]["coefficients"]["a"]["unit"] == "ms/token^2"
    assert data["diagnostics"]["bottleneck_stage"] == 1
    assert data["provenance"]["world_size"] == 2 and data["provenance"]["layer_partition"] == [2, 2]
    assert data["settings"]["alignment"] == 64 and data["settings"]["min_chunk_size"] == 1024
    assert data["target_latency_ms"] == pytest.approx(PREFIX_TRUE.target_ms(4096), rel=0.05)
    policy = load(path)
    assert validate(policy).startswith("dynamic")
    assert policy.next_chunk_size(0) == 4096 and policy.next_chunk_size(60000) < 4096


def test_gate_failures_give_static_with_reason(tmp_path):
    linear = LatencyModel("prefix", a=0.0, b=0.01, c=5.0, g=0.0)  # no growth with prefix: nothing to shrink
    _, data = fit(run_dir(tmp_path / "flat", linear) / "samples.csv")
    assert data["status"] == "static" and "predicted_shrink" in data["reason"], data["reason"]
    assert data["table"] == {"history_len": [0], "chunk_size": [4096]}
    _, data = fit(run_dir(tmp_path / "noisy", noise=0.4) / "samples.csv")
    assert data["status"] == "static" and "cv_mape" in data["reason"], data["reason"]
    _, data = fit(run_dir(tmp_path / "forced", linear) / "samples.csv", latency_model="quadratic")
    assert data["status"] == "static" and "quadratic" in data["reason"], data["reason"]


def test_plain_csv_needs_base_chunk_size(tmp_path):
    frame = make_samples(PREFIX_TRUE, base_chunk_size=4096, prefixes=[0, 8192, 32768], chunk_sizes=[1024, 4096])
    csv = tmp_path / "mine.csv"
    frame[["prefix_len", "chunk_len", "latency_ms"]].to_csv(csv, index=False)
    with pytest.raises(ValueError, match="--base-chunk-size is required"):
        fit(csv)
    assert not (tmp_path / "policy.json").exists()
    path, data = fit(csv, base_chunk_size=4096, context_len=65536)
    assert data["status"] == "dynamic", data["reason"]
    assert data["diagnostics"]["bottleneck_stage"] is None
    assert data["provenance"]["world_size"] is None and data["settings"]["context_len"] == 65536


def test_bad_csv_values_name_the_row(tmp_path):
    csv = tmp_path / "bad.csv"
    pd.DataFrame({"prefix_len": [0, 0], "chunk_len": [64, -1], "latency_ms": [1.0, 2.0]}).to_csv(csv, index=False)
    with pytest.raises(ValueError, match="chunk_len row 2"):
        fit(csv, base_chunk_size=4096)

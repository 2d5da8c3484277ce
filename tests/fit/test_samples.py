import numpy as np
import pandas as pd
import pytest

from ppprof.fit import fit, read_samples
from ppprof.fit.synthetic import SyntheticProbes, make_samples
from ppprof.policy.rule import LatencyModel

MODEL = LatencyModel("prefix", a=2e-7, b=0.01, c=5.0, g=4e-4)


def frame():
    return make_samples(
        MODEL,
        SyntheticProbes(base_chunk_size=4096, prefixes=[0, 8192, 32768], chunk_sizes=[1024, 4096], bottleneck_stage=1),
    )


def test_stage_columns_pick_the_bottleneck_stage(tmp_path):
    data = frame()
    data.to_csv(tmp_path / "samples.csv", index=False)
    samples = read_samples(tmp_path / "samples.csv")
    assert samples.bottleneck_stage == 1
    np.testing.assert_array_equal(samples.chunk_size, data.chunk_size)
    np.testing.assert_allclose(samples.chunk_latency_ms, data.stage1_latency_ms)
    assert samples.subset(np.arange(3)).bottleneck_stage == 1 and len(samples.subset(np.arange(3))) == 3


def test_chunk_len_column_is_read_as_chunk_size(tmp_path):
    """Samples written by ppprof 0.1 and other tools name the column chunk_len."""
    data = frame()
    old = data[["prefix_len", "chunk_size", "latency_ms"]].rename(columns={"chunk_size": "chunk_len"})
    old.to_csv(tmp_path / "old.csv", index=False)
    samples = read_samples(tmp_path / "old.csv")
    np.testing.assert_array_equal(samples.chunk_size, data.chunk_size)
    _, policy = fit(tmp_path / "old.csv", base_chunk_size=4096, policy_options={"min_gain": 0.0, "load_rule": False})
    assert policy["status"] == "dynamic", policy["reason"]


def test_chunk_size_wins_over_chunk_len(tmp_path):
    pd.DataFrame(
        {"prefix_len": [0, 0], "chunk_size": [64, 128], "chunk_len": [1, -5], "latency_ms": [1.0, 2.0]}
    ).to_csv(tmp_path / "both.csv", index=False)
    assert read_samples(tmp_path / "both.csv").chunk_size.tolist() == [64, 128]


def test_bad_aliased_values_are_reported(tmp_path):
    pd.DataFrame({"prefix_len": [0, 0], "chunk_len": [64, 0], "latency_ms": [1.0, 2.0]}).to_csv(
        tmp_path / "bad.csv", index=False
    )
    with pytest.raises(ValueError, match=r"column chunk_size row 2 is .*0\.0\)?: use an integer in 1\.\.2147483647"):
        read_samples(tmp_path / "bad.csv")


@pytest.mark.parametrize("factor", [1e300, 2000.0, 1 / 2000.0])
def test_an_absurd_latency_is_refused_naming_its_row_before_it_picks_the_bottleneck(tmp_path, factor):
    data = frame()
    data.to_csv(tmp_path / "clean.csv", index=False)
    assert read_samples(tmp_path / "clean.csv").bottleneck_stage == 1  # real spread (prefix 0..32768) passes
    row = 7
    data.loc[row, "stage0_latency_ms"] *= factor  # would make stage 0 the bottleneck
    data.to_csv(tmp_path / "samples.csv", index=False)
    with pytest.raises(
        ValueError,
        match=rf"column stage0_latency_ms row {row + 1} has latency .* the median .* "
        r"not a measurement; remove or re-measure that row",
    ):
        read_samples(tmp_path / "samples.csv")


def test_a_latency_500x_its_neighbours_is_still_a_measurement(tmp_path):
    data = frame()
    data.loc[7, "latency_ms"] *= 500
    data.to_csv(tmp_path / "samples.csv", index=False)
    assert len(read_samples(tmp_path / "samples.csv")) == len(data)


@pytest.mark.parametrize(
    "text,match",
    [
        (
            "prefix_len,chunk_size,latency_ms\n0,64,1.0\n0,1e30,2.0\n",
            r"column chunk_size row 2 is 1e\+30: use an integer in 1\.\.2147483647",
        ),  # was cast to int64 -2**63
        (
            "prefix_len,chunk_size,latency_ms\n1e30,64,1.0\n",
            r"column prefix_len row 1 is 1e\+30: use an integer in 0\.\.2147483647",
        ),
        (
            "prefix_len,chunk_size,latency_ms,latency_ms\n0,64,1.0,2.0\n",
            r"has column\(s\) latency_ms more than once: keep one of each",
        ),  # was read as latency_ms.1, silently
    ],
)
def test_numbers_past_int64_and_repeated_columns_are_refused(tmp_path, text, match):
    (tmp_path / "s.csv").write_text(text)
    with pytest.raises(ValueError, match=match):
        read_samples(tmp_path / "s.csv")


def test_a_device_is_named_as_one_not_as_missing(tmp_path):
    with pytest.raises(ValueError, match=r"samples file /dev/zero is a character device, not a file"):
        read_samples("/dev/zero")
    with pytest.raises(ValueError, match=r"is a folder, not a file"):
        read_samples(tmp_path)

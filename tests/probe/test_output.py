"""samples.csv rows: one per timed request, with every stage's latency and the bottleneck stage."""

import pandas as pd
import pytest

from ppprof.probe.output import samples_frame, write_samples
from ppprof.probe.synth import Probe, ProbeRequest


def test_samples_frame_has_one_row_per_request_and_the_bottleneck():
    probes = [
        Probe(0, "sweep", (ProbeRequest(0, 0, 64), ProbeRequest(1, 0, 32))),
        Probe(1, "design", (ProbeRequest(2, 128, 16),), design_step=3),
    ]
    stage_ms = [[[2.0, 1.0], [1.0, 3.0]], [[5.0], [4.0]]]
    e2e_ms = [[3.5, 4.5], [9.5]]
    f = samples_frame(probes, stage_ms, e2e_ms)
    assert f.to_dict("records") == [
        {
            "probe": 0,
            "kind": "sweep",
            "request": 0,
            "prefix_len": 0,
            "chunk_size": 64,
            "stage0_latency_ms": 2.0,
            "stage1_latency_ms": 1.0,
            "latency_ms": 3.5,
            "slowest_stage": 0,
            "design_step": 0,
        },
        {
            "probe": 0,
            "kind": "sweep",
            "request": 1,
            "prefix_len": 0,
            "chunk_size": 32,
            "stage0_latency_ms": 1.0,
            "stage1_latency_ms": 3.0,
            "latency_ms": 4.5,
            "slowest_stage": 1,
            "design_step": 0,
        },
        {
            "probe": 1,
            "kind": "design",
            "request": 2,
            "prefix_len": 128,
            "chunk_size": 16,
            "stage0_latency_ms": 5.0,
            "stage1_latency_ms": 4.0,
            "latency_ms": 9.5,
            "slowest_stage": 0,
            "design_step": 3,
        },
    ]


def test_samples_are_written_whole(tmp_path):
    write_samples(tmp_path / "samples.csv", pd.DataFrame({"a": [1, 2]}))
    assert pd.read_csv(tmp_path / "samples.csv")["a"].tolist() == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["samples.csv"]  # no temporary files left


def probes_of(sizes: list[int]) -> list[Probe]:
    """Probes of 2 requests each: probe k has requests 2k, 2k+1."""
    return [
        Probe(k, "sweep" if k == 0 else "prefix", (ProbeRequest(2 * k, 0, 8), ProbeRequest(2 * k + 1, 0, 4)))
        for k in range(len(sizes))
    ]


def test_probes_appended_one_by_one_read_back_whole_and_a_probe_cut_short_is_dropped(tmp_path):
    from ppprof.probe.output import append_samples, complete_probes

    path = tmp_path / "samples.csv"
    probes = probes_of([0, 1, 2])
    for p in probes[:2]:
        append_samples(path, samples_frame([p], [[[1.0, 2.0], [1.5, 0.5]]], [[3.0, 4.0]]))
    whole = pd.read_csv(path)
    assert whole["probe"].tolist() == [0, 0, 1, 1] and whole["request"].tolist() == [0, 1, 2, 3]
    assert complete_probes(path, probes) == 2
    with open(path, "a") as f:  # the first row of probe 2, then the run stopped
        f.write("2,prefix,4,0,8,1.0,1.5,3.0,1,0\n")
    assert complete_probes(path, probes) == 2
    assert pd.read_csv(path).equals(whole)  # the cut probe's row is gone, the rest as it was
    assert complete_probes(tmp_path / "none.csv", probes) == 0


def test_an_append_that_cannot_be_written_names_the_file_and_the_cause():
    import errno
    from pathlib import Path

    import pytest

    from ppprof.probe.output import append_samples

    with pytest.raises(OSError) as e:
        append_samples(Path("/dev/full"), pd.DataFrame({"a": [1]}))
    assert e.value.errno == errno.ENOSPC and e.value.filename == "/dev/full"
    assert "No space left on device" in str(e.value)


@pytest.mark.parametrize("cut", ["2,prefix,4,0,8,1.0,1.", "2,prefix,4,0,8,1.0\n"])
def test_a_row_cut_while_it_was_written_is_dropped_before_resuming_and_said(tmp_path, caplog, cut):
    """A kill while a row was being written leaves a last line without a newline, or one that lacks fields: --resume
    drops it (and says so) instead of appending the next probe onto it, and `ppprof fit` names the cut."""
    from ppprof.fit.samples import read_samples
    from ppprof.probe.output import append_samples, complete_probes

    path = tmp_path / "samples.csv"
    probes = probes_of([0, 1, 2])
    for p in probes[:2]:
        append_samples(path, samples_frame([p], [[[1.0, 2.0], [1.5, 0.5]]], [[3.0, 4.0]]))
    whole = pd.read_csv(path)
    with open(path, "a") as f:
        f.write(cut)
    if not cut.endswith("\n"):
        with pytest.raises(ValueError, match=r"ends mid-row \(row 5 lacks fields.*--resume"):
            read_samples(path)
    with caplog.at_level("WARNING", logger="ppprof"):
        assert complete_probes(path, probes) == 2
    assert "ended in a row cut while it was written (1 row without all fields)" in caplog.text
    assert path.read_bytes().endswith(b"\n") and pd.read_csv(path).equals(whole)
    append_samples(path, samples_frame([probes[2]], [[[1.0, 2.0], [1.5, 0.5]]], [[3.0, 4.0]]))
    assert pd.read_csv(path)["probe"].tolist() == [0, 0, 1, 1, 2, 2]  # the next probe lands on a line of its own


def test_a_file_holding_only_a_cut_first_row_resumes_from_nothing(tmp_path):
    from ppprof.probe.output import complete_probes

    path = tmp_path / "samples.csv"
    path.write_text("probe,kind,request,prefix_len,chunk_size,stage0_latency_ms\n0,sweep,0,0,8")
    assert complete_probes(path, probes_of([0])) == 0 and path.read_text() == ""

"""samples.csv rows: one per timed request, with every stage's latency and the bottleneck stage."""

import pandas as pd

from ppprof.probe.output import samples_frame, write_samples
from ppprof.probe.synth import Probe, ProbeRequest


def test_samples_frame_has_one_row_per_request_and_the_bottleneck():
    probes = [Probe(0, "sweep", (ProbeRequest(0, 0, 64), ProbeRequest(1, 0, 32))),
              Probe(1, "design", (ProbeRequest(2, 128, 16),), design_step=3)]
    stage_ms = [[[2.0, 1.0], [1.0, 3.0]], [[5.0], [4.0]]]
    e2e_ms = [[3.5, 4.5], [9.5]]
    f = samples_frame(probes, stage_ms, e2e_ms)
    assert f.to_dict("records") == [
        {"probe": 0, "kind": "sweep", "request": 0, "prefix_len": 0, "chunk_size": 64, "stage0_latency_ms": 2.0,
         "stage1_latency_ms": 1.0, "latency_ms": 3.5, "bottleneck_stage": 0, "design_step": 0},
        {"probe": 0, "kind": "sweep", "request": 1, "prefix_len": 0, "chunk_size": 32, "stage0_latency_ms": 1.0,
         "stage1_latency_ms": 3.0, "latency_ms": 4.5, "bottleneck_stage": 1, "design_step": 0},
        {"probe": 1, "kind": "design", "request": 2, "prefix_len": 128, "chunk_size": 16, "stage0_latency_ms": 5.0,
         "stage1_latency_ms": 4.0, "latency_ms": 9.5, "bottleneck_stage": 0, "design_step": 3},
    ]

def test_samples_are_written_whole(tmp_path):
    write_samples(tmp_path / "samples.csv", pd.DataFrame({"a": [1, 2]}))
    assert pd.read_csv(tmp_path / "samples.csv")["a"].tolist() == [1, 2]
    assert [p.name for p in tmp_path.iterdir()] == ["samples.csv"]  # no temporary files left

import json

import pandas as pd

from ppprof.config import ProfileConfig
from ppprof.dist.launch import launcher_argv
from ppprof.probe.output import default_run_dir, samples_frame, write_run_json, write_samples
from ppprof.probe.synth import Probe, ProbeRequest


def test_samples_frame_has_one_row_per_request_and_the_bottleneck():
    probes = [Probe(0, "sweep", (ProbeRequest(0, 0, 64), ProbeRequest(1, 0, 32))),
              Probe(1, "prefix", (ProbeRequest(2, 128, 16),))]
    stage_ms = [[[2.0, 1.0], [1.0, 3.0]], [[5.0], [4.0]]]
    e2e_ms = [[3.5, 4.5], [9.5]]
    f = samples_frame(probes, stage_ms, e2e_ms)
    assert f.to_dict("records") == [
        {"probe": 0, "kind": "sweep", "request": 0, "prefix_len": 0, "chunk_len": 64, "stage0_latency_ms": 2.0,
         "stage1_latency_ms": 1.0, "latency_ms": 3.5, "bottleneck_stage": 0},
        {"probe": 0, "kind": "sweep", "request": 1, "prefix_len": 0, "chunk_len": 32, "stage0_latency_ms": 1.0,
         "stage1_latency_ms": 3.0, "latency_ms": 4.5, "bottleneck_stage": 1},
        {"probe": 1, "kind": "prefix", "request": 2, "prefix_len": 128, "chunk_len": 16, "stage0_latency_ms": 5.0,
         "stage1_latency_ms": 4.0, "latency_ms": 9.5, "bottleneck_stage": 0},
    ]


def test_outputs_are_written_whole_and_run_dirs_do_not_collide(tmp_path):
    f = pd.DataFrame({"a": [1, 2]})
    write_samples(tmp_path / "samples.csv", f)
    write_run_json(tmp_path / "run.json", world_size=2)
    assert pd.read_csv(tmp_path / "samples.csv")["a"].tolist() == [1, 2]
    doc = json.loads((tmp_path / "run.json").read_text())
    assert doc["schema_version"] == 1 and doc["world_size"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json", "samples.csv"]  # no temporary files left
    a = default_run_dir("tiny-hybrid", tmp_path)
    a.mkdir()
    b = default_run_dir("tiny-hybrid", tmp_path)
    assert a != b and b.name.startswith(a.name)


def test_launcher_passes_torchrun_options_and_the_resolved_config():
    cfg = ProfileConfig(nproc_per_node=3, base_chunk_size=64)
    argv = launcher_argv(cfg, {"nnodes": "2", "node_rank": "1", "rdzv_endpoint": "h:1", "standalone": False}, None)
    assert argv[:2] == ["--nproc-per-node", "3"]
    assert "--standalone" not in argv
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--module"):argv.index("--module") + 3] == ["--module", "ppprof", "profile"]
    resolved = json.loads(argv[argv.index("--resolved-config") + 1])
    assert resolved["base_chunk_size"] == 64 and resolved["nproc_per_node"] == 3
    local = launcher_argv(cfg, {}, "skip-mamba-release")
    assert "--standalone" in local and local[-2:] == ["--inject-fault", "skip-mamba-release"]

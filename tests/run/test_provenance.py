"""Run folder names and provenance."""

import torch

from ppprof.run.provenance import default_run_dir, hardware


def test_run_dirs_started_in_the_same_second_do_not_collide(tmp_path):
    a = default_run_dir("tiny-hybrid", tmp_path)
    a.mkdir()
    b = default_run_dir("tiny-hybrid", tmp_path)
    assert a != b and b.name.startswith(a.name)
    assert default_run_dir("configs/models/x.yaml", tmp_path).name.endswith("-x")


def test_hardware_names_the_device_and_the_cpu():
    info = hardware(torch.device("cpu"))
    assert info["device"] == "cpu" and info["device_name"] and info["cpu_count"] >= 1


def test_a_replayed_deeper_pipeline_repeats_the_profiled_split():
    """--pp above the profiled stages: every stage holds the layers of one profiled stage, in the profile's split."""
    from ppprof.config import ProfileConfig
    from ppprof.distributed.group import RankInfo
    from ppprof.run.rank import set_up

    info = RankInfo(rank=0, world_size=2, local_rank=0, device=torch.device("cpu"), backend="gloo")
    run = set_up(ProfileConfig(num_layers=5), info, None, state=None, repeat=2, pp_size=4)
    assert [len(r) for r in run.stage_ranges] == [3, 2, 3, 2]
    assert [run.spec.layers[r.start : r.stop] for r in run.stage_ranges[2:]] == [
        run.spec.layers[r.start : r.stop] for r in run.stage_ranges[:2]
    ]
    run = set_up(ProfileConfig(num_layers=5, layer_partition=(1, 4)), info, None, state=None, repeat=2, pp_size=4)
    assert [len(r) for r in run.stage_ranges] == [1, 4, 1, 4]

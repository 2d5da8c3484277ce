"""Run folder names and provenance."""

from ppprof.run.provenance import default_run_dir, hardware

import torch


def test_run_dirs_started_in_the_same_second_do_not_collide(tmp_path):
    a = default_run_dir("tiny-hybrid", tmp_path)
    a.mkdir()
    b = default_run_dir("tiny-hybrid", tmp_path)
    assert a != b and b.name.startswith(a.name)
    assert default_run_dir("configs/models/x.yaml", tmp_path).name.endswith("-x")


def test_hardware_names_the_device_and_the_cpu():
    info = hardware(torch.device("cpu"))
    assert info["device"] == "cpu" and info["device_name"] and info["cpu_count"] >= 1

"""Where a run happened: the run folder's default name, the hardware (the git revision and the CPU model are
ppprof.manifest's)."""

from __future__ import annotations

import datetime as _dt
import os
import platform
from pathlib import Path

import torch

from ppprof.manifest import cpu_model


def default_run_dir(model: str, root: str | os.PathLike = "results") -> Path:
    """results/<UTC time>-<model name>; a numeric suffix keeps runs started in the same second apart."""
    stem = Path(model).stem if os.sep in model or model.endswith((".json", ".yaml", ".yml")) else model
    base = Path(root) / f"{_dt.datetime.now(_dt.timezone.utc):%Y%m%d-%H%M%S}-{stem}"
    run_dir, k = base, 1
    while run_dir.exists():
        run_dir, k = Path(f"{base}-{k}"), k + 1
    return run_dir


def hardware(device: torch.device) -> dict:
    info = {
        "device": device.type,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "hostname": platform.node(),
    }
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        info["device_count"] = torch.cuda.device_count()
    else:
        info["device_name"] = cpu_model()
    return info


def peak_memory_bytes(device: torch.device) -> int | None:
    """This process's peak memory so far: CUDA's peak allocation on `device`, or on CPU the peak resident set
    (VmHWM, which includes the Python interpreter and torch's libraries)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None

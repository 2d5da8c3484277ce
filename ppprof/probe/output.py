"""The outputs of a profile run: samples.csv (one row per timed request) and run.json (config and provenance)."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
from pathlib import Path

import pandas as pd
import torch

from ppprof.io import atomic_write, atomic_write_json
from ppprof.probe.synth import Probe
from ppprof.runfiles import RUN_SCHEMA_VERSION, stage_column



def samples_frame(probes: list[Probe], stage_ms: list[list[list[float]]], e2e_ms: list[list[float]]) -> pd.DataFrame:
    """stage_ms[probe][stage][request] and e2e_ms[probe][request] -> one row per timed request."""
    rows = []
    for p, probe in enumerate(probes):
        num_stages = len(stage_ms[p])
        for i, pr in enumerate(probe.requests):
            lat = [stage_ms[p][s][i] for s in range(num_stages)]
            row = {"probe": probe.index, "kind": probe.kind, "request": pr.rid, "prefix_len": pr.prefix_len,
                   "chunk_len": pr.chunk_len}
            row.update({stage_column(s): round(v, 4) for s, v in enumerate(lat)})
            row["latency_ms"] = round(e2e_ms[p][i], 4)
            row["bottleneck_stage"] = max(range(num_stages), key=lat.__getitem__)
            rows.append(row)
    return pd.DataFrame(rows)


def write_samples(path: Path, frame: pd.DataFrame) -> Path:
    return atomic_write(path, lambda tmp: frame.to_csv(tmp, index=False))


def git_revision() -> str | None:
    """The git commit of the ppprof source tree, when it is a checkout."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    rev = out.stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here, capture_output=True,
                           text=True, timeout=10).stdout.strip()
    return rev + ("-dirty" if dirty else "")


def hardware(device: torch.device) -> dict:
    info = {"device": device.type, "platform": platform.platform(), "machine": platform.machine(),
            "cpu_count": os.cpu_count(), "hostname": platform.node()}
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        info["device_count"] = torch.cuda.device_count()
    else:
        info["device_name"] = _cpu_model() or platform.processor() or platform.machine()
    return info


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def write_run_json(path: Path, **fields) -> Path:
    doc = {"schema_version": RUN_SCHEMA_VERSION, "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    doc.update(fields)
    return atomic_write_json(path, doc)


def default_run_dir(model: str, root: str | os.PathLike = "results") -> Path:
    """results/<UTC time>-<model name>; a numeric suffix keeps runs started in the same second apart."""
    stem = Path(model).stem if os.sep in model or model.endswith((".json", ".yaml", ".yml")) else model
    base = Path(root) / f"{_dt.datetime.now(_dt.timezone.utc):%Y%m%d-%H%M%S}-{stem}"
    run_dir, k = base, 1
    while run_dir.exists():
        run_dir, k = Path(f"{base}-{k}"), k + 1
    return run_dir

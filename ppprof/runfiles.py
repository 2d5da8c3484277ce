"""The files of a run folder, shared by the writers (ppprof/run) and the readers (ppprof/fit): names, run.json
(written and read here, one schema) and the per-stage latency columns of samples.csv. Pure: no torch."""

from __future__ import annotations

import datetime as _dt
import json
import re
from pathlib import Path

from ppprof.io import atomic_write_json

SAMPLES_FILE = "samples.csv"
RUN_FILE = "run.json"
RUN_SCHEMA_VERSION = 2
"""2: dist_backend (was backend), attention_backend, attention_kernel, mamba_kernel, torch_threads."""
STAGE_COLUMN = re.compile(r"^stage(\d+)_latency_ms$")


def stage_column(stage: int) -> str:
    """samples.csv column of one stage's latency: stage{i}_latency_ms."""
    return f"stage{stage}_latency_ms"


def write_run_json(path: str | Path, *, config: dict, **fields) -> Path:
    """run.json: the schema version, the creation time, the resolved `config` and whatever else the run records
    (model, hardware, torch_version, dist_backend, world_size, layer_partition, git_revision, the kernels that ran,
    wall times, token counts)."""
    doc = {"schema_version": RUN_SCHEMA_VERSION,
           "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"), "config": config}
    doc.update(fields)
    return atomic_write_json(path, doc)


def read_run_json(path: str | Path) -> dict:
    """A run.json as written by write_run_json; ValueError (one line) when it is unreadable or of another schema."""
    path = Path(path)
    try:
        run = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"run file {path} is not readable JSON ({e}): fix or remove it") from None
    if not isinstance(run, dict) or run.get("schema_version") != RUN_SCHEMA_VERSION:
        version = run.get("schema_version") if isinstance(run, dict) else None
        raise ValueError(f"run file {path} has schema_version {version!r}: this ppprof reads {RUN_SCHEMA_VERSION}")
    if not isinstance(run.get("config"), dict):
        raise ValueError(f"run file {path} lacks its 'config' object: regenerate it with `ppprof profile`")
    return run

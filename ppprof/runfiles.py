"""The files of a profile run folder, shared by the writer (ppprof/probe) and the readers (ppprof/fit): names,
run.json's schema version and the per-stage latency columns of samples.csv."""

from __future__ import annotations

import re

SAMPLES_FILE = "samples.csv"
RUN_FILE = "run.json"
RUN_SCHEMA_VERSION = 1
STAGE_COLUMN = re.compile(r"^stage(\d+)_latency_ms$")


def stage_column(stage: int) -> str:
    """samples.csv column of one stage's latency: stage{i}_latency_ms."""
    return f"stage{stage}_latency_ms"

"""The dry runs of the published deployments, each made once a test session and shared by the tests that read it
(tests/run/test_dry_run.py, tests/run/test_dry_run_by_hand.py)."""

from __future__ import annotations

import functools
from pathlib import Path

from ppprof.config import ProfileConfig
from ppprof.run.dry_run import DryRun, dry_run
from ppprof.run.resolve import resolve_config
from ppprof.specs import load_spec
from ppprof.specs.tp import tp_problem

DATA = Path(__file__).resolve().parents[1] / "specs" / "data"
PUBLISHED_PARAMS = {
    # DeepSeek-V3 technical report (arXiv 2412.19437): 671B, the MTP module's 14B apart (ppprof does not run it).
    "deepseek_v3": 671e9,
    # Kimi-K2-Instruct: 1026.5B, the checkpoint's count on its model card (its technical report rounds to 1.04T).
    "kimi_k2": 1026.5e9,
    # Qwen3 technical report (arXiv 2505.09388): 235B.
    "qwen3_moe": 235e9,
    # Qwen3-Next-80B-A3B model card: 80B.
    "qwen3_next": 80e9,
}
HEADLINE = [
    ("deepseek_v3", 4, 8),  # SGLang's long-context PP blog: DeepSeek-V3.1 at PP4 x TP8
    ("kimi_k2", 4, 8),
    ("qwen3_moe", 4, 4),
    ("qwen3_next", 2, 4),
]
"""The deployments of issue 36's done-when."""


@functools.cache
def published_dry_run(folder: str, pp_size: int, tp_size: int) -> tuple[ProfileConfig, DryRun]:
    """The dry run of tests/specs/data/FOLDER at PP x TP in bf16 with the profile's default pools (every family
    shards over TP ranks: a refusal fails the test)."""
    path = DATA / folder / "config.json"
    problem = tp_problem(load_spec(path), tp_size)
    assert not problem, f"ppprof.specs.tp refuses {folder} at TP {tp_size}: {problem}"
    cfg = resolve_config(None, {"model": str(path), "pp_size": pp_size, "tp_size": tp_size, "dtype": "bf16"})
    return cfg, dry_run(cfg)

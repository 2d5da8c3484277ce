"""`ppprof profile --dry-run`: every rank built on meta tensors and run once (ppprof.run.dry_run), printed as a table
or one JSON object; with --device-memory, a layout with a rank that does not fit refused in one line (exit 2)."""

from __future__ import annotations

import json

import click

from ppprof.adaptive import check as check_adaptive_design
from ppprof.config import ProfileConfig
from ppprof.distributed.launch import num_nodes
from ppprof.run.dry_report import format_dry_run, parse_device_memory, refusal, to_dict
from ppprof.run.dry_run import dry_run


def show_dry_run(cfg: ProfileConfig, device_memory: str | None, as_json: bool, nnodes: str | None) -> None:
    """Run the dry run of cfg's layout, print it, and raise ValueError (one line) where a rank does not fit in
    --device-memory. The size is read before any stage is built; the probe design is checked first, as the run
    checks it (a run it would refuse is refused here too)."""
    check_adaptive_design(cfg)
    limit = None if device_memory is None else parse_device_memory(device_memory)
    run = dry_run(cfg, nnodes=num_nodes(nnodes))
    problem = None if limit is None else refusal(run, cfg, device_memory, limit)
    click.echo(json.dumps(to_dict(run, cfg, limit, problem)) if as_json else format_dry_run(run, cfg, limit, problem))
    if problem:
        raise ValueError(problem)

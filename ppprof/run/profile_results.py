"""The profile's last phases, on rank 0: run.json's closing record (status complete, what ran, the design, the
overhead) with the summary in the log, and the fit of the policy beside the samples, on the rows and the record held
in memory."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

import torch

from ppprof.adaptive.step import design_record
from ppprof.run.memory_check import profile_memory
from ppprof.run.profile_state import ProfileState
from ppprof.run.rank import RankRun
from ppprof.runfiles import COMPLETE, stage_column
from ppprof.specs.tp import rank_spec

log = logging.getLogger("ppprof")


def write_results(run: RankRun[ProfileState]) -> None:
    """Rank 0: run.json's closing record (samples.csv holds every probe's rows already)."""
    if run.rank != 0:
        return
    probes, warmup, forward_tokens = run.state.probes, run.state.warmup, run.state.forward_tokens
    probes = probes[run.state.first_probe :]
    frame = run.state.samples_log.frame()  # every probe's rows, kept as each was appended
    wall_s = time.perf_counter() - run.t_start
    run.state.record.write(
        status=COMPLETE,
        attention_backend=run.stage.attention_kernel.backend,
        attention_kernel=run.state.attention_kernel,
        mamba_kernel=run.stage.mamba_kernel.kernel if any(layer.has_mamba for layer in run.spec.layers) else None,
        torch_threads=torch.get_num_threads(),
        profile_wall_s=round(wall_s, 3),
        probe_wall_s=round(run.state.probe_wall_s, 3),
        forward_tokens=int(forward_tokens[0]),
        forward_tokens_per_stage=[int(t) for t in forward_tokens],
        peak_memory_bytes_per_stage=run.state.peak_memory,
        estimated_memory_bytes_per_stage=[
            m.total for m in profile_memory(run.cfg, run.pp_size, rank_spec(run.spec, run.tp_size))
        ],
        **run.state.tp_ranks,
        timed_requests=sum(len(p.requests) for p in probes),
        warmup_requests=len(warmup),
        **({"packed_wall_s": round(run.state.packed_wall_s, 3)} if run.state.packed_wall_s else {}),
        **(
            {"pipeline_overhead": run.state.overhead, "overhead_wall_s": round(run.state.overhead_wall_s, 3)}
            if run.state.overhead is not None
            else {}
        ),
        warmup_tokens=sum(r.chunk_size for r in warmup),
        design=design_record(
            run.cfg,
            run.state.design,
            probes,
            run.state.samples_log.samples,
            run.pp_size,
            (run.state.probe_wall_s, int(forward_tokens[0])),
        ),
    )
    log_summary(frame, run.pp_size, wall_s, forward_tokens[0], run.folder.path)


def log_summary(frame, pp_size: int, wall_s: float, forward_tokens: int, run_dir: Path) -> None:
    sweep = frame[frame["prefix_len"] == frame["prefix_len"].min()]
    big, small = sweep.loc[sweep["chunk_size"].idxmax()], sweep.loc[sweep["chunk_size"].idxmin()]
    for s in range(pp_size):
        col = stage_column(s)
        log.info(
            "stage %d: chunk %d -> %.3f ms, chunk %d -> %.3f ms",
            s,
            big["chunk_size"],
            big[col],
            small["chunk_size"],
            small[col],
        )
    log.info("profile wall time %.2f s, %d forward tokens a stage; wrote %s", wall_s, forward_tokens, run_dir)


def fit_policy(run: RankRun[ProfileState]) -> None:
    """Rank 0, unless --no-fit: policy.json and the plots beside the samples, fitted on the rows and the run record
    held in memory (ppprof.fit.build.fit_and_save; nothing read back)."""
    if run.rank != 0 or not run.cfg.fit.fit:
        return
    from ppprof.fit.build import PROFILE_LATENCY_MODEL, fit_and_save
    from ppprof.fit.fitted import RunSamples

    state = run.state
    measured = RunSamples(state.samples_log.samples(), state.record.document(), state.packed)
    path, policy = fit_and_save(measured, None, PROFILE_LATENCY_MODEL, plots=True)
    log.info("policy: %s", path)
    print_summary(path, policy)


def print_summary(policy_path: Path, document: dict) -> None:
    """The run's last lines, on stdout: the decision and what it means for a typical prompt of the workload, the files
    written and the next commands with the real path."""
    from ppprof.policy.policy_file import from_dict
    from ppprof.policy.summary import next_commands, summary_block, typical_prompt_len

    policy = from_dict(document)
    folder = policy_path.parent
    files = sorted(p.name for p in folder.iterdir() if p.is_file() and not p.name.startswith("."))
    lines = ["", f"profile done: {folder}"]
    lines += summary_block(policy, str(policy_path))[1:]
    lines.append(f"  files: {', '.join(files)}")
    lines.append("  next:")
    lines += [f"    {command}" for command in next_commands(str(policy_path), typical_prompt_len(policy))]
    sys.stderr.flush()
    print("\n".join(lines), flush=True)

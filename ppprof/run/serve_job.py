"""The serving bench through the ranks, one rank's view: rank 0 reads the policy and names serving.json's folder,
every rank builds its stage with pools that hold a level's requests at the longest prompt, a warm-up level runs, then
every (level, arm) is served `repeats` times, interleaved, and rank 0 writes serving.json (each cell measured beside
its simulation), serving.csv (every batch on every stage) and the plots. Before each cell every rank looks whether the
policy file changed (ppprof.policy.reload, as the SGLang sizer does) and the ranks take a new one together, or none
does: a cell is served by one policy."""

from __future__ import annotations

import hashlib
import logging
import sys
from pathlib import Path

import pandas as pd

from ppprof.bench.serving import ServingRunner
from ppprof.config.workload import Workload
from ppprof.distributed.agree import agreed
from ppprof.distributed.batches import BatchLimits
from ppprof.fit.samples import model_shape
from ppprof.io import atomic_write
from ppprof.manifest import write_result
from ppprof.model.stage import build_stage_cache
from ppprof.policy.policy_file import from_text, load
from ppprof.policy.reload import PolicyWatch, check_interval_s
from ppprof.policy.runtime import Policy, largest_chunk
from ppprof.run.forward_trace import RankTrace, join_parts
from ppprof.run.progress import progress
from ppprof.run.provenance import default_run_dir
from ppprof.run.rank import Phase, RankRun, make_stage, run_phases, run_rank, set_up, tp_shard
from ppprof.serving.arms import sizer
from ppprof.serving.levels import ServingPlan, simulate_levels
from ppprof.serving.plots import write_plots
from ppprof.serving.report import cell_summary, largest_miss, levels_text, measured_levels, paired_ratios
from ppprof.serving.scheduler import Capacity
from ppprof.serving.serve_config import ServeBenchConfig
from ppprof.serving.simulate import LoadLevel

log = logging.getLogger("ppprof")
SERVING_JSON, SERVING_CSV = "serving.json", "serving.csv"
WARMUP = "warm-up"


class ServeState:
    """What the serve-bench job's phases hand on."""

    def __init__(self, serve: ServeBenchConfig, policy: Policy | None) -> None:
        self.serve, self.policy = serve, policy
        self.out: Path | None = None
        self.runner: ServingRunner | None = None
        self.rows: list[dict] = []
        self.cells: dict[tuple[str, str], list[dict]] = {}
        self.first_policy: Policy | None = policy
        self.watch: PolicyWatch | None = None
        self.batches = 0
        """Batches of the measured cells (serving.csv's) this rank's stage has run so far: every stage runs every
        batch, so the count is the same on every rank."""
        self.reloads: list[dict] = []
        """Each decision on a new policy file (rank 0's): serving.json's `reloads`."""
        self.first_digest: str | None = None
        self.part = None
        """A trace replay's part (ppprof.traces.Trace), read by the first stage's ranks; None: levels."""


def prepare(run: RankRun[ServeState]) -> None:
    """The first stage's ranks (every TP rank of it runs the same scheduler): the policy, whose latency model also
    prices the simulation beside; rank 0: serving.json's path."""
    serve, out = run.state.serve, None
    with agreed(run.pipe, "read the policy"):
        if run.pipe.is_first:
            policy = run.state.policy = run.state.policy or load(serve.policy)
            run.state.first_policy = policy
            if policy.planning_model is None:
                raise ValueError(f"policy {serve.policy} has no latency model ({policy.reason}): profile again")
        if run.rank == 0:
            out = Path(serve.out) if serve.out else default_run_dir(f"serve-{run.cfg.model.model}") / SERVING_JSON
            out.parent.mkdir(parents=True, exist_ok=True)
    run.state.out = Path(run.pipe.broadcast(str(out)))


def build_stage(run: RankRun[ServeState]) -> None:
    """This rank's stage, with the pools the settings sized for the most requests a level holds at once, each at the
    longest prompt (ServeBenchConfig.with_pools)."""
    cfg, serve = run.cfg, run.state.serve
    entries = serve.max_entries(serve.prompts)
    stage = make_stage(run, run.layer_ids)
    cache = build_stage_cache(
        run.spec, run.layer_ids, cfg.cache_sizes, dtype=run.dtype, device=run.info.device, **tp_shard(run)
    )
    slots = run.pp_size + serve.async_depth
    limits = BatchLimits(max_pieces=entries, max_tokens=cfg.max_probe_chunk_size)
    run.state.runner = ServingRunner(stage, cache, run.pipe, serve.seed, slots, limits)
    run.state.watch = watch_policy(run, limits)
    run.state.first_digest = run.state.watch.digest
    if serve.forward_trace is not None:
        context_len = cfg.probes.context_len
        run.state.runner.trace = RankTrace(serve.forward_trace, run, context_len, "ppprof serve-bench")


def watch_policy(run: RankRun[ServeState], limits: BatchLimits) -> PolicyWatch:
    """Every rank's watch on the policy file: a new file is checked as at the start (the file, a latency model)
    and against the running pipeline (the model's shape, the page size, chunks within a batch, the context)."""
    path, cfg = run.state.serve.policy, run.cfg
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    interval, problem = check_interval_s()
    if problem and run.rank == 0:
        log.warning(problem)
    served_shape = model_shape(run.spec.to_dict())

    def check(text: str) -> tuple[Policy | None, str | None]:
        policy = from_text(text, f"policy file {path}")
        shape = policy.provenance.get("model_shape")
        if policy.planning_model is None:
            return policy, f"it has no latency model ({policy.reason}): profile again"
        if isinstance(shape, dict) and served_shape and shape != served_shape:
            return policy, f"provenance.model_shape {shape} is not the served model's {served_shape}"
        if policy.settings.page_size != cfg.pools.page_size:
            return policy, f"page_size {policy.settings.page_size}, the pipeline's {cfg.pools.page_size}"
        if largest_chunk(policy) > limits.max_tokens:
            return policy, f"its largest chunk {largest_chunk(policy)} exceeds a batch's {limits.max_tokens} tokens"
        if policy.settings.context_len < max(run.state.serve.prompts):
            return policy, f"context_len {policy.settings.context_len} is below the longest prompt served"
        return policy, None

    return PolicyWatch(path, digest, check, interval)


def reload(run: RankRun[ServeState], tag: dict) -> None:
    """Before a cell: every rank looks at the policy file, the ranks' votes are gathered, and every rank takes the
    same decision (ppprof.policy.reload): a new policy from this batch on on every rank, or the old one kept with one
    line. Rank 0 records each decision with every rank's batch count (serving.json's `reloads`)."""
    watch = run.state.watch
    watch.poll()
    votes = run.pipe.all_gather_ranks((watch.vote(), run.state.batches))
    decision = watch.decide([v for v, _ in votes])
    if decision.action == "none":
        return
    if decision.action == "switch":
        policy = watch.take(decision)
        if run.pipe.is_first:
            run.state.policy = policy
    if run.rank != 0:
        return
    if decision.action == "switch":
        log.warning(
            "policy file %s (sha256 %s) taken by every rank from batch %d, before %s",
            watch.path,
            decision.digest[:12],
            run.state.batches,
            cell_name(tag),
        )
    elif decision.line:
        log.warning(decision.line)
    run.state.reloads.append(
        {
            "action": decision.action,
            "sha256": decision.digest,
            "before_cell": cell_name(tag),
            "batches_by_rank": [b for _, b in votes],
            "line": decision.line,
        }
    )


def cell_name(tag: dict) -> str:
    return f"{tag['level']}, {tag['arm']}, repeat {tag['repeat']}"


def serve_one(run: RankRun[ServeState], level: LoadLevel, arm: str, repeat: int, prompts: list[int]) -> None:
    serve, lead = run.state.serve, run.pipe.is_first  # every TP rank of the first stage schedules alike
    entries = serve.entries(level)
    capacity = Capacity(max(prompts) * entries, entries) if lead else None
    tag = {"level": level.name if repeat >= 0 else WARMUP, "arm": arm, "repeat": repeat}
    reload(run, tag)
    tag["policy_sha256"] = run.state.watch.digest[:12]
    result = run.state.runner.run(prompts, level, sizer(run.state.policy, arm) if lead else None, capacity, tag)
    if repeat < 0:
        return
    run.state.batches += len(result.rows)
    run.state.rows += result.rows
    if run.rank == 0:
        run.state.cells.setdefault((level.name, arm), []).append(result)


def serve_levels(run: RankRun[ServeState]) -> None:
    """A warm-up level (the first arm at the first level, a slot's worth of prompts), then every arm of every level
    once a repeat; the rows of every stage gathered on rank 0, each cell summarised there."""
    serve = run.state.serve
    prompts = serve.prompts
    first = serve.levels[0]
    serve_one(run, first, serve.strategies[0], -1, prompts[: max(2, run.state.runner.slots)])
    cells = serve.repeats * len(serve.levels) * len(serve.strategies)
    with progress(run.rank, cells, "serve-bench", "cell") as bar:
        for repeat in range(serve.repeats):
            for level in serve.levels:
                for arm in serve.strategies:
                    serve_one(run, level, arm, repeat, prompts)
                    if bar is not None:
                        bar.set_postfix_str(f"{level.name}, {arm}, repeat {repeat}", refresh=False)
                        bar.update()
    gather_rows(run, serve)
    if run.rank == 0:
        for key, results in run.state.cells.items():
            level, arm = key
            mine = [
                [r for r in run.state.rows if (r["level"], r["arm"], r["repeat"]) == (level, arm, repeat)]
                for repeat in range(len(results))
            ]
            run.state.cells[key] = [cell_summary(res.served, rs, run.pp_size) for res, rs in zip(results, mine)]


def write_results(run: RankRun[ServeState]) -> None:
    """Rank 0: serving.json, serving.csv and the plots, and the table on stderr."""
    if run.rank != 0:
        return
    serve, policy, out = run.state.serve, run.state.first_policy, run.state.out
    plan = ServingPlan(
        tuple(serve.levels),
        tuple(serve.strategies),
        Workload.from_dict(serve.workload),
        serve.num_prompts,
        run.pp_size,
        serve.async_depth,
        serve.seed,
    )
    simulated = simulate_levels(policy, plan)
    result = {
        **{k: v for k, v in simulated.items() if k != "levels"},
        "mode": "measured",
        "repeats": serve.repeats,
        "policy": serve.policy,
        "policy_sha256": run.state.first_digest,
        "reloads": run.state.reloads,
        "device": str(run.info.device),
        "levels": measured_levels(run.state.cells, simulated["levels"]),
        "paired": paired_ratios(run.state.cells),
    }
    miss = largest_miss(result["levels"])
    result["largest_miss"] = None if miss is None else {"where": miss[1], "fraction": miss[0]}
    write_result(out, result)
    write_rows(out.with_name(SERVING_CSV), run.state.rows)
    write_plots(result, out.parent, f"{Path(serve.policy).name}: measured, {run.pp_size} stages")
    print(levels_text(result), file=sys.stderr)
    log.info("wrote %s", out)


def gather_rows(run: RankRun[ServeState], serve: ServeBenchConfig) -> None:
    """After the runs: every stage's forward-trace part joined (where --forward-trace names one), and every stage's
    batch rows gathered into rank 0's state."""
    if serve.forward_trace is not None:
        join_parts(run.pipe, run.rank, serve.forward_trace, run.state.runner.trace)
    rows = [row for per_stage in run.pipe.all_gather(run.state.rows) for row in per_stage]
    if run.rank == 0:
        run.state.rows = rows


def write_rows(path: Path, rows: list[dict]) -> None:
    atomic_write(path, lambda tmp: pd.DataFrame(rows).to_csv(tmp, index=False))


PHASES: tuple[Phase, ...] = (
    ("read the policy", prepare),
    ("build the stage", build_stage),
    ("serve the levels", serve_levels),
    ("write serving.json", write_results),
)


def serve_rank(
    serve: ServeBenchConfig, fault: str | None = None, policy: Policy | None = None, phases: tuple[Phase, ...] = PHASES
) -> int:
    """One rank of `ppprof serve-bench` through the ranks (`phases`: the levels', or a trace's); returns its exit
    code."""

    def job(info) -> None:
        run_phases(set_up(serve.profile, info, fault, state=ServeState(serve, policy)), phases)

    cfg = serve.profile
    return run_rank(job, cfg.job.device, cfg.job.torch_threads, cfg.job.timeout, cfg.parallelism.tp_size)

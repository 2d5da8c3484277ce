"""One rank of a distributed job: logging, the process group, the phases in order, each agreed on by every rank."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import torch

from ppprof.config import ProfileConfig
from ppprof.distributed.agree import RunError, agreed
from ppprof.distributed.group import RankInfo, process_group
from ppprof.distributed.pipe import Pipe
from ppprof.distributed.stop import Stop
from ppprof.distributed.watchdog import DEFAULT_TIMEOUT_S
from ppprof.io import atomic_write_text, open_append
from ppprof.mem import StageCache
from ppprof.model.stage import Stage
from ppprof.probe.malloc import steady_malloc
from ppprof.run.prelaunch import check_output_folder
from ppprof.runfiles import FAILED, INTERRUPTED, LOCK_HELD_ENV, RUN_DIR_NOTE_ENV, RunFolder, release_lock, take_lock
from ppprof.specs import ModelSpec, load_spec, split_layers
from ppprof.specs.dtypes import AUTO_DTYPE_CPU, AUTO_DTYPE_GPU

log = logging.getLogger("ppprof")
S = TypeVar("S")


@dataclass(slots=True)
class RankRun(Generic[S]):
    """What one rank knows and holds during a job; phases fill it in order. `state` is the job's own (the profile
    job's ProfileState, the bench job's BenchState): what one phase hands the next, typed."""

    cfg: ProfileConfig
    info: RankInfo
    spec: ModelSpec
    dtype: torch.dtype
    stage_ranges: list[range]
    pipe: Pipe
    state: S
    fault: str | None = None
    t_start: float = field(default_factory=time.perf_counter)
    folder: RunFolder | None = None
    """The run folder, once the first phase named it."""
    stage: Stage | None = None
    cache: StageCache | None = None
    own_lock: Path | None = None
    """The run folder whose lock claim_folder took (released when the job ends); None where it took none."""

    @property
    def rank(self) -> int:
        return self.info.rank

    @property
    def stage_idx(self) -> int:
        """This rank's pipeline stage (its rank where there is no TP)."""
        return self.pipe.rank

    @property
    def pp_size(self) -> int:
        """The pipeline's stages (pp_size): the ranks of the job over its TP degree."""
        return self.pipe.pp_size

    @property
    def tp_size(self) -> int:
        return self.pipe.tp_size

    @property
    def layer_ids(self) -> range:
        return self.stage_ranges[self.stage_idx]


Phase = tuple[str, Callable[[RankRun], None]]
"""(what it does, in words that complete "rank N failed to ..."; the function)."""


def run_status(stop: Stop) -> str:
    """run.json's status for a rank that the watchdog stops: INTERRUPTED, or "failed: <reason>"."""
    return INTERRUPTED if stop.interrupted else f"{FAILED}: {stop.reason}"


def resolve_dtype(cfg: ProfileConfig, spec_dtype: str | None) -> torch.dtype:
    """--dtype, else the spec's, else bf16 on GPU and fp32 on CPU (all names already normalised)."""
    return getattr(
        torch, cfg.model.dtype or spec_dtype or (AUTO_DTYPE_GPU if cfg.job.device == "cuda" else AUTO_DTYPE_CPU)
    )


def set_up(
    cfg: ProfileConfig, info: RankInfo, fault: str | None, *, state: S, repeat: int = 1, pp_size: int | None = None
) -> RankRun[S]:
    """The model, dtype, layer split and the pipe to the neighbours; `state` the job's own. No collective: the
    launcher checked the input. `repeat` > 1 repeats the model's layers (and the partition), split over `pp_size` stages (default: a stage a
    rank)."""
    spec = load_spec(cfg.model.model, num_layers=cfg.model.num_layers, dtype=cfg.model.dtype)
    if repeat > 1:
        spec = dataclasses.replace(spec, name=f"{spec.name} x{repeat}", layers=spec.layers * repeat)
    dtype = resolve_dtype(cfg, spec.dtype)
    partition = cfg.parallelism.layer_partition
    if repeat > 1:  # every stage holds the layers of one profiled stage, in the profile's split
        base = partition or [len(r) for r in split_layers(spec.num_layers // repeat, (pp_size or 1) // repeat)]
        partition = tuple(base) * repeat
    mesh = info.mesh
    stage, stages = (info.rank, info.world_size) if mesh is None else (mesh.coords.stage, mesh.coords.pp_size)
    ranges = split_layers(spec.num_layers, pp_size or stages, partition)
    pipe = Pipe(
        rank=stage,
        pp_size=stages,
        device=info.device,
        hidden_size=spec.hidden_size,
        dtype=dtype,
        watchdog=info.watchdog,
        mesh=mesh,
    )
    return RankRun(cfg=cfg, info=info, spec=spec, dtype=dtype, stage_ranges=ranges, pipe=pipe, state=state, fault=fault)


def make_stage(run: RankRun, layer_ids: range) -> Stage:
    """The stage of layers `layer_ids` on this rank, as every job builds it: random weights from the probes' seed,
    the job's attention backend, this stage's TP group where the job has TP; in eval mode."""
    stage = Stage(
        run.spec,
        layer_ids,
        dtype=run.dtype,
        device=run.info.device,
        seed=run.cfg.probes.seed,
        attention_backend=run.cfg.job.attention_backend,
        **tp_comm(run),
    )
    return stage.eval()


def tp_comm(run: RankRun) -> dict:
    """Stage(...)'s `tp` keyword: this stage's TP group, where the job has TP."""
    return {"tp": run.pipe.tp} if run.tp_size > 1 else {}


def tp_shard(run: RankRun) -> dict:
    """build_stage_cache(...)'s TP keywords: the pools of this TP rank's heads."""
    return {"tp_size": run.tp_size, "tp_rank": run.pipe.tp.rank} if run.tp_size > 1 else {}


def claim_folder(run: RankRun, run_dir: Path, out: str | None, overwrite: bool = False, resume: bool = False) -> None:
    """Rank 0, where no launcher holds the run folder's lock (under torchrun; across nodes, where no launcher can tell
    what rank 0 already wrote): check what --out holds and take the lock, released when the job ends or stops. Tells
    the launcher which folder it is, where it asked (RUN_DIR_NOTE_ENV)."""
    if os.environ.get(RUN_DIR_NOTE_ENV):
        atomic_write_text(os.environ[RUN_DIR_NOTE_ENV], str(run_dir.resolve()))
    if LOCK_HELD_ENV in os.environ:
        return
    if out:
        check_output_folder(out, overwrite, resume)
    take_lock(run_dir)
    run.own_lock = run_dir
    if run.pipe.watchdog is not None:
        run.pipe.watchdog.on_stop.append(lambda stop, signal_name: release_lock(run_dir))


def release_folder(run: RankRun) -> None:
    """The lock claim_folder took, if it took one."""
    if run.own_lock is not None:
        release_lock(run.own_lock)
        run.own_lock = None


def run_phases(run: RankRun, phases: Sequence[Phase]) -> None:
    """Each phase in order; at its end every rank agrees that no rank failed in it, or every rank stops. A phase that
    holds a collective must agree on its local work before the collective (nest `agreed`), so that no rank waits in
    a collective that a failed rank never joins."""
    for what, phase in phases:
        if run.pipe.watchdog is not None:
            run.pipe.watchdog.phase = what  # named by "rank N did not answer within T s during <phase>"
        with agreed(run.pipe, what):
            phase(run)


def run_rank(
    job: Callable[[RankInfo], None],
    device: str,
    threads: int | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    tp_size: int = 1,
) -> int:
    """The body of one rank: join the group on `device` (cpu or cuda) as a (pp, tp_size) mesh with `threads`
    intra-op threads (None: as the environment says) and a watchdog giving each wait at least `timeout_s`, run
    `job`, leave. Returns the exit code (1 when the job failed on any rank; every rank then prints the same agreed
    message)."""
    setup_logging(int(os.environ.get("RANK", 0)))
    if threads is not None:
        torch.set_num_threads(threads)
    if device == "cpu" and not steady_malloc():
        log.warning("could not fix malloc's thresholds (not glibc?): CPU timings may be noisier", extra=OWN)
    with process_group(device, timeout_s, tp_size) as info:
        try:
            job(info)
        except RunError as e:
            log.error("%s", e)
            print(f"error: [rank {info.rank}] {e}", file=sys.stderr, flush=True)
            return 1
        except Exception as e:  # outside the agreed path, e.g. an NCCL or sticky CUDA error inside a collective
            message = f"{short_error(e)}; stopping this rank now (the launcher then stops the others)"
            # A broken transfer is most often a rank that stopped or was stopped: the watchdog names the agreed
            # verdict or the signal; no destroy_process_group, which would wait on a broken communicator.
            info.watchdog.failed(message)
            os._exit(1)
    return 0


GLOO_ERROR = re.compile(r"^\[[^\]]*gloo[^\]]*\] (?P<what>.*?)(\. This is typically caused .*)?$", re.DOTALL)


def short_error(e: BaseException) -> str:
    """An exception in one line; gloo's transport errors ("[.../gloo/transport/tcp/pair.cc:537] Read error ...:
    Connection reset by peer. This is typically caused by ... GLHF!") as the connection to another rank lost."""
    text = str(e).replace("\n", " ")
    m = GLOO_ERROR.match(text)
    if m:
        return f"lost the connection to another rank (gloo: {m.group('what')})"
    return f"{type(e).__name__}: {text}"


VERBOSE_ENV = "PPPROF_VERBOSE"
"""Set to 1 (by --verbose, in the launcher's environment that every rank inherits): every rank's lines on the console."""
OWN = {"own": True}
"""`extra=` of a line that is this rank's own (its stage at start-up, its trouble): printed by every rank."""


class OneVoice(logging.Filter):
    """Rank 0 speaks for the run: on the console of any other rank, only its own lines (logged with extra=OWN) and
    its errors pass; its log file in the run folder keeps every line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or getattr(record, "own", False)


def setup_logging(rank: int, log_level: int = logging.INFO) -> None:
    fmt = logging.Formatter(f"[rank {rank}] %(asctime)s %(levelname)s %(message)s", "%H:%M:%S")
    root = logging.getLogger("ppprof")
    root.setLevel(log_level)
    root.handlers.clear()
    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(fmt)
    if rank != 0 and os.environ.get(VERBOSE_ENV) != "1":
        h.addFilter(OneVoice())
    root.addHandler(h)
    root.propagate = False


def enter_folder(run: RankRun, run_dir: str) -> None:
    """Every rank, once rank 0 named the run folder: create it where this node has none yet (across nodes), and log
    into this rank's log there from now on."""
    run.folder = RunFolder(run_dir)
    run.folder.path.mkdir(parents=True, exist_ok=True)
    add_log_file(run.folder.rank_log(run.rank))


def add_log_file(path: Path) -> None:
    """Also log into `path` (the rank's log in the run folder), and send torch's C++ messages there from now on."""
    root = logging.getLogger("ppprof")
    stream = open_append(path)  # not FileHandler: a symbolic link planted there is not followed
    h = logging.StreamHandler(stream)
    h.setFormatter(root.handlers[0].formatter)
    native_stderr_to(stream, console=root.handlers[0])
    root.addHandler(h)


def native_stderr_to(stream, console: logging.StreamHandler) -> None:
    """Point file descriptor 2 at `stream` (the rank's log) and keep Python's stderr, `console`'s stream with it, on
    the terminal it was: torch's C++ warnings write to descriptor 2 (36 lines of TCPStore backtraces when the
    launcher is gone), and belong in the log, not among the one-line messages."""
    if not getattr(sys.stderr, "is_terminal_aside", False):
        sys.stderr.flush()
        terminal = os.fdopen(os.dup(2), "w", buffering=1, encoding=sys.stderr.encoding, errors="backslashreplace")
        terminal.is_terminal_aside = True  # set up once
        sys.stderr = terminal
        console.setStream(terminal)
    stream.flush()
    os.dup2(stream.fileno(), 2)

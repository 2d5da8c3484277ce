"""SGLang's forward trace: where PPPROF_TRACE names a path, every scheduler process of the server (one a PP rank and
TP rank) times its own prefill forwards where SGLang's scheduler runs a batch, Scheduler.run_batch (event_loop_pp's
and event_loop_pp_disagg_prefill's _pp_launch_batch call it, as the loops without PP do), and writes them in ppprof's
forward trace format (ppprof.forwards) to PATH.rank<r>, r = pp_rank x tp_size + tp_rank. Each forward's pieces are
read from SGLang's batch (prefix_lens, extend_lens). Timed by perf_counter on a CPU, by a pair of CUDA events on a
GPU, read by the writer's thread (the serving loop never waits for the device). Without PPPROF_TRACE nothing is
wrapped. Imports no torch: the events come from SGLang's device module."""

from __future__ import annotations

import atexit
import datetime as dt
import functools
import logging
import os
import time

from ppprof.bounds import TRACE_ENV
from ppprof.forwards import ForwardTraceWriter, TraceIdentity, header

logger = logging.getLogger("ppprof.sglang")
RUN_BATCH = "run_batch"
"""The Scheduler method wrapped: run_batch(self, batch, pp_proxy_tensors=None), where every loop runs a batch."""
BATCH_FIELDS = ("reqs", "prefix_lens", "extend_lens", "forward_mode")
"""What the trace reads of SGLang's ScheduleBatch: each piece's prefix and extend lengths, and forward_mode's
is_extend() (prefill and mixed batches are traced, decodes are not)."""
SCHEDULER_FIELDS = ("model_config", "device", "device_module")
"""What it reads of the Scheduler: the model's shape, context_len and dtype, the device, and (on a GPU) the device
module whose Event times a forward."""
PARALLEL_FIELDS = ("pp_rank", "pp_size", "tp_rank", "tp_size")
"""What it reads of SGLang's parallel state (sglang.srt.runtime_context.get_parallel)."""
TRACER = "_ppprof_forward_trace"
"""The scheduler's attribute holding its tracer (False: tracing is off in this process)."""
WRAPPED = "__ppprof_traced__"
"""Set on the wrapped run_batch: a second install leaves it as it is."""


def traced(run_batch):
    """`run_batch` timing each prefill forward into its scheduler's tracer (started at the first forward)."""

    @functools.wraps(run_batch)
    def run_traced(self, batch, *args, **kwargs):
        tracer = self.__dict__.get(TRACER)
        if tracer is None:
            tracer = self.__dict__[TRACER] = start(self)
        if not tracer or not batch.forward_mode.is_extend():
            return run_batch(self, batch, *args, **kwargs)
        pieces = tuple(zip(batch.prefix_lens, batch.extend_lens))  # before the forward, which may change the batch
        mark = tracer.begin()
        result = run_batch(self, batch, *args, **kwargs)
        tracer.end(mark, pieces)
        return result

    setattr(run_traced, WRAPPED, True)
    return run_traced


class Tracer:
    """One scheduler's part of the trace: `begin()` before a forward, `end(mark, pieces)` after it."""

    def __init__(self, writer: ForwardTraceWriter, stage: int, tp_rank: int, device_module=None) -> None:
        self.writer, self.stage, self.tp_rank = writer, stage, tp_rank
        self.events = device_module  # None: the host clock
        self.wall_offset_s = time.time() - time.perf_counter()

    def begin(self):
        if self.events is None:
            return time.perf_counter()
        first = self.events.Event(enable_timing=True)
        first.record()
        return time.perf_counter(), first

    def end(self, mark, pieces) -> None:
        if self.events is None:
            self.writer.record(
                self.stage, self.tp_rank, pieces, (time.perf_counter() - mark) * 1e3, self.wall_offset_s + mark
            )
            return
        started, first = mark
        last = self.events.Event(enable_timing=True)
        last.record()
        self.writer.record(self.stage, self.tp_rank, pieces, functools.partial(elapsed_ms, first, last), started)

    def close(self) -> None:
        self.writer.close()


def elapsed_ms(first, last) -> float:
    """A forward's time between two CUDA events, read by the writer's thread: it waits for the second, the serving
    loop never does."""
    last.synchronize()
    return first.elapsed_time(last)


def start(scheduler) -> Tracer | bool:
    """The tracer of `scheduler`'s process, its part PATH.rank<r> opened with the header; False (and one line) where
    PPPROF_TRACE is unset or SGLang's state cannot be read. Never raises into the scheduler."""
    path = os.environ.get(TRACE_ENV)
    if not path:
        return False
    try:
        from sglang.srt.runtime_context import get_parallel

        from ppprof.servers.sglang import SGLANG
        from ppprof.sglang.match import model_shape_of

        parallel = get_parallel()
        pp_rank, pp_size, tp_rank, tp_size = (int(getattr(parallel, name)) for name in PARALLEL_FIELDS)
        config, device = scheduler.model_config, str(scheduler.device)
        events = getattr(scheduler, "device_module", None) if device.startswith("cuda") else None
        dtype = getattr(config, "dtype", None)
        identity = TraceIdentity(
            model_shape=model_shape_of(config),
            pp_size=pp_size,
            tp_size=tp_size,
            device=device.partition(":")[0],
            dtype=str(dtype).removeprefix("torch.") if dtype is not None else "unknown",
            server=SGLANG.name,
            server_version=installed_version(SGLANG.name),
            context_len=int(config.context_len),
        )
        head = header(
            identity,
            clock="perf_counter" if events is None else "cuda_events",
            max_records=0,
            started_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        )
    except Exception as e:  # noqa: BLE001 - the server goes on untraced
        logger.warning(f"forward trace {path}: SGLang's state is not readable ({e!r}): tracing is off")
        return False
    writer = ForwardTraceWriter(f"{path}.rank{pp_rank * tp_size + tp_rank}", head)
    if writer.off:  # it said why in one line
        return False
    tracer = Tracer(writer, pp_rank, tp_rank, events)
    atexit.register(tracer.close)  # the end record, with the forwards dropped, at the process's exit
    return tracer


def installed_version(distribution: str) -> str:
    """The installed distribution's version, or "unknown" (a stand-in package has none)."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "unknown"


def close(scheduler) -> None:
    """Close `scheduler`'s part now (its end record written), as at the process's exit."""
    tracer = scheduler.__dict__.get(TRACER)
    if tracer:
        tracer.close()
        atexit.unregister(tracer.close)

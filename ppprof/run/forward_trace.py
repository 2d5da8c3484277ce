"""`--forward-trace PATH` of `ppprof serve-bench` and `ppprof bench`: every rank writes its stage's forwards to its own
part (PATH.rank<r>) while it serves, through the writer that never blocks (ppprof.forwards); after the run rank 0
joins the parts into PATH in one atomic write and removes them (docs/forwards.md)."""

from __future__ import annotations

import datetime as dt
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ppprof import __version__
from ppprof.fit.samples import model_shape
from ppprof.forwards import ForwardTraceWriter, TraceIdentity, header
from ppprof.io import atomic_write

if TYPE_CHECKING:
    from ppprof.distributed.pipe import Pipe
    from ppprof.run.rank import RankRun


def check_trace_path(path: str | None) -> None:
    """Before any rank starts: ValueError (one line) where PATH or a rank's part exists (nothing is overwritten) or
    PATH's folder is not one."""
    if path is None:
        return
    target = Path(path)
    if target.exists() or target.is_symlink():
        raise ValueError(f"--forward-trace {path} exists: remove it or name another file (nothing is overwritten)")
    if target.parent.exists() and not target.parent.is_dir():
        raise ValueError(f"--forward-trace {path}: its folder {target.parent} is not a folder; name a file in one")
    parts = sorted(target.parent.glob(f"{target.name}.rank*")) if target.parent.is_dir() else []
    if parts:
        raise ValueError(
            f"--forward-trace {path}: a part of an earlier run is there ({parts[0]}): remove it or name another file"
        )


def part_path(path: str | Path, rank: int) -> Path:
    return Path(f"{path}.rank{rank}")


class RankTrace:
    """One rank's part of the trace: `record` after each forward of its stage (the forward's perf_counter start and
    its time in ms), `close` at the end."""

    def __init__(self, path: str, run: RankRun, context_len: int, server: str, pp_size: int | None = None) -> None:
        """`run`: this rank's (its rank, pipe, model spec and dtype); `pp_size`: the pipeline's stages where a rank
        runs several (a bench's replayed pipeline); None: the ranks'."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        pipe = run.pipe
        self.stage = pipe.rank
        self.tp_rank = 0 if pipe.mesh is None else pipe.mesh.coords.tp_rank
        # the host clock's start of a forward as Unix seconds: perf_counter is monotonic, time.time the wall
        self.wall_offset_s = time.time() - time.perf_counter()
        identity = TraceIdentity(
            model_shape=model_shape(run.spec.to_dict()),
            pp_size=pp_size or pipe.pp_size,
            tp_size=pipe.tp_size,
            device=pipe.device.type,
            dtype=str(run.dtype).removeprefix("torch."),
            server=server,
            server_version=__version__,
            context_len=context_len,
        )
        started_at = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        head = header(identity, clock="perf_counter", max_records=0, started_at=started_at)
        self.writer = ForwardTraceWriter(part_path(path, run.rank), head)

    def record(self, pieces, start_perf_s: float, latency_ms: float, stage: int | None = None) -> None:
        """One forward of this rank's stage (or of `stage`, where a rank runs several one after the other)."""
        self.writer.record(
            self.stage if stage is None else stage, self.tp_rank, pieces, latency_ms, self.wall_offset_s + start_perf_s
        )

    def close(self) -> None:
        self.writer.close()


def join_parts(pipe: Pipe, rank: int, path: str, trace: RankTrace | None) -> None:
    """Collective: every rank closes its part; rank 0 writes PATH, the parts one after the other (each a header, its
    forwards, its end record: the headers agree, so the file reads as one trace), and removes them."""
    if trace is not None:
        trace.close()
    pipe.barrier()
    if rank == 0:
        parts = [part_path(path, r) for r in range(pipe.num_ranks)]
        present = [p for p in parts if p.is_file()]

        def write(tmp: Path) -> None:
            with open(tmp, "wb") as out:
                for part in present:
                    with open(part, "rb") as f:
                        left = whole_lines(part)
                        while left > 0 and (block := f.read(min(TAIL_BYTES, left))):
                            out.write(block)
                            left -= len(block)

        if present:
            atomic_write(path, write)
        for part in present:
            os.unlink(part)
    pipe.barrier()


def whole_lines(part: Path) -> int:
    """The bytes of `part` up to its last newline: a writer that turned itself off mid-line leaves no half record
    in the middle of the joined trace."""
    size = part.stat().st_size
    with open(part, "rb") as f:
        f.seek(max(0, size - TAIL_BYTES))
        tail = f.read()
    return size - len(tail) + tail.rfind(b"\n") + 1


TAIL_BYTES = 2**20
"""Where a part's last newline is looked for: a record is far shorter."""

"""One rank's part of a bench prompt: its stages run every chunk of the prompt as soon as it arrives, and send it on
without waiting (non-blocking transfers), so that chunk k+1 is on stage 0 while chunk k is on stage 1, as in a serving
engine. Each stage's request keeps its KV and Mamba state across the prompt's chunks and is released at the end
(KV slots, Mamba slot, request entry); every stage's pools are checked after every prompt."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ppprof.distributed.agree import RunError, stop_if_any_failed
from ppprof.distributed.pipe import FAILED, OK, Pipe
from ppprof.mem import Request, StageCache
from ppprof.mem.cache import describe_leaks
from ppprof.model.stage import Stage
from ppprof.probe.timer import Timer, device_sync

WARMUP_REPEAT = -1
"""The repeat number of a warm-up prompt (run, not reported)."""


@dataclass(frozen=True, slots=True)
class BenchPrompt:
    """One prompt of the schedule: a plan (`arm`) of `prompt_len` tokens in `chunk_sizes`; WARMUP_REPEAT marks a
    warm-up."""

    index: int
    arm: str
    repeat: int
    prompt_len: int
    chunk_sizes: tuple[int, ...]


def chunk_row(
    prompt: BenchPrompt, chunk: int, chunk_size: int, prefix_len: int, stage: int, rank: int, wait_ms: float
) -> dict:
    """The row of one chunk on one stage, before its timings (start_ms, end_ms, compute_ms) are known."""
    return {
        "prompt": prompt.index,
        "arm": prompt.arm,
        "repeat": prompt.repeat,
        "prompt_len": prompt.prompt_len,
        "chunk": chunk,
        "chunk_size": chunk_size,
        "prefix_len": prefix_len,
        "stage": stage,
        "rank": rank,
        "wait_ms": round(wait_ms, 4),
    }


@dataclass(slots=True)
class BenchStage:
    """A pipeline stage this rank runs: its global index, layers and cache."""

    index: int
    stage: Stage
    cache: StageCache


@dataclass(slots=True)
class PromptResult:
    """What this rank measured for one prompt: one row per (chunk, stage of this rank); rank 0 also the TTFT."""

    rows: list[dict] = field(default_factory=list)
    ttft_ms: float = float("nan")


class PromptRunner:
    """Runs bench prompts through this rank's stages (one, or several one after the other for a replayed pipeline)."""

    def __init__(self, *, stages: list[BenchStage], pipe: Pipe, seed: int) -> None:
        self.stages = stages
        self.pipe = pipe
        self.seed = seed
        self.device = stages[0].cache.device
        self.trace = None
        """Where each forward is also recorded (`record(pieces, start_perf_s, latency_ms, stage)`: a forward trace's
        rank part, ppprof.run.forward_trace), or None."""

    def run(self, prompt: BenchPrompt) -> PromptResult:
        """Every chunk of `prompt` through this rank's stages; collective with the other ranks. Raises RunError on
        every rank when any rank failed or leaked."""
        reqs = [Request(prompt.index) for _ in self.stages]
        result, error = PromptResult(), None
        start = time.perf_counter()
        try:
            admit_error = next(
                (
                    f"stage {s.index} cannot admit prompt {prompt.index}: {s.cache.outstanding()}"
                    for s, req in zip(self.stages, reqs)
                    if not s.cache.admit(req)
                ),
                None,
            )
            stop_if_any_failed(self.pipe, admit_error)  # no rank goes on to wait for a chunk that will not come
            self.pipe.barrier()  # every rank starts the prompt's clock together
            error = self._chunks(prompt, reqs, result)
        finally:
            for s, req in zip(self.stages, reqs):
                s.cache.release(req)
        self.pipe.measured(time.perf_counter() - start)
        stop_if_any_failed(self.pipe, error)
        leaks = self.pipe.all_gather_ranks([(s.index, s.cache.leaks()) for s in self.stages])
        found = [f"stage {i}: {describe_leaks(lk)}" for per_rank in leaks for i, lk in per_rank if lk]
        if found:
            raise RunError(f"leak check failed after prompt {prompt.index}: " + "; ".join(found))
        return result

    def _chunks(self, prompt: BenchPrompt, reqs: list[Request], result: PromptResult) -> str | None:
        pipe, sizes = self.pipe, prompt.chunk_sizes
        t0 = time.perf_counter()
        tokens = None
        if pipe.is_first:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + prompt.index)
            tokens = torch.randint(self.stages[0].stage.spec.vocab_size, (prompt.prompt_len,), generator=gen)
            tokens = tokens.to(self.device)
            device_sync(self.device)
        pending = None if pipe.is_first else pipe.irecv_activation(sizes[0])
        sends, error, status, prefix_len, first_start = [], None, OK, 0, None
        for k, n in enumerate(sizes):
            wait_start = time.perf_counter()
            if pipe.is_first:
                x, residual = tokens[prefix_len : prefix_len + n], None
            else:
                chunk_status, x, residual = pending.wait()
                status = FAILED if chunk_status != OK else status
                pending = pipe.irecv_activation(sizes[k + 1]) if k + 1 < len(sizes) else None
            wait_ms = (time.perf_counter() - wait_start) * 1e3 if not pipe.is_first else 0.0
            for j, (s, req) in enumerate(zip(self.stages, reqs)):
                row = chunk_row(prompt, k, n, prefix_len, s.index, pipe.rank, wait_ms if j == 0 else 0.0)
                if status == OK:
                    try:
                        if s.cache.extend(req, n) is None:
                            raise RuntimeError(f"KV cache too small for {prefix_len + n} tokens")
                        with Timer(self.device) as t:
                            x, residual = s.stage(s.cache, req, x, residual, prefix_len)
                        first_start = t.start if first_start is None else first_start
                        if self.trace is not None:
                            self.trace.record([(prefix_len, n)], t.start, t.elapsed_ms, s.index)
                        compute_ms = pipe.tp_slowest(t.elapsed_ms)  # the stage's: its slowest TP rank's
                        row.update(
                            start_ms=(t.start - t0) * 1e3,
                            end_ms=(t.start - t0) * 1e3 + compute_ms,
                            compute_ms=compute_ms,
                        )
                    except Exception as e:
                        status, error = (
                            FAILED,
                            (
                                f"stage {s.index}, prompt {prompt.index}, chunk {k} "
                                f"({prefix_len} + {n} tokens): {type(e).__name__}: {e}"
                            ),
                        )
                        pipe.tp_failed(error)  # under TP, the run's verdict (its TP peers may wait in an all-reduce)
                result.rows.append(row)
            if not pipe.is_last:
                sends.append(pipe.isend_activation(status, x, residual, n))
            prefix_len += n
        for works in sends:
            pipe.wait_sends(works)
        self._finish(result, status, first_start)
        return error

    def _finish(self, result: PromptResult, status: int, first_start: float | None) -> None:
        """The last stage tells rank 0 it is done; rank 0's TTFT runs from its first chunk's start to then."""
        pipe = self.pipe
        if pipe.is_last and not pipe.is_first:
            pipe.send_done(status)
        if pipe.is_first:
            done = pipe.recv_done() if not pipe.is_last else status
            if done == OK and status == OK and first_start is not None:
                result.ttft_ms = (time.perf_counter() - first_start) * 1e3

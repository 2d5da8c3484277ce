"""SGLang 0.5.23's own batch formation on a CPU, run as a user's process runs it: started with PPPROF_POLICY set and
ppprof's start-up hook first on PYTHONPATH (as `python -m ppprof.sglang` starts SGLang), SGLang imported from its
CPU install (tests/sglang/cpu_install.py) with the GPU-only packages stubbed (tests/sglang/cpu_stubs.py).

    python tests/sglang/scheduler_run.py SGLANG_SITE OUT.json LOAD... (run by tests/sglang/test_scheduler.py)

SGLang's real parts: its published runtime context (ServerArgs: pp_size 2, --enable-dynamic-chunking,
--chunked-prefill-size B), its world group (a one-rank gloo group built by SGLang's init_distributed_environment),
Scheduler.maybe_init_dynamic_chunk_sizer (which builds the sizer the hook put in place), Req, the waiting queue,
SchedulePolicy, PrefillAdder, get_new_batch_prefill with the chunked request, ScheduleBatch.init_new and
prepare_for_extend, stash_chunked_request, a ReqToTokenPool and TokenToKVPoolAllocator on the CPU and
RadixCache.create_simulated. Stand-ins, named where set: the model runner (no forward: a batch's forward returns at
once, so each batch is formed right after the last), the grammar manager (no constrained requests), the beam
coordinator (no beams) and the load inquirer (stats only). Requests leave at the end of their prefill (no decode): a
closed loop of C clients sends the next prompt when one's prefill ends; Poisson arrivals come on a clock that runs by
each batch's forward on the policy's planning model (run_load). The PP loop's micro-batch slots are not run: each
batch is formed after the last one's result.

Writes {"runs": {load: {"batches": [[[rid, prefix, size], ...], ...], "prompts": {rid: length}}}, "sizer": [the
sizers' modules], "log": [ppprof.sglang's lines], "failures": {case: a run, its sizer and its lines}}: every batch
SGLang formed, each piece's request, prefix and size, read from SGLang's ScheduleBatch (reqs, prefix_lens,
extend_lens)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
from array import array
from pathlib import Path
from types import SimpleNamespace

from ppprof.bounds import POLICY_ENV

REPO = Path(__file__).resolve().parents[2]
B = 512
MAX_PREFILL_TOKENS = 16384
PP_SIZE = 2
PROMPTS = (9000, 1200, 4100, 600, 2600, 7000, 300, 5200)
"""The closed loops' prompt lengths, in order of sending: mostly longer than B, so SGLang chunks them."""
REQUESTS = 32
"""Prompts each closed loop sends in all."""


@contextlib.contextmanager
def published(**fields):
    """SGLang's runtime context for one scheduler of world rank 0, as sglang/test/test_utils.py's
    published_topology publishes it (that module imports SGLang's benchmarks, whose datasets are not installed)."""
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path="dummy", **fields)
    reset_context()
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None))
    try:
        yield server_args
    finally:
        reset_context()


def world_group() -> None:
    """SGLang's world group: one gloo rank, built by SGLang's own init_distributed_environment."""
    from sglang.srt.distributed.parallel_state import init_distributed_environment

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init_distributed_environment(
        world_size=1, rank=0, local_rank=0, backend="gloo", distributed_init_method=f"tcp://127.0.0.1:{port}"
    )


def scheduler(model_config):
    """SGLang's Scheduler built with __new__ (as SGLang's CPU tests build it), with the state batch formation reads."""
    import torch
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    s = Scheduler.__new__(Scheduler)
    s.page_size, s.device = 1, "cpu"
    s.chunked_prefill_size, s.max_prefill_tokens = B, MAX_PREFILL_TOKENS
    s.max_running_requests, s.max_prefill_bs = 128, 0
    s.req_to_token_pool = ReqToTokenPool(size=64, max_context_len=32768, device="cpu", enable_memory_saver=False)
    s.token_to_kv_pool_allocator = TokenToKVPoolAllocator(
        size=600_000, dtype=torch.float16, device="cpu", kvcache=None, need_sort=False
    )
    s.tree_cache = RadixCache.create_simulated(mock_allocator=s.token_to_kv_pool_allocator)
    s.tree_cache.req_to_token_pool = s.req_to_token_pool
    s.model_config = model_config
    s.spec_algorithm = SpeculativeAlgorithm.NONE
    s.disaggregation_mode = DisaggregationMode.NULL
    s.waiting_queue, s.chunked_req = [], None
    for name in ("prefill_delayer", "min_free_slots_delayer", "dllm_config", "hisparse_coordinator"):
        setattr(s, name, None)
    for name in (
        "enable_priority_preemption",
        "is_hybrid_swa",
        "is_mixed_chunk",
        "enable_lora",
        "enable_hicache_storage",
        "enable_lmcache",
        "enable_hierarchical_cache",
        "enable_unified_cache_external_linker",
        "enable_priority_scheduling",
        "enable_overlap",
    ):
        setattr(s, name, False)
    s.processed_tokens_counter, s.priority_scheduling_preemption_threshold, s.truncation_align_size = 0, 0, None
    s.new_token_ratio_tracker = NewTokenRatioTracker.from_config()
    # Stand-ins: a model runner without a model (its attention backend has no tile size: SGLang's fallback of 64),
    # no constrained requests, no beams, no load reporting.
    s.tp_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=object(), prefill_aware_swa=False))
    s.grammar_manager = SimpleNamespace(has_waiting_grammars=lambda: False)
    s.beam_coordinator = SimpleNamespace(pending_member_rows=lambda batch: 0)
    s.load_inquirer = SimpleNamespace(_get_num_pending_tokens=lambda chunk_deduct=0: 0)
    s.policy = SchedulePolicy("fcfs", s.tree_cache, False, False, False)
    s.maybe_init_dynamic_chunk_sizer()
    return s


def arrivals(load: str, requests: int = REQUESTS) -> list[float] | None:
    """A load's arrival times in ms: "rate-10", Poisson at 10 requests a second (ppprof.serving's draw, seed 0);
    None for a closed loop ("4")."""
    if not load.startswith("rate-"):
        return None
    from ppprof.serving.simulate import LoadLevel, arrival_times

    return arrival_times(LoadLevel(rate=float(load[len("rate-") :])), requests, seed=0)


def batch_ms(policy):
    """The clock of an open loop: a batch [[rid, prefix, size], ...] takes its packed forward on the policy's
    planning model, one stage (ppprof.serving.arms.packed_stage_ms); the stand-in model runner itself returns at
    once."""
    from ppprof.serving.arms import packed_stage_ms
    from ppprof.serving.scheduler import Batch, Piece

    stage_ms = packed_stage_ms(policy.latency_model, 1)
    return lambda pieces: stage_ms(Batch(0, tuple(Piece(0, p, n, False) for _, p, n in pieces)))[0]


def run_load(s, load: str, requests: int = REQUESTS, clock=None) -> dict:
    """`requests` prompts into SGLang's waiting queue, from a closed loop of int(load) clients (the next prompt sent
    when one's prefill ends) or at the arrival times of `load` on `clock` (batch_ms: time runs by the batches SGLang
    forms, and waits for the next arrival where nothing is left); every batch SGLang forms until all are prefilled."""
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch
    from sglang.srt.sampling.sampling_params import SamplingParams

    times = arrivals(load, requests)
    name = load if times is not None else f"c{load}"
    sent: dict[str, int] = {}

    def send():
        i = len(sent)
        n = PROMPTS[i % len(PROMPTS)]
        rid = f"{name}-r{i}"
        sent[rid] = n
        tokens = array("q", [1000 * (i + 1) + k % 997 for k in range(n)])  # no prefix shared between prompts
        s.waiting_queue.append(Req(rid, "", tokens, SamplingParams(max_new_tokens=1)))

    now = 0.0
    if times is None:
        for _ in range(min(int(load), requests)):
            send()
    batches = []
    while len(sent) < requests or s.waiting_queue or s.chunked_req is not None:
        if times is not None:
            if not s.waiting_queue and s.chunked_req is None:
                now = max(now, times[len(sent)])
            while len(sent) < requests and times[len(sent)] <= now:
                send()
        if s.chunked_req is not None:
            s.stash_chunked_request(s.chunked_req)  # as get_next_batch_to_run does before the next batch
        batch = s.get_new_batch_prefill(ScheduleBatch(reqs=[], batch_is_full=False)).batch_to_run
        assert batch is not None, "SGLang formed no batch with prefill work waiting"
        batches.append([[r.rid, int(p), int(n)] for r, p, n in zip(batch.reqs, batch.prefix_lens, batch.extend_lens)])
        done = sum(1 for r in batch.reqs if r is not s.chunked_req)  # the forward returned at once
        if times is None:
            for _ in range(done):
                if len(sent) < requests:
                    send()
        else:
            now += clock(batches[-1])
        assert len(batches) < 5000, "no end to the loop"
    return {"batches": batches, "prompts": sent}


def failing(config, name: str, path: str, records: list[str]) -> dict:
    """A closed loop of one client (two prompts) on a scheduler built with PPPROF_POLICY=path: a file SGLang's
    sizer must refuse, or ("raises") the good policy whose answers raise inside SGLang's get_new_batch_prefill.
    The batches and the lines ppprof said while it ran."""
    first = len(records)
    os.environ[POLICY_ENV] = path
    s = scheduler(config)
    if name == "raises":  # the loaded policy, its answers replaced by an exception
        loaded = s.dynamic_chunk_sizer.policy

        class Raising:
            load_rule = loaded.load_rule

            def next_chunk_size(self, *args, **kwargs):
                raise RuntimeError("a policy that raises")

        s.dynamic_chunk_sizer.policy = Raising()
    run = run_load(s, "1", requests=2)
    run["sizer"] = None if s.dynamic_chunk_sizer is None else type(s.dynamic_chunk_sizer).__module__
    run["log"] = records[first:]
    return run


def main(site: str, out: str, *loads: str) -> None:
    """`loads`: closed loops' concurrencies ("4"), Poisson rates ("rate-10": requests a second), or failure cases,
    NAME=POLICY_PATH (failing)."""
    sys.path.insert(0, str(REPO))
    from tests.sglang import cpu_stubs

    cpu_stubs.install(site)
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logging.getLogger("ppprof.sglang").addHandler(handler)
    logging.getLogger("ppprof.sglang").setLevel(logging.INFO)
    policy = Path(os.environ[POLICY_ENV])
    from tests.sglang.standin import model_config

    config = model_config(policy, vocab_size=32000, is_encoder_decoder=False, hf_eos_token_id=None)
    with published(
        pp_size=PP_SIZE,
        chunked_prefill_size=B,
        max_prefill_tokens=MAX_PREFILL_TOKENS,
        enable_dynamic_chunking=True,
        page_size=1,
        device="cpu",
        pp_max_micro_batch_size=64,
    ):
        world_group()
        concurrencies = [c for c in loads if "=" not in c]
        from ppprof.policy import load as load_policy

        clock = batch_ms(load_policy(policy))
        schedulers = {c: scheduler(config) for c in concurrencies}  # each loop on its own scheduler and cache
        result = {
            "sizer": sorted({type(s.dynamic_chunk_sizer).__module__ for s in schedulers.values()}),
            "runs": {c: run_load(s, c, clock=clock) for c, s in schedulers.items()},
            "log": list(records),
        }
        cases = dict(c.split("=", 1) for c in loads if "=" in c)
        result["failures"] = {name: failing(config, name, path, records) for name, path in cases.items()}
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])

"""SGLang 0.5.23's own batch formation and PP loop slots on a CPU, run as a user's process runs it: started with
PPPROF_POLICY set and ppprof's start-up hook first on PYTHONPATH (as `python -m ppprof.sglang` starts SGLang), SGLang
imported from its CPU install (tests/sglang/cpu_install.py) with the GPU-only packages stubbed (tests/sglang/
cpu_stubs.py).

    python tests/sglang/scheduler_run.py SGLANG_SITE OUT.json RUN... (run by tests/sglang/test_scheduler.py)

SGLang's real parts: its published runtime context (ServerArgs: pp_size 2, --enable-dynamic-chunking,
--chunked-prefill-size B, --pp-async-batch-depth), its world group (a one-rank gloo group built by SGLang's
init_distributed_environment), Scheduler.maybe_init_dynamic_chunk_sizer (which builds the sizer the hook put in
place), SGLang's own DynamicChunkSizer and ChunkSizePredictor (the `greedy` arm), Req, the waiting queue,
SchedulePolicy, PrefillAdder, and the PP loop's steps as event_loop_pp takes them for each micro-batch slot:
init_pp_loop_state (pp_loop_size, running_mbs, last_mbs, mbs), get_next_batch_to_run (the chunked request stashed,
the last batch filtered, get_new_batch_prefill), run_batch, and the prefill result's processing
(SchedulerBatchResultProcessor.process_batch_result_prefill: requests finished and their KV released into
RadixCache.create_simulated), on a CPU ReqToTokenPool and TokenToKVPoolAllocator. Stand-ins, named where set: the
model worker (a forward returns at once, as a non-last PP rank's, with no sampled tokens), the grammar manager, the
beam coordinator, the load inquirer, the metrics reporter and profiler, the DP-attention adapter and n-gram
embeddings (none configured), the output streamer (no client). The loop's sends and receives between PP ranks
(event_loop_pp's _pp_send_* / _pp_recv_*) are not run: one process is one rank, and each slot's result is processed
when the slot's batch leaves the last stage on the clock below, where event_loop_pp would receive it.

Time runs by each batch's forward on the policy's planning model, stage by stage (ppprof.serving.arms.
packed_stage_ms), as ppprof.serving.simulate times a pipeline: a closed loop of C clients sends the next prompt when
one's prefill ends; Poisson arrivals come at ppprof.serving's draw (seed 0). Requests leave at the end of their
prefill (max_new_tokens 1).

RUN is ARM:LOAD[:DEPTH] (ARM of ARMS; LOAD "4", a closed loop of 4, or "rate-10"; DEPTH the async batch depth, 0
unless given), NAME=POLICY_PATH for a failure case (failing; "lof": the good policy with SGLang's queue ordered
longest output first), policy-load=POLICY_PATH (the policy with an under-load
rule the policy-load arm loads), or trace=PATH (a closed loop of 4 with the policy on PP rank 0 and on PP rank 1,
each rank's prefill forwards traced into PATH as SGLang's process traces them with PPPROF_TRACE set).

Writes {"runs": {run: {"batches": [[[rid, prefix, size], ...], ...], "prompts": {rid: length}, "slots": [each batch's
micro-batch slot], "loop_size": pp_loop_size, "budget_after": the scheduler's chunked_prefill_size after the run}},
"first_chunk_wrapped": whether the hook wrapped get_new_batch_prefill, "sizer": {run: the sizer's module}, "greedy_fit": SGLang's fitted
[a, b, c], "log": [ppprof.sglang's lines], "failures": {case: a run, its sizer and its lines}, "traces": [the trace
parts written]}: every batch SGLang formed, each piece's request, prefix and size, read from SGLang's ScheduleBatch
(reqs, prefix_lens, extend_lens)."""

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

from ppprof.bounds import POLICY_ENV, TRACE_ENV

REPO = Path(__file__).resolve().parents[2]
B = 512
MAX_PREFILL_TOKENS = 16384
PP_SIZE = 2
PROMPTS = (9000, 1200, 4100, 600, 2600, 7000, 300, 5200)
"""The closed loops' prompt lengths, in order of sending: mostly longer than B, so SGLang chunks them."""
REQUESTS = 32
"""Prompts each loop sends in all."""
ARMS = ("fixed", "greedy", "policy", "policy-load")
"""fixed: SGLang without a sizer (static chunks of B); greedy: SGLang's own DynamicChunkSizer, its predictor fitted on
the policy's model; policy: ppprof's sizer on the policy; policy-load: ppprof's sizer on the policy with an
under-load rule."""
NUM_PROBES = 128
"""SGLang's start-up probes: sizes falling linearly from 1.25 B (DynamicChunkSizer._profile_prefill_latency)."""


@contextlib.contextmanager
def published(world_rank: int = 0, **fields):
    """SGLang's runtime context for one scheduler of `world_rank` (its PP rank, at TP 1), as sglang/test/
    test_utils.py's published_topology publishes it (that module imports SGLang's benchmarks, whose datasets are not
    installed)."""
    from sglang.srt.runtime_context import SpawnRanks, publish, reset_context
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path="dummy", **fields)
    reset_context()
    publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=world_rank, dp_rank=None))
    try:
        yield server_args
    finally:
        reset_context()


def settings(async_depth: int = 0) -> dict:
    """The server's arguments every run publishes."""
    return {
        "pp_size": PP_SIZE,
        "chunked_prefill_size": B,
        "max_prefill_tokens": MAX_PREFILL_TOKENS,
        "enable_dynamic_chunking": True,
        "page_size": 1,
        "device": "cpu",
        "pp_max_micro_batch_size": 64,
        "pp_async_batch_depth": async_depth,
    }


def world_group() -> None:
    """SGLang's world group: one gloo rank, built by SGLang's own init_distributed_environment the first time; in a
    context published afresh, the same group stated again as SGLang states it (override_permanently)."""
    from sglang.srt.distributed import parallel_state

    if parallel_state._WORLD is not None:
        from sglang.srt.runtime_context import get_parallel

        get_parallel().override_permanently(world_group=parallel_state._WORLD)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    parallel_state.init_distributed_environment(
        world_size=1, rank=0, local_rank=0, backend="gloo", distributed_init_method=f"tcp://127.0.0.1:{port}"
    )


class Quiet:
    """A stand-in whose every method does nothing (metrics, profiling, output streaming: no client here)."""

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


def scheduler(model_config):
    """SGLang's Scheduler built with __new__ (as SGLang's CPU tests build it), with the state its batch formation,
    run_batch and the prefill result's processing read."""
    import torch
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
    from sglang.srt.managers.scheduler_components.logprob_result_processor import SchedulerLogprobResultProcessor
    from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
    from sglang.srt.managers.utils import GenerationBatchResult
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
    s.waiting_queue, s.chunked_req, s._pending_chunked_abort_req = [], None, None
    for name in ("prefill_delayer", "min_free_slots_delayer", "dllm_config", "hisparse_coordinator", "future_map"):
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
        "enable_hisparse",
        "require_mlp_sync",
        "enable_pdmux",
        "attn_dp_enabled",
        "_sched_idled",
    ):
        setattr(s, name, False)
    s.processed_tokens_counter, s.priority_scheduling_preemption_threshold, s.truncation_align_size = 0, 0, None
    s.prefill_decode_interval = s._prefill_decode_interval_remaining = s.forward_ct = 0
    s.scripted_scheduler_hook = s.forward_sleep_time = s.scheduler_stage_metrics = None
    s.is_generation = True
    s.new_token_ratio_tracker = NewTokenRatioTracker.from_config()
    # Stand-ins: a model runner without a model (its attention backend has no tile size: SGLang's fallback of 64)
    # and a model worker whose forward returns at once with no sampled tokens (a non-last PP rank's result); no
    # constrained requests, no beams, no DP attention, no n-gram embeddings, no metrics, no clients.
    s.tp_worker = SimpleNamespace(model_runner=SimpleNamespace(attn_backend=object(), prefill_aware_swa=False))
    s.model_worker = SimpleNamespace(forward_batch_generation=lambda batch, **kwargs: GenerationBatchResult())
    s.grammar_manager = SimpleNamespace(has_waiting_grammars=lambda: False)
    s.beam_coordinator = SimpleNamespace(pending_member_rows=lambda batch: 0)
    s.load_inquirer = SimpleNamespace(_get_num_pending_tokens=lambda chunk_deduct=0: 0)
    s.dp_attn_adapter = SimpleNamespace(
        maybe_prepare_mlp_sync_batch=lambda batch, need_sync=False: batch,
        maybe_convert_decode_to_extend=lambda batch: batch,
    )
    s.ngram_embedding_manager = SimpleNamespace(prepare_for_forward=lambda batch, chunked_req=None: batch)
    s.metrics_reporter = s.profiler_manager = Quiet()
    s.policy = SchedulePolicy("fcfs", s.tree_cache, False, False, False)
    s.batch_result_processor = SchedulerBatchResultProcessor(
        is_generation=True,
        disaggregation_mode=DisaggregationMode.NULL,
        enable_overlap=False,
        enable_overlap_mlx=False,
        model_config=model_config,
        token_to_kv_pool_allocator=s.token_to_kv_pool_allocator,
        tree_cache=s.tree_cache,
        hisparse_coordinator=None,
        req_to_token_pool=s.req_to_token_pool,
        decode_offload_manager=None,
        metrics_collector=None,
        metrics_reporter=s.metrics_reporter,
        draft_worker=None,
        model_worker=s.model_worker,
        logprob_result_processor=SchedulerLogprobResultProcessor(model_config=model_config),
        output_streamer=Quiet(),
        beam_coordinator=s.beam_coordinator,
        abort_request=lambda *args, **kwargs: None,
    )
    s.maybe_init_dynamic_chunk_sizer()
    return s


def sglang_greedy(s, model) -> list[float]:
    """SGLang's own DynamicChunkSizer (the class the hook stood in for) on scheduler `s`, its ChunkSizePredictor
    fitted as profile_and_fit fits it, on SGLang's probe sizes timed by `model` without prefix instead of forwards;
    returns the fitted [a, b, c]."""
    from ppprof.sglang import hook

    sizer = hook.sglang_sizer_class()(
        model_runner=s.tp_worker.model_runner,
        model_config=s.model_config,
        tree_cache=s.tree_cache,
        req_to_token_pool=s.req_to_token_pool,
        token_to_kv_pool_allocator=s.token_to_kv_pool_allocator,
        spec_algorithm=s.spec_algorithm,
        chunked_prefill_size=s.chunked_prefill_size,
        max_prefill_tokens=s.max_prefill_tokens,
        page_size=s.page_size,
        device=s.device,
    )
    top = int(1.25 * B)
    sizes = [top - i * (top // NUM_PROBES) for i in range(NUM_PROBES)]
    predictor = sizer.predictor
    predictor.fit(sizes, [model.one_chunk_ms(0, n) for n in sizes])
    predictor.set_target_latency(s.chunked_prefill_size)
    predictor.is_ready = True
    s.dynamic_chunk_sizer = sizer
    return [predictor.quadratic_coeff_a, predictor.linear_coeff_b, predictor.constant_coeff_c]


def arrivals(load: str, requests: int = REQUESTS) -> list[float] | None:
    """A load's arrival times in ms: "rate-10", Poisson at 10 requests a second (ppprof.serving's draw, seed 0);
    None for a closed loop ("4")."""
    if not load.startswith("rate-"):
        return None
    from ppprof.serving.simulate import LoadLevel, arrival_times

    return arrival_times(LoadLevel(rate=float(load[len("rate-") :])), requests, seed=0)


def stage_clock(policy):
    """Each stage's time for a batch [[rid, prefix, size], ...]: its packed forward on the policy's planning model
    (ppprof.serving.arms.packed_stage_ms), PP_SIZE stages; the stand-in model worker itself returns at once."""
    from ppprof.serving.arms import packed_stage_ms
    from ppprof.serving.scheduler import Batch, Piece

    stage_ms = packed_stage_ms(policy.planning_model, PP_SIZE, policy.extra_piece_ms)
    return lambda pieces: stage_ms(Batch(0, tuple(Piece(0, p, n, last=False) for _, p, n in pieces)))


def run_loop(s, load: str, clock, name: str, requests: int = REQUESTS) -> dict:
    """`requests` prompts into SGLang's waiting queue, from a closed loop of int(load) clients or at the arrival
    times of `load`, served by event_loop_pp's steps for each micro-batch slot in turn until all are prefilled."""
    import torch
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.sampling.sampling_params import SamplingParams

    times = arrivals(load, requests)
    sent: dict[str, int] = {}

    def send():
        i = len(sent)
        n = PROMPTS[i % len(PROMPTS)]
        rid = f"{name}-r{i}"
        sent[rid] = n
        tokens = array("q", [1000 * (i + 1) + k % 997 for k in range(n)])  # no prefix shared between prompts
        params = SamplingParams(max_new_tokens=1)
        params.normalize(None)  # as SGLang's tokenizer manager does (no stop strings)
        s.waiting_queue.append(Req(rid, "", tokens, params))

    s.init_pp_loop_state()
    slots = s.pp_loop_size
    if times is None:
        for _ in range(min(int(load), requests)):
            send()
    now, stage_free, leaves, done = 0.0, [0.0] * PP_SIZE, {}, 0
    batches, batch_slots = [], []
    while done < requests:
        for mb_id in range(slots):
            s.running_batch, s.last_batch = s.running_mbs[mb_id], s.last_mbs[mb_id]
            while times is not None and len(sent) < requests and times[len(sent)] <= now:  # recv_requests
                send()
            plan = s.get_next_batch_to_run(running_batch=s.running_batch, last_batch=s.last_batch)
            s.running_batch, s.mbs[mb_id] = plan.running_batch, plan.batch_to_run
            s.running_mbs[mb_id] = s.running_batch
            batch = s.mbs[mb_id]
            if batch is not None:
                pieces = [[r.rid, int(p), int(n)] for r, p, n in zip(batch.reqs, batch.prefix_lens, batch.extend_lens)]
                batches.append(pieces)
                batch_slots.append(mb_id)
                s.run_batch(batch)  # _pp_launch_batch's call, the one the trace hook wraps
                end = now
                for stage, ms in enumerate(clock(pieces)):
                    end = stage_free[stage] = max(end, stage_free[stage]) + ms
                leaves[mb_id] = end
            elif not leaves and times is not None and len(sent) < requests:  # idle: time moves to the next arrival
                now = max(now, times[len(sent)])
            next_mb_id = (mb_id + 1) % slots
            if s.mbs[next_mb_id] is not None:  # its outputs come back when it leaves the last stage
                now = max(now, leaves.pop(next_mb_id))
                finished = s.mbs[next_mb_id]
                tokens = torch.zeros(len(finished.reqs), dtype=torch.int64)
                s.batch_result_processor.process_batch_result_prefill(
                    finished, GenerationBatchResult(next_token_ids=tokens)
                )
                s.last_mbs[next_mb_id] = finished
                for req in finished.reqs:
                    if req.finished() and req.rid in sent:
                        done += 1
                        if times is None and len(sent) < requests:
                            send()
            if done >= requests:
                break
        assert len(batches) < 5000, "no end to the loop"
    return {"batches": batches, "prompts": sent, "slots": batch_slots, "loop_size": slots}


def failing(config, name: str, path: str, clock, records: list[str]) -> dict:
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
    if name == "lof":  # the good policy, SGLang's queue ordered longest output first: the hook leaves B first
        from sglang.srt.managers.schedule_policy import SchedulePolicy

        s.policy = SchedulePolicy("lof", s.tree_cache, False, False, False)
    run = run_loop(s, "1", clock, name, requests=2)
    run["sizer"] = None if s.dynamic_chunk_sizer is None else type(s.dynamic_chunk_sizer).__module__
    run["log"] = records[first:]
    return run


def traced(config, path: str, clock) -> list[str]:
    """A closed loop of 4 (8 prompts) with the policy on PP rank 0, then on PP rank 1 (each its own published context
    and scheduler, as each rank's process has), PPPROF_TRACE=path; each rank's part closed as at the process's exit.
    The parts written."""
    from ppprof.sglang import trace

    os.environ[TRACE_ENV] = path
    try:
        for rank in range(PP_SIZE):
            with published(world_rank=rank, **settings()):
                world_group()
                s = scheduler(config)
                run_loop(s, "4", clock, f"rank{rank}", requests=8)
                trace.close(s)
    finally:
        del os.environ[TRACE_ENV]
    return sorted(str(p) for p in Path(path).parent.glob(f"{Path(path).name}.*"))


def main(site: str, out: str, *runs: str) -> None:
    sys.path.insert(0, str(REPO))
    from tests.sglang import cpu_stubs

    cpu_stubs.install(site)
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda r: records.append(r.getMessage())
    logging.getLogger("ppprof").addHandler(handler)  # ppprof.sglang's lines and the trace writer's
    logging.getLogger("ppprof").setLevel(logging.INFO)
    import sglang.srt.managers.scheduler  # noqa: F401 - imported as a server starts: the hook reads PPPROF_TRACE

    os.environ.pop(TRACE_ENV, None)  # then only the traced runs trace (trace=PATH)
    policy_path = os.environ[POLICY_ENV]
    from ppprof.policy import load as load_policy
    from tests.sglang.standin import model_config

    extra = {"vocab_size": 32000, "is_encoder_decoder": False, "hf_eos_token_id": None}
    extra |= {"self_opened_think_start_ids": None, "think_end_ids": None}  # no reasoning model
    extra["dtype"] = "torch.bfloat16"  # as str(ModelConfig.dtype) reads
    config = model_config(Path(policy_path), **extra)
    policy = load_policy(policy_path)
    clock = stage_clock(policy)
    named = dict(r.split("=", 1) for r in runs if "=" in r)
    result = {"runs": {}, "sizer": {}, "failures": {}, "traces": []}
    for run in (r for r in runs if "=" not in r):
        arm, load, *depth = run.split(":")
        with published(**settings(int(depth[0]) if depth else 0)):
            world_group()
            os.environ[POLICY_ENV] = named["policy-load"] if arm == "policy-load" else policy_path
            s = scheduler(config)
            if arm == "fixed":  # SGLang without --enable-dynamic-chunking builds no sizer
                s.dynamic_chunk_sizer = None
            elif arm == "greedy":
                result["greedy_fit"] = sglang_greedy(s, policy.planning_model)
            result["sizer"][run] = None if s.dynamic_chunk_sizer is None else type(s.dynamic_chunk_sizer).__module__
            result["runs"][run] = run_loop(s, load, clock, load if load.startswith("rate-") else f"c{load}")
            result["runs"][run]["budget_after"] = s.chunked_prefill_size  # SGLang's own B, back after each batch
    from sglang.srt.managers.scheduler import Scheduler

    from ppprof.sglang import first_chunk

    result["first_chunk_wrapped"] = getattr(Scheduler.get_new_batch_prefill, first_chunk.FIRST_CHUNK, False)
    with published(**settings()):
        world_group()
        result["log"] = list(records)
        for name in ("other-model", "corrupt", "missing", "raises", "lof"):
            if name in named:
                result["failures"][name] = failing(config, name, named[name], clock, records)
    if "trace" in named:
        os.environ[POLICY_ENV] = policy_path
        result["traces"] = traced(config, named["trace"], clock)
        result["trace_log"] = [x for x in records if "trace" in x]
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:])

"""predict() is the policy's own answer on every committed policy: Policy.next_chunk_size(prefix_len, prompt_len)
where the scheduler's chunked request is at that prefix (the prompt-aware rule), next_chunk_size(prefix_len) where
it is not (the history-only table), with the scheduler's waiting queue as the load (the under-load rule past its
handover); it never raises into the scheduler."""

from __future__ import annotations

import logging

import pytest

from ppprof.bounds import POLICY_ENV
from ppprof.policy import load

from .standin import COMMITTED, IDS, REPO, Scheduler, model_config, shaped, sizer_class
from .standin import request as chunked

REFERENCE = REPO / "results/bench-reference/profile/policy.json"


@pytest.fixture(params=COMMITTED, ids=IDS)
def loaded(request, tmp_path, monkeypatch):
    """(scheduler, sizer, policy) of a committed policy loaded by a server it fits."""
    path = shaped(request.param, tmp_path)
    monkeypatch.setenv(POLICY_ENV, str(path))
    policy = load(path)
    s = policy.settings
    hardware = policy.provenance.get("hardware") or {}  # the server the profile ran on (an H200's too)
    scheduler = Scheduler(
        sizer_class(pp_size=policy.pp_size, tp_size=policy.tp_size, device_name=hardware.get("device_name")),
        model_config(path),
        chunked_prefill_size=s.base_chunk_size,
        page_size=s.page_size,
        device=hardware.get("device", "cpu"),
    )
    sizer = scheduler.maybe_init_dynamic_chunk_sizer()
    assert scheduler.dynamic_chunk_sizer is sizer, "the committed policy fits its own profile's server"
    return scheduler, sizer, policy


def test_predict_is_the_history_only_table_without_the_request(loaded):
    _, sizer, policy = loaded
    context = policy.settings.context_len
    for prefix_len in [*range(0, 4096, 7), *range(4096, context, 127), context - 1]:
        assert sizer.predict(prefix_len) == policy.next_chunk_size(prefix_len), f"{prefix_len=}"


def test_predict_is_the_prompt_aware_rule_for_the_chunked_request(loaded):
    scheduler, sizer, policy = loaded
    context, base = policy.settings.context_len, policy.settings.base_chunk_size
    for prompt_len in sorted({base + 1, 3 * base + 17, 4096, 8191, 16384, 30000, context}):
        prefix_len = base  # SGLang's first chunk is B; it asks the sizer from the second chunk on
        while prefix_len < prompt_len:
            scheduler.chunked_req = chunked(prefix_len, prompt_len)
            want = policy.next_chunk_size(prefix_len, prompt_len)
            assert sizer.predict(prefix_len) == want, f"{prompt_len=} {prefix_len=}"
            prefix_len += min(want, prompt_len - prefix_len)
        for prefix_len in range(0, prompt_len, max(1, prompt_len // 97)):
            scheduler.chunked_req = chunked(prefix_len, prompt_len)
            assert sizer.predict(prefix_len) == policy.next_chunk_size(prefix_len, prompt_len)


def test_another_request_or_a_finished_prompt_gets_the_history_only_table(loaded):
    scheduler, sizer, policy = loaded
    scheduler.chunked_req = chunked(4096, 20000)
    assert sizer.predict(2048) == policy.next_chunk_size(2048)  # the chunked request is not at this prefix
    scheduler.chunked_req = chunked(4096, 4096)
    assert sizer.predict(4096) == policy.next_chunk_size(4096)  # nothing left of it: no prompt-aware answer
    scheduler.chunked_req = None
    assert sizer.predict(4096) == policy.next_chunk_size(4096)


def test_predict_never_raises_and_says_so_once(caplog, loaded):
    scheduler, sizer, _ = loaded
    with caplog.at_level(logging.WARNING, logger="ppprof.sglang"):
        assert sizer.predict(-1) is None and sizer.predict(2.5) is None and sizer.predict(None) is None
    lines = [r.getMessage() for r in caplog.records if r.name == "ppprof.sglang"]
    assert len(lines) == 1 and "predict(-1) failed" in lines[0], lines
    scheduler.chunked_req = chunked(64, 64)
    assert sizer.predict(64) == sizer.policy.next_chunk_size(64)  # nothing left to prefill: the table answers


def test_two_ranks_with_the_same_file_answer_alike(loaded):
    scheduler, sizer, policy = loaded
    twin = Scheduler(
        scheduler.cls,
        scheduler.model_config,
        chunked_prefill_size=scheduler.chunked_prefill_size,
        page_size=scheduler.page_size,
        device=scheduler.device,
    )
    other = twin.maybe_init_dynamic_chunk_sizer()
    for prefix_len in range(0, policy.settings.context_len, 997):
        assert other.predict(prefix_len) == sizer.predict(prefix_len)


def test_the_waiting_queue_and_the_slots_are_the_load_the_under_load_rule_reads(tmp_path, monkeypatch):
    committed = REFERENCE if REFERENCE in COMMITTED else COMMITTED[0]
    base = load(committed)
    unit = base.data["prompt_table"]["unit"]
    under = base.prompt_rule.largest_chunk // unit * unit
    rule = {"slots": 2, "fill": 8.0, "unit": unit, "full": {"bound_ms": None, "chunk_cap": under}}
    path = shaped(committed, tmp_path, schema_version=5, load=rule)
    monkeypatch.setenv(POLICY_ENV, str(path))
    policy = load(path)
    scheduler = Scheduler(
        sizer_class(pp_size=policy.pp_size, tp_size=policy.tp_size),
        model_config(path),
        chunked_prefill_size=policy.settings.base_chunk_size,
        page_size=policy.settings.page_size,
    )
    sizer = scheduler.maybe_init_dynamic_chunk_sizer()
    assert scheduler.dynamic_chunk_sizer is sizer
    n = 9000
    scheduler.chunked_req = chunked(1024, n)
    idle = policy.next_chunk_size(1024, n)
    assert sizer.predict(1024) == idle < under  # nothing waits: the idle rules
    scheduler.waiting_queue = [chunked(0, 60)]
    assert sizer.predict(1024) == idle  # 9060 tokens over 8 x 2 slots: short of the pipeline
    scheduler.waiting_queue = [chunked(0, 5000)] * 40
    full = sizer.predict(1024)
    assert idle < full <= under and full % unit == 0, f"{idle=} {full=} {under=}"
    assert full == policy.next_chunk_size(1024, n, pending_requests=40, pending_tokens=200000)
    model = policy.planning_model  # the chunk's latency is the share's, a first chunk of (n + 200000) / 16 tokens
    share = (n + 200000) // 16 // unit * unit
    assert model.one_chunk_ms(1024, full) <= model.one_chunk_ms(0, share)
    assert full == under or model.one_chunk_ms(1024, full + unit) > model.one_chunk_ms(0, share)
    scheduler.pp_loop_size = 400  # SGLang's slots (pp_size + pp_async_batch_depth): more slots, less a slot
    assert sizer.predict(1024) == policy.next_chunk_size(1024, n, pending_requests=40, pending_tokens=200000, slots=400)
    assert sizer.predict(1024) == idle
    scheduler.chunked_req = None  # without the request's length its work is the idle chunk; the load is read
    del scheduler.pp_loop_size
    assert sizer.predict(1024) == policy.next_chunk_size(1024, pending_requests=40, pending_tokens=200000) > idle


def test_every_committed_policy_answers_as_its_rule_whatever_waits(loaded):
    # without an under-load rule the queue is not read and the answer stays the idle one; with one, the policy's
    # answer at the queue's load (results/serving-real/ carries one)
    scheduler, sizer, policy = loaded
    scheduler.chunked_req = chunked(1024, 9000)
    idle = sizer.predict(1024)
    assert idle == policy.next_chunk_size(1024, 9000)
    scheduler.waiting_queue = [chunked(0, 5000)] * 4
    busy = policy.next_chunk_size(1024, 9000, pending_requests=4, pending_tokens=20000)
    assert sizer.predict(1024) == busy
    if policy.load_rule is None:
        assert busy == idle


def test_predict_keeps_nothing_and_allocates_no_more_than_its_answer(loaded):
    """The per-chunk path in the scheduler (predict, then Policy.next_chunk_size) builds no list, tuple or dict: a
    call's peak is a few transient numbers above an empty call's, and nothing is kept but the call counter (one int,
    replaced each call: what tracemalloc sees of it is the last one)."""
    from .test_server_import import allocated

    scheduler, sizer, policy = loaded
    sizer.agree_every = 10**9  # no agreement between the ranks inside the measurement
    prompt_len = min(policy.settings.context_len, 20000)
    scheduler.chunked_req = chunked(4096, prompt_len)
    for prefix_len in (4096, 2048):  # the prompt-aware rule, then the history-only table (another request)
        held, peak = allocated(lambda p=prefix_len: sizer.predict(p))
        empty_held, empty_peak = allocated(lambda: None)
        counter = 32  # sizer.calls, an int past the small ones Python keeps
        assert held - empty_held <= counter and peak - empty_peak <= 128, f"{prefix_len=} {held=} {peak=} {empty_peak=}"

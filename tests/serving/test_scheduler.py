"""The serving scheduler and its simulation (issue 33's first part): packing into the token budget, never more than
one partly prefilled request, slots served round robin with one batch each in the pipeline, the pools released in
full, closed-loop and Poisson arrivals."""

import pytest

from ppprof.serving.scheduler import Capacity, Load, Request, Scheduler
from ppprof.serving.simulate import Arrivals, LoadLevel, arrival_times, prompts_of, serve


def fixed(size):
    return lambda prefix_len, prompt_len, load: size


def test_waiting_requests_pack_whole_and_the_first_that_does_not_fit_is_cut():
    s = Scheduler(2, fixed(1000), Capacity(10_000, 8))
    for rid, n in enumerate((300, 500, 800)):
        s.arrive(Request(rid, n, 0.0))
    batch = s.next_batch(0)
    assert [(p.rid, p.prefix_len, p.size, p.last) for p in batch.pieces] == [
        (0, 0, 300, True),
        (1, 0, 500, True),
        (2, 0, 200, False),
    ]
    assert batch.tokens == 1000 and s.chunked.rid == 2 and not s.waiting


def test_the_chunked_request_comes_first_and_its_size_is_the_whole_budget():
    """SGLang's PrefillAdder: the chunked request's next chunk first, sized by the arm; the sizer's answer is the
    budget of the whole batch, so waiting requests get only what the chunked one leaves."""
    sizes = iter([400, 600])
    s = Scheduler(2, lambda prefix_len, prompt_len, load: next(sizes), Capacity(10_000, 8))
    s.arrive(Request(0, 1000, 0.0))
    s.arrive(Request(1, 100, 0.0))
    first = s.next_batch(0)  # no chunked request: request 0's first chunk, 400, takes the budget
    assert [(p.rid, p.size) for p in first.pieces] == [(0, 400)] and s.chunked.rid == 0
    second = s.next_batch(1)  # slot 1 while slot 0's batch is in the pipeline: the chunked request's next chunk
    assert [(p.rid, p.prefix_len, p.size, p.last) for p in second.pieces] == [(0, 400, 600, True)]
    assert s.chunked is None and len(s.waiting) == 1


def test_a_short_remainder_leaves_room_for_waiting_requests():
    s = Scheduler(1, fixed(512), Capacity(10_000, 8))
    s.arrive(Request(0, 600, 0.0))
    s.next_batch(0)
    s.finish(0, 1.0)
    s.arrive(Request(1, 100, 1.0))
    batch = s.next_batch(0)
    assert [(p.rid, p.size) for p in batch.pieces] == [(0, 88), (1, 100)]


def test_never_more_than_one_request_is_partly_prefilled():
    s = Scheduler(4, fixed(256), Capacity(100_000, 64))
    for rid in range(10):
        s.arrive(Request(rid, 700 + 37 * rid, 0.0))
    for step in range(40):
        slot = step % 4
        if slot in s.in_flight:
            s.finish(slot, float(step))
        s.next_batch(slot)
        partly = [r for r in s.requests.values() if 0 < r.scheduled < r.prompt_len]
        assert len(partly) <= 1


def test_the_load_seen_by_the_sizer():
    seen = []

    def sizer(prefix_len, prompt_len, load):
        seen.append(load)
        return 100

    s = Scheduler(2, sizer, Capacity(10_000, 8))
    s.arrive(Request(0, 250, 0.0))
    s.arrive(Request(1, 300, 0.0))
    s.next_batch(0)
    s.next_batch(1)
    assert seen[0] == Load(pending_requests=1, pending_tokens=300, busy_slots=0, slots=2)
    assert seen[1] == Load(pending_requests=1, pending_tokens=300, busy_slots=1, slots=2, chunked=True)


def test_a_slot_holds_one_batch_and_a_request_releases_its_pools_when_its_last_chunk_leaves():
    capacity = Capacity(1000, 2, mamba_slots=2)
    s = Scheduler(2, fixed(300), capacity)
    s.arrive(Request(0, 500, 0.0))
    s.next_batch(0)
    with pytest.raises(RuntimeError, match="slot 0 still has a batch"):
        s.next_batch(0)
    assert (capacity.kv_free, capacity.entries_free, capacity.mamba_free) == (500, 1, 1)
    s.next_batch(1)
    assert s.finish(0, 1.0) == []  # the first chunk left: the request holds on
    done = s.finish(1, 2.0)
    assert [r.rid for r in done] == [0] and done[0].ttft == 2.0 and capacity.full


def test_a_request_waits_until_the_pools_hold_it():
    s = Scheduler(1, fixed(1000), Capacity(1000, 4))
    s.arrive(Request(0, 800, 0.0))
    s.arrive(Request(1, 400, 0.0))
    assert [p.rid for p in s.next_batch(0).pieces] == [0]  # 400 more KV slots are not free
    s.finish(0, 1.0)
    assert [p.rid for p in s.next_batch(0).pieces] == [1]
    with pytest.raises(ValueError, match="exceeds the 1000 KV slots"):
        s.arrive(Request(2, 1001, 0.0))


def one_ms_a_token(pp_size):
    return lambda batch: [batch.tokens / 1000.0] * pp_size


def test_one_request_alone_runs_its_chunks_pipelined():
    """PP2, chunks of 1000 tokens at 1 ms each a stage: the last of 4 chunks leaves at (4 + 2 - 1) ms."""
    served = serve(2, fixed(1000), one_ms_a_token(2), Capacity(10_000, 4), Arrivals([4000], LoadLevel(concurrency=1)))
    (request,) = served.requests
    assert request.chunks == [1000] * 4 and request.ttft == pytest.approx(5.0)
    assert [b.slot for b, _, _ in served.batches] == [0, 1, 0, 1]  # round robin


def test_a_closed_loop_keeps_its_concurrency_and_every_prompt_is_served_whole():
    prompts = prompts_of([1000, 3000, 5000], [1, 1, 1], 30, seed=3)
    served = serve(4, fixed(512), one_ms_a_token(4), Capacity(100_000, 64), Arrivals(prompts, LoadLevel(concurrency=4)))
    assert [r.prompt_len for r in served.requests] == prompts
    assert all(sum(r.chunks) == r.prompt_len for r in served.requests)
    for i, r in enumerate(served.requests):  # a new request arrives when one finishes: at most 4 in the system
        in_system = sum(1 for o in served.requests if o.arrival <= r.arrival < o.finish)
        assert in_system <= 4, i
    summary = served.summary()
    assert summary["requests_per_batch"] > 1 and 0 <= summary["idle_fraction"] < 1


def test_poisson_arrivals_are_seeded_and_at_the_rate():
    times = arrival_times(LoadLevel(rate=50.0), 2000, seed=1)
    assert times[0] == 0.0 and times == sorted(times) and times == arrival_times(LoadLevel(rate=50.0), 2000, seed=1)
    assert 2000 / (times[-1] / 1e3) == pytest.approx(50.0, rel=0.1)
    assert arrival_times(LoadLevel(concurrency=2), 10, seed=1) is None


def test_at_a_low_rate_each_request_is_alone():
    served = serve(2, fixed(1000), one_ms_a_token(2), Capacity(10_000, 4), Arrivals([2000] * 5, LoadLevel(rate=10.0)))
    assert all(r.ttft == pytest.approx(3.0) for r in served.requests)  # (2 chunks + 2 stages - 1) ms each


def test_a_load_level_is_one_kind():
    with pytest.raises(ValueError, match="give one"):
        LoadLevel(concurrency=2, rate=1.0)

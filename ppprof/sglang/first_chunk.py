"""SGLang's first chunk from the policy: Scheduler.get_new_batch_prefill wrapped (first_chunked) so that a prefill
batch formed with no chunked request is budgeted at the policy's chunk for the waiting queue's head, not at B; SGLang
0.5.23 asks its sizer only from a request's second chunk on. Installed by the start-up hook (ppprof.sglang.hook) once
ppprof's sizer is in place; standard library only until a batch is formed."""

from __future__ import annotations

import functools

PREFILL_METHOD = "get_new_batch_prefill"
"""Scheduler.get_new_batch_prefill(self, running_batch): every loop's way to a new prefill batch, whose budget
(_get_new_batch_prefill_raw) is `self.chunked_prefill_size` (B) unless a request is partly prefilled."""
BUDGET_ATTR = "chunked_prefill_size"
"""The scheduler's attribute SGLang reads as a prefill batch's token budget (PrefillAdder's rem_chunk_tokens)."""
FIRST_CHUNK = "_ppprof_first_chunk"
"""Marks get_new_batch_prefill as wrapped by first_chunked."""


def first_chunked(method):
    """get_new_batch_prefill with the policy's first chunk: where first_chunk_budget answers, SGLang's
    chunked_prefill_size is that budget while the batch is formed (PrefillAdder's rem_chunk_tokens), SGLang's own
    value back afterwards, whatever happens; otherwise SGLang's method as it is."""

    @functools.wraps(method)
    def get_new_batch_prefill(self, running_batch):
        budget = first_chunk_budget(self)
        if budget is None:
            return method(self, running_batch)
        own = getattr(self, BUDGET_ATTR)
        setattr(self, BUDGET_ATTR, budget)
        try:
            return method(self, running_batch)
        finally:
            setattr(self, BUDGET_ATTR, own)

    setattr(get_new_batch_prefill, FIRST_CHUNK, True)
    return get_new_batch_prefill


def first_chunk_budget(scheduler) -> int | None:
    """The budget of a prefill batch formed with no chunked request, as ppprof's sizer sizes a request's first
    chunk: the policy's chunk at prefix 0 for the waiting queue's head (its length: prompt and any output it prefills
    again), the rest of the queue as the load (the sizer's reading of it, less the head) and the PP loop's slots.
    None (SGLang's B) where the scheduler's sizer is not ppprof's with a policy loaded (refused: SGLang keeps static
    chunks), a request is partly prefilled (SGLang asks predict), nothing waits, SGLang's schedule policy may reorder
    the queue before it is admitted (anything but fcfs without priorities), or the policy cannot answer (said once)."""
    from ppprof.sglang.sizer import CHUNKED_REQ, LOG_PREFIX, WAITING_QUEUE, PolicySizer, logger

    sizer = getattr(scheduler, "dynamic_chunk_sizer", None)
    if type(sizer) is not PolicySizer or sizer.policy is None or getattr(scheduler, CHUNKED_REQ, None) is not None:
        return None
    queue = getattr(scheduler, WAITING_QUEUE, None)
    order = getattr(scheduler, "policy", None)
    if not queue or getattr(getattr(order, "policy", None), "value", None) != "fcfs":
        return None
    if getattr(order, "enable_priority_scheduling", True):
        return None
    try:
        head = queue[0]
        prompt_len = len(head.origin_input_ids) + len(head.output_ids)
        waiting, tokens = sizer.load()
        if waiting:  # the sizer's load is the whole queue: the head is the prompt being sized
            waiting, tokens = waiting - 1, tokens - prompt_len
        return sizer.policy.next_chunk_size(
            0, prompt_len, pending_requests=waiting, pending_tokens=tokens, slots=sizer.slots()
        )
    except Exception as e:  # noqa: BLE001 - SGLang keeps B for this batch
        if not sizer.failed_predict:
            sizer.failed_predict = True
            logger.warning(f"{LOG_PREFIX} the first chunk failed ({e!r}): the static size this time")
        return None

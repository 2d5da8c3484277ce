"""The arms a serving bench compares, as the scheduler's sizers (prefix_len, prompt_len, load) -> the budget of a batch
whose first piece is that request's next chunk, and the price of a packed forward on a policy's planning model.
Pure: no torch."""

from __future__ import annotations

from collections.abc import Callable

from ppprof.policy.rule import LatencyModel, build_table
from ppprof.policy.runtime import Policy
from ppprof.policy.tables import table_chunk_size
from ppprof.serving.scheduler import Batch, Load, Sizer

SERVING_ARMS = ("fixed", "fixed-best", "greedy", "policy", "policy-history", "atom-guard", "policy-load")
"""fixed: B; fixed-best: the policy's best fixed chunk on its workload; greedy: SGLang's equal-latency rule on the
policy's model; policy: the prompt-aware rule; policy-history: the history-only table; atom-guard: the prompt-aware
rule while the request being sized is the only one with prefill work, B otherwise (AMD ATOM's guard); policy-load: the
policy's rules fed the scheduler's load and its slots (the under-load rule past its handover, the prompt-aware rule
below it)."""
FIRST_CHUNK_B_ARMS = ("greedy",)
"""The arms whose first chunk is B whatever their rule: SGLang 0.5.23 budgets a batch built with no partly prefilled
request at B (--chunked-prefill-size) itself and asks its sizer only from a request's second chunk on
(Scheduler.get_new_batch_prefill), so SGLang's own equal-latency rule starts at B. ppprof's hook gives SGLang the
policy's first chunk where ppprof's sizer is installed (ppprof.sglang.hook.first_chunked: the policy's chunk at prefix 0
for the waiting queue's head, the rest of the queue as the load), so policy, policy-history and policy-load size every
chunk, the first included, by their rules; SGLang's own batches match the simulation's so
(tests/sglang/test_scheduler.py). fixed and fixed-best are B and the best chunk throughout; atom-guard is ATOM's."""


def sizer(policy: Policy, arm: str) -> Sizer:
    """The sizer of `arm` (SERVING_ARMS) with `policy`'s rules and settings; B where an arm of FIRST_CHUNK_B_ARMS
    (SGLang's greedy) sizes a batch with no chunked request (Load.chunked: a new head, cold or past a cached
    prefix)."""
    rule = arm_rule(policy, arm)
    if arm not in FIRST_CHUNK_B_ARMS:
        return rule
    B = policy.base_chunk_size
    return lambda prefix_len, prompt_len, load: rule(prefix_len, prompt_len, load) if load.chunked else B


def arm_rule(policy: Policy, arm: str) -> Sizer:
    """`arm`'s own rule, asked for every chunk, the first included."""
    B = policy.base_chunk_size
    if arm == "fixed":
        return lambda prefix_len, prompt_len, load: B
    if arm == "fixed-best":
        best = policy.fixed_best_chunk or B
        return lambda prefix_len, prompt_len, load: best
    if arm == "greedy":
        if policy.latency_model is None or not policy.target_ms:
            return lambda prefix_len, prompt_len, load: B
        starts, sizes = build_table(policy.latency_model, policy.settings, policy.target_ms)
        return lambda prefix_len, prompt_len, load: table_chunk_size(starts, sizes, prefix_len)
    if arm == "policy":
        return idle_sizer(policy)
    if arm == "policy-history":
        return lambda prefix_len, prompt_len, load: policy.next_chunk_size(prefix_len)
    if arm == "atom-guard":

        def guarded(prefix_len: int, prompt_len: int, load: Load) -> int:
            return policy.next_chunk_size(prefix_len, prompt_len) if load.pending_requests == 0 else B

        return guarded
    if arm == "policy-load":
        return load_sizer(policy)
    raise ValueError(f"--strategies {arm!r} is unknown: use a comma-separated subset of {','.join(SERVING_ARMS)}")


def idle_sizer(policy: Policy) -> Sizer:
    """The `policy` arm: the prompt-aware rule's chunk, each (prefix_len, prompt_len) asked of the policy once (a
    simulation asks the same ones over and over)."""
    answers: dict[tuple[int, int], int] = {}

    def size(prefix_len: int, prompt_len: int, load: Load) -> int:
        key = (prefix_len, prompt_len)
        chunk = answers.get(key)
        if chunk is None:
            chunk = answers[key] = policy.next_chunk_size(prefix_len, prompt_len)
        return chunk

    return size


def load_sizer(policy: Policy) -> Sizer:
    """The `policy-load` arm: Policy.next_chunk_size fed the scheduler's load, each answer asked of the policy once.
    The answer depends on the load only through whether other tokens wait and, where they do, the share of the work
    (LoadRule.share of the prompt and the others' tokens over the scheduler's slots): (prefix_len, prompt_len, share)
    is its key, 0 the share with none waiting or no under-load rule (the idle rules' chunk)."""
    rule, answers = policy.load_rule, {}

    def size(prefix_len: int, prompt_len: int, load: Load) -> int:
        waiting, slots = load.pending_tokens, load.slots  # the server's slots, as ppprof's sizer passes pp_loop_size
        key = (prefix_len, prompt_len, rule.share(prompt_len + waiting, slots) if rule is not None and waiting else 0)
        chunk = answers.get(key)
        if chunk is None:
            chunk = answers[key] = policy.next_chunk_size(
                prefix_len, prompt_len, pending_requests=load.pending_requests, pending_tokens=waiting, slots=slots
            )
        return chunk

    return size


def packed_stage_ms(model: LatencyModel, pp_size: int, extra_piece_ms: float = 0.0) -> Callable[[Batch], list[float]]:
    """Each stage's time for a packed forward on `model` (a planning model: its fixed cost holds the per-chunk
    overhead): one fixed cost for the forward, each piece's tokens and attention over its own prefix, and
    `extra_piece_ms` d for each piece beyond the first (Policy.extra_piece_ms: where the profile's packed forwards
    found the additive form missing), c + sum_i (t(L_i, x_i) - c) + d (n - 1); the same on every stage (the model is
    the bottleneck stage's)."""

    prices: dict[tuple, list[float]] = {}

    def stage_ms(batch: Batch) -> list[float]:
        key = tuple((p.prefix_len, p.size) for p in batch.pieces)
        times = prices.get(key)
        if times is None:
            t = model.c + sum(model.one_chunk_ms(p.prefix_len, p.size) - model.c for p in batch.pieces)
            times = prices[key] = [t + extra_piece_ms * (len(batch.pieces) - 1)] * pp_size
        return times

    return stage_ms

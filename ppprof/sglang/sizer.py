"""ppprof's chunk sizer for SGLang: the interface of SGLang 0.5.23's DynamicChunkSizer, answered from the policy file
named by PPPROF_POLICY instead of a start-up profile. Imports no torch: it reads what SGLang passes in, and SGLang's
parallel state for the ranks to agree on the file."""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ppprof.bounds import POLICY_ENV
from ppprof.policy.reload import PolicyWatch, check_interval_s
from ppprof.policy.runtime import Policy, from_text, load
from ppprof.sglang.match import ServerConfig, matched_line, mismatch, model_shape_of

logger = logging.getLogger("ppprof.sglang")
LOG_PREFIX = "[PP Dynamic Chunk] ppprof"
REQ_FIELDS = ("prefix_len", "origin_input_ids", "output_ids")
"""What the sizer reads of the request being chunked (SGLang's Req); the contract test finds each in Req.__init__."""
CHUNKED_REQ = "chunked_req"
"""The scheduler's attribute holding the request being chunked, the one whose prefix SGLang passes to predict."""
WAITING_QUEUE = "waiting_queue"
"""The scheduler's attribute holding the requests waiting for their first chunk: the load the under-load rule reads
(the other requests with prefill work and their tokens; the one chunked request at a time is the one being sized)."""
LOOP_SIZE = "pp_loop_size"
"""The scheduler's micro-batch slots, pp_size + pp_async_batch_depth (SchedulerPPMixin.init_pp_loop_state): the slots
the under-load rule asks the work to fill. Its running batches (running_mbs, and mbs in flight) are not read: they
hold requests whose prefill is done or already scheduled, and the rule weighs the work not yet scheduled."""
AGREE_EVERY = 256
"""predict() calls between two agreements on a new policy file. Every PP rank runs the same scheduler on the same
requests in the same order (SGLang's event_loop_pp: "each stage runs in the same order"), so the n-th call is the
same batch on every rank; the gather there waits until the last stage reaches that batch (at most the pipeline's
depth of forwards), once in AGREE_EVERY chunked batches."""


@dataclass(frozen=True)
class Runtime:
    """What the sizer needs of the running server beyond its arguments; None where it cannot tell."""

    pp_size: int | None
    tp_size: int | None
    device_name: str | None
    gather: Callable[[object], list]
    """Every rank's object, in rank order (a collective: every rank calls it)."""


def sglang_runtime(device: str) -> Runtime:
    """SGLang's parallel state (get_parallel: pp_size, tp_size, the world group, whose all_gather_object every rank
    of the server joins) and its device module's name for the accelerator."""
    from sglang.srt.runtime_context import get_parallel
    from sglang.srt.utils.common import get_device_module

    parallel = get_parallel()
    name_of = getattr(get_device_module(), "get_device_name", None)  # torch.cuda has it; a CPU device has none
    device_name = name_of() if callable(name_of) and not device.startswith("cpu") else None
    return Runtime(parallel.pp_size, parallel.tp_size, device_name, parallel.world_group.all_gather_object)


class PolicySizer:
    """Sizes the chunks of a chunked prefill from a ppprof policy: `profile_and_fit()` loads and checks the policy
    (True: use it; False: SGLang keeps static chunks), `predict(L)` is the next chunk after L cached tokens (None:
    the static size). Never raises into the scheduler."""

    runtime = staticmethod(sglang_runtime)
    """Where the running server's state comes from (a test without SGLang gives its own)."""
    agree_every = AGREE_EVERY

    def __init__(
        self,
        *,
        model_runner,
        model_config,
        tree_cache,
        req_to_token_pool,
        token_to_kv_pool_allocator,
        spec_algorithm,
        chunked_prefill_size,
        max_prefill_tokens,
        page_size,
        device,
    ):
        self.model_config = model_config
        self.chunked_prefill_size, self.max_prefill_tokens = chunked_prefill_size, max_prefill_tokens
        self.page_size, self.device = page_size, device
        self.policy: Policy | None = None
        self.failed_predict = False
        self.watch: PolicyWatch | None = None
        self.calls = 0
        self.reloads: list[dict] = []
        """Each decision on a new policy file: (the predict call it took effect at, the action, the sha256)."""
        # SGLang passes predict only the prefix length; the prompt's length is on the request being chunked, which
        # the scheduler that builds this sizer holds. Built in Scheduler.maybe_init_dynamic_chunk_sizer (the
        # contract test reads it so), the caller's `self` is that scheduler.
        caller = sys._getframe(1).f_locals.get("self")
        self.scheduler = caller if hasattr(caller, CHUNKED_REQ) else None

    def profile_and_fit(self) -> bool:
        """Load PPPROF_POLICY, check it as `ppprof validate` does and against this server, agree with every rank;
        log one line either way. False (static chunks) on any problem, on every rank alike."""
        path = os.environ.get(POLICY_ENV) or ""
        try:
            runtime = self.runtime(str(self.device))
        except Exception as e:  # noqa: BLE001 - no parallel state: no ranks to agree with, so no policy
            return self.refuse(path, f"SGLang's parallel state is not readable ({e!r}): run inside SGLang's server")
        policy, problem, digest = self.check(path, runtime)
        try:
            verdicts = runtime.gather((problem, digest))
        except Exception as e:  # noqa: BLE001
            return self.refuse(path, f"the ranks could not agree on the policy ({e!r})")
        problem = agreement(verdicts)
        if problem:
            return self.refuse(path, problem)
        self.policy = policy
        try:
            matched = matched_line(policy, self.server_config(runtime))
        except Exception as e:  # noqa: BLE001 - the policy is in use on every rank; only the line is short
            matched = f"({e!r} describing it)"
        logger.info(f"{LOG_PREFIX} policy {path} (sha256 {digest[:12]}) matches this server: {matched}")
        self.start_watch(path, digest, runtime)
        return True

    def start_watch(self, path: str, digest: str, runtime: Runtime) -> None:
        """The watch on the policy file (ppprof.policy.reload) and its thread, which looks at the file every
        PPPROF_POLICY_CHECK_S seconds (5 by default) off the scheduler's thread; the ranks agree in predict(),
        every AGREE_EVERY calls."""
        interval, problem = check_interval_s()
        if problem:
            logger.warning(f"{LOG_PREFIX} {problem}")

        def check(text: str) -> tuple[Policy | None, str | None]:
            policy = from_text(text, f"policy file {path}")
            return policy, mismatch(policy, self.server_config(runtime))

        self.runtime_state, self.watch = runtime, PolicyWatch(path, digest, check, interval)
        stop = self.watch_stop = threading.Event()

        def look() -> None:
            while not stop.wait(max(interval, 0.05)):
                self.watch.poll()

        threading.Thread(target=look, name="ppprof-policy-watch", daemon=True).start()

    def agree(self) -> None:
        """Every rank's vote on a new policy file gathered (SGLang's world group), one decision on every rank: the
        new policy from this batch on, or the old one kept, with one line. Never raises into the scheduler."""
        watch = self.watch
        try:
            decision = watch.decide(self.runtime_state.gather(watch.vote()))
        except Exception as e:  # noqa: BLE001 - no agreement possible: the policy in use stays, reloads stop
            self.watch = None
            self.watch_stop.set()
            logger.warning(f"{LOG_PREFIX} policy reloads off, the policy in use kept: the ranks' gather failed ({e!r})")
            return
        if decision.action == "none":
            return
        if decision.action == "switch":
            self.policy = watch.take(decision)
            try:
                matched = matched_line(self.policy, self.server_config(self.runtime_state))
            except Exception as e:  # noqa: BLE001 - the policy is in use on every rank; only the line is short
                matched = f"({e!r} describing it)"
            logger.info(
                f"{LOG_PREFIX} policy {watch.path} (sha256 {decision.digest[:12]}) taken by every rank from chunked "
                f"batch {self.calls}: {matched}"
            )
        elif decision.line:
            logger.warning(f"{LOG_PREFIX} {decision.line}")
        self.reloads.append({"call": self.calls, "action": decision.action, "sha256": decision.digest})

    def check(self, path: str, runtime: Runtime) -> tuple[Policy | None, str | None, str | None]:
        """(the policy, None, its file's sha256) where it loads and fits this server, else (None, the one line,
        the sha256 where the file was readable). Never raises, so that every rank reaches the agreement."""
        if not path:
            return None, f"{POLICY_ENV} is not set: give the policy file, {POLICY_ENV}=policy.json", None
        try:
            with open(path, "rb") as f:
                digest = hashlib.sha256(f.read()).hexdigest()
        except OSError as e:
            return None, f"{POLICY_ENV}={path} is not readable ({e.strerror}): give a policy.json on every node", None
        try:
            policy = load(path)
            problem = mismatch(policy, self.server_config(runtime))
        except Exception as e:  # noqa: BLE001 - load's ValueError is the one line; anything else is named
            return None, str(e) if isinstance(e, ValueError) else f"{path}: {e!r}", digest
        return (None if problem else policy), problem, digest

    def server_config(self, runtime: Runtime) -> ServerConfig:
        return ServerConfig(
            pp_size=runtime.pp_size,
            tp_size=runtime.tp_size,
            page_size=self.page_size,
            chunked_prefill_size=self.chunked_prefill_size,
            max_prefill_tokens=self.max_prefill_tokens,
            context_len=getattr(self.model_config, "context_len", None),
            device=str(self.device),
            device_name=runtime.device_name,
            model_shape=model_shape_of(self.model_config),
        )

    def refuse(self, path: str, problem: str) -> bool:
        logger.warning(
            f"{LOG_PREFIX} policy {path or '(none)'} refused, static chunks of {self.chunked_prefill_size}: {problem}"
        )
        return False

    def predict(self, prefix_len: int) -> int | None:
        """The next chunk after `prefix_len` cached tokens: the prompt-aware rule where the request being chunked
        is the scheduler's (its length known), else the history-only table; the under-load rule while others wait,
        with the scheduler's waiting queue as the load and its micro-batch slots (pp_loop_size) as the pipeline's. None (the static size) without a
        policy, or where the policy cannot answer (said once)."""
        if self.policy is None:
            return None
        self.calls += 1
        if self.watch is not None and self.calls % self.agree_every == 0:
            self.agree()
        try:
            prompt_len = self.prompt_len(prefix_len)
            pending_requests, pending_tokens = self.load()
            return self.policy.next_chunk_size(
                prefix_len,
                prompt_len,
                pending_requests=pending_requests,
                pending_tokens=pending_tokens,
                slots=self.slots(),
            )
        except Exception as e:  # noqa: BLE001 - the scheduler keeps its static size
            if not self.failed_predict:
                self.failed_predict = True
                logger.warning(f"{LOG_PREFIX} predict({prefix_len!r}) failed ({e!r}): the static size this time")
            return None

    def load(self) -> tuple[int, int]:
        """(the requests in the scheduler's waiting queue, their tokens: prompt and any output prefilled again);
        (0, 0) where the policy has no under-load rule (nothing is read) or the scheduler holds no queue."""
        queue = getattr(self.scheduler, WAITING_QUEUE, None) if self.policy.load_rule is not None else None
        if not queue:
            return 0, 0
        return len(queue), sum(len(r.origin_input_ids) + len(r.output_ids) for r in queue)

    def slots(self) -> int | None:
        """The scheduler's micro-batch slots (LOOP_SIZE), where it has them; None: the rule's own."""
        slots = getattr(self.scheduler, LOOP_SIZE, None)
        return slots if type(slots) is int and slots >= 1 else None

    def prompt_len(self, prefix_len: int) -> int | None:
        """The length of the request being chunked (prompt and any output it prefills again), where it is the
        scheduler's chunked request at this prefix; else None."""
        req = getattr(self.scheduler, CHUNKED_REQ, None)
        if req is None or getattr(req, "prefix_len", None) != prefix_len:
            return None
        total = len(req.origin_input_ids) + len(req.output_ids)
        return total if total > prefix_len else None


def agreement(verdicts: list[tuple[str | None, str | None]]) -> str | None:
    """One line where the ranks do not all accept the same policy file: the first rank's refusal (named by rank
    where there are several), or the ranks' differing file hashes; None where they agree."""
    for rank, (problem, _) in enumerate(verdicts):
        if problem:
            return problem if len(verdicts) == 1 else f"rank {rank}: {problem}"
    digests = {digest for _, digest in verdicts}
    if len(digests) > 1:
        by_rank = ", ".join(f"rank {r} {d[:12]}" for r, (_, d) in enumerate(verdicts))
        return (
            f"the ranks read different policy files (sha256 {by_rank}): put the same file at {POLICY_ENV} on every node"
        )
    return None

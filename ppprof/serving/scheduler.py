"""The prefill scheduler of a pipeline-parallel server under load, as SGLang's PP event loop runs a prefill-only server:
micro-batch slots served round robin (pp_size of them, and pp_async_batch_depth more where that is set), each with at
most one batch in the pipeline; a slot's batch is the
chunked request's next chunk (at most one request is partly prefilled), sized by the arm under test, then waiting
requests packed whole into what is left of the token budget, the first that does not fit cut to what is left (it
becomes the chunked request). A request holds its KV slots, its Mamba slot and its request entry from admission until
its last chunk leaves the last stage; they are released then, in that order. Used by the simulation
(ppprof.serving.simulate) and by the ranks; pure Python, no torch, no clock: the caller says when things happen.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ppprof.serving.prefix_cache import PrefixCache


@dataclass(slots=True)
class Load:
    """What a scheduler knows of the other work when it sizes the chunked request's next chunk. Load, Piece and Batch
    are plain slotted dataclasses, not frozen ones: a frozen one's constructor costs five times as much, and a
    simulation builds one of each for every batch (most of a robust under-load choice's time). Never changed once
    built."""

    pending_requests: int = 0
    """Requests with prefill work besides the one being sized: waiting, and partly prefilled."""
    pending_tokens: int = 0
    """Their prompt tokens not yet scheduled."""
    busy_slots: int = 0
    """Micro-batch slots other than this one holding a batch in the pipeline."""
    slots: int | None = None
    """The scheduler's micro-batch slots (pp_size + async depth), as SGLang's sizer reads pp_loop_size; None: not
    known."""
    chunked: bool = False
    """The request being sized is the partly prefilled one (SGLang's chunked_req), not a new batch's head; a head may
    start past 0 (a cached prefix), so this, not the prefix, tells the two apart."""


Sizer = Callable[[int, int, Load], int]
"""An arm's chunk size: (prefix_len, prompt_len, load) -> the token budget of a batch whose first piece is that
request's next chunk. The scheduler cuts it to the prompt's rest."""


@dataclass(slots=True)
class Request:
    """One prompt: its arrival, how much of it has been scheduled, and when its last chunk left the pipeline."""

    rid: int
    prompt_len: int
    arrival: float
    scheduled: int = 0
    """Tokens of it put into batches so far, a cached prefix included (its next chunk starts here)."""
    chunks: list[int] = field(default_factory=list)
    finish: float | None = None
    blocks: tuple[int, ...] = ()
    """A trace's block ids of its prompt (ppprof.serving.prefix_cache), () where it has none."""
    cached: int = 0
    """Its leading tokens the prefix cache held when it arrived: its prefill starts there."""
    held: tuple[int, ...] = ()

    @property
    def rest(self) -> int:
        return self.prompt_len - self.scheduled

    @property
    def ttft(self) -> float | None:
        """Time to first token: its last chunk leaving the last stage, less its arrival."""
        return None if self.finish is None else self.finish - self.arrival


@dataclass(slots=True)
class Piece:
    """One request's chunk in a batch: `size` new tokens after `prefix_len` cached ones; `last`: the prompt's end."""

    rid: int
    prefix_len: int
    size: int
    last: bool


@dataclass(slots=True)
class Batch:
    """What one micro-batch slot sends through the pipeline: one packed forward of one or more requests' pieces."""

    slot: int
    pieces: tuple[Piece, ...]

    @property
    def tokens(self) -> int:
        return sum(p.size for p in self.pieces)


class Capacity:
    """The pools a request holds from admission to its end: KV slots (its whole prompt, reserved at admission, so that
    a request once admitted always finishes), one Mamba slot (a hybrid model's; 0 slots: none needed) and one
    request entry."""

    def __init__(self, kv_tokens: int, request_entries: int, mamba_slots: int | None = None) -> None:
        if kv_tokens < 1 or request_entries < 1 or (mamba_slots is not None and mamba_slots < 1):
            raise ValueError("the pools hold nothing: give at least one KV slot, request entry and Mamba slot")
        self.kv_free, self.entries_free, self.mamba_free = kv_tokens, request_entries, mamba_slots
        self.kv_tokens, self.request_entries, self.mamba_slots = kv_tokens, request_entries, mamba_slots

    def fits(self, prompt_len: int) -> bool:
        return (
            self.kv_free >= prompt_len and self.entries_free >= 1 and (self.mamba_free is None or self.mamba_free >= 1)
        )

    def admit(self, prompt_len: int) -> None:
        self.entries_free -= 1
        if self.mamba_free is not None:
            self.mamba_free -= 1
        self.kv_free -= prompt_len

    def release(self, prompt_len: int) -> None:
        """KV slots, then the Mamba slot, then the request entry: the release order every pool keeps."""
        self.kv_free += prompt_len
        if self.mamba_free is not None:
            self.mamba_free += 1
        self.entries_free += 1

    @property
    def full(self) -> bool:
        """Everything back: no request holds anything."""
        return (
            self.kv_free == self.kv_tokens
            and self.entries_free == self.request_entries
            and self.mamba_free == self.mamba_slots
        )


class Scheduler:
    """Builds each slot's next batch and retires the requests a finished batch completes."""

    def __init__(self, slots: int, sizer: Sizer, capacity: Capacity, cache: PrefixCache | None = None) -> None:
        if slots < 1:
            raise ValueError(f"{slots} micro-batch slots: a scheduler needs at least 1")
        self.slots, self.sizer, self.capacity, self.cache = slots, sizer, capacity, cache
        self.waiting: deque[Request] = deque()
        self.waiting_tokens = 0  # the rest of every waiting request, kept as they arrive and are admitted
        self.chunked: Request | None = None
        self.in_flight: dict[int, Batch] = {}
        self.requests: dict[int, Request] = {}

    def arrive(self, request: Request) -> None:
        if request.prompt_len > self.capacity.kv_tokens:
            raise ValueError(
                f"prompt of {request.prompt_len} tokens exceeds the {self.capacity.kv_tokens} KV slots: use shorter "
                "prompts or more KV slots"
            )
        if self.cache is not None and request.blocks:  # matched as it arrives: its prefill starts past the hit
            request.cached, request.held = self.cache.match(request.blocks, request.prompt_len)
            request.scheduled = request.cached
        self.waiting.append(request)
        self.waiting_tokens += request.rest
        self.requests[request.rid] = request

    @property
    def idle(self) -> bool:
        """No work anywhere: nothing waiting, nothing partly prefilled, no batch in the pipeline."""
        return not self.waiting and self.chunked is None and not self.in_flight

    def load(self, slot: int, sizing: Request, chunked: bool = False) -> Load:
        """The load seen when sizing `sizing`'s chunk for `slot`."""
        # `sizing` is the waiting queue's head or the request taken out of `chunked`: never deeper in the queue.
        count, tokens = len(self.waiting), self.waiting_tokens
        if self.waiting and self.waiting[0] is sizing:
            count, tokens = count - 1, tokens - sizing.rest
        if self.chunked is not None and self.chunked is not sizing:
            count, tokens = count + 1, tokens + self.chunked.rest
        return Load(count, tokens, len(self.in_flight) - (slot in self.in_flight), self.slots, chunked)

    def size(self, slot: int, request: Request, chunked: bool = False) -> int:
        size = int(self.sizer(request.scheduled, request.prompt_len, self.load(slot, request, chunked)))
        if size < 1:
            raise ValueError(f"the arm gave a chunk of {size} tokens at prefix {request.scheduled}")
        return size

    def next_batch(self, slot: int) -> Batch | None:
        """Slot `slot`'s next batch (None: no prefill work, or the pools hold no further request). The slot must be
        free (its previous batch finished)."""
        if slot in self.in_flight:
            raise RuntimeError(f"slot {slot} still has a batch in the pipeline")
        pieces: list[Piece] = []
        if self.chunked is not None:
            request, self.chunked = self.chunked, None
            budget = self.size(slot, request, chunked=True)
            pieces.append(self.take(request, min(budget, request.rest)))
            left = budget - pieces[0].size
        else:
            if not self.waiting or not self.capacity.fits(self.waiting[0].prompt_len):
                return None
            left = self.size(slot, self.waiting[0])
        while left > 0 and self.waiting and self.capacity.fits(self.waiting[0].prompt_len):
            request = self.waiting.popleft()
            self.waiting_tokens -= request.rest
            self.capacity.admit(request.prompt_len)
            pieces.append(self.take(request, min(left, request.rest)))
            left -= pieces[-1].size
        if not pieces:
            return None
        batch = Batch(slot, tuple(pieces))
        self.in_flight[slot] = batch
        return batch

    def take(self, request: Request, size: int) -> Piece:
        """`size` tokens of `request` into a batch; what is left of it makes it the chunked request."""
        piece = Piece(request.rid, request.scheduled, size, size == request.rest)
        request.scheduled += size
        request.chunks.append(size)
        if not piece.last:
            self.chunked = request
        return piece

    def finish(self, slot: int, now: float) -> list[Request]:
        """Slot `slot`'s batch left the last stage at `now`: the requests whose last chunk it carried are done and
        release what they hold."""
        batch = self.in_flight.pop(slot)
        done = []
        for piece in batch.pieces:
            if piece.last:
                request = self.requests.pop(piece.rid)
                request.finish = now
                self.capacity.release(request.prompt_len)
                if self.cache is not None and request.blocks:
                    self.cache.release(request.held)
                    self.cache.insert(request.blocks)
                done.append(request)
        return done

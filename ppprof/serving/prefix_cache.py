"""A prefix cache keyed by a trace's blocks (ppprof.traces), as a radix cache reuses prompts: a request's prefill
starts after the longest run of its leading blocks already cached, those blocks held (never evicted) until its last
chunk leaves; then its blocks are cached. Bounded by `capacity_tokens`: the least recently used blocks no request
holds are evicted first, and a request longer than what can be freed caches only its leading blocks. Pure: no torch.
"""

from __future__ import annotations

from collections import Counter, OrderedDict


class PrefixCache:
    """Block ids cached, least recently used first, and how many requests hold each."""

    def __init__(self, capacity_tokens: int, block_tokens: int) -> None:
        if capacity_tokens < block_tokens or block_tokens < 1:
            raise ValueError(
                f"a prefix cache of {capacity_tokens} tokens holds no block of {block_tokens}: give it at least one "
                "block's tokens"
            )
        self.block_tokens = block_tokens
        self.capacity_blocks = capacity_tokens // block_tokens
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.held: Counter[int] = Counter()
        self.hit_tokens = 0
        self.evicted_blocks = 0

    def match(self, blocks: tuple[int, ...], prompt_len: int) -> tuple[int, tuple[int, ...]]:
        """(cached prefix in tokens, the blocks now held) of a prompt of `prompt_len` tokens with `blocks`: the
        longest leading run cached, at most the prompt less one token (a prefill computes at least its last)."""
        run = 0
        for block in blocks:
            if block not in self.blocks:
                break
            run += 1
        cached = min(run * self.block_tokens, prompt_len - 1)
        used = blocks[: -(-cached // self.block_tokens)] if cached else ()
        for block in used:
            self.blocks.move_to_end(block)
            self.held[block] += 1
        self.hit_tokens += cached
        return cached, used

    def release(self, used: tuple[int, ...]) -> None:
        """The blocks a finished request held may be evicted again."""
        for block in used:
            self.held[block] -= 1
            if not self.held[block]:
                del self.held[block]

    def insert(self, blocks: tuple[int, ...]) -> None:
        """A finished prompt's blocks, leading first, each the most recently used; where the cache is full, the
        least recently used block no request holds (nor this prompt) makes room, and where none can, the rest is not
        cached."""
        own = set(blocks)  # never evicted for its own later blocks: a prefix is worth more than its tail
        for block in blocks:
            if block in self.blocks:
                self.blocks.move_to_end(block)
                continue
            if len(self.blocks) >= self.capacity_blocks and not self.evict_one(own):
                return
            self.blocks[block] = None

    def evict_one(self, keep: set[int]) -> bool:
        for block in self.blocks:
            if block not in self.held and block not in keep:
                del self.blocks[block]
                self.evicted_blocks += 1
                return True
        return False

    @property
    def tokens(self) -> int:
        return len(self.blocks) * self.block_tokens

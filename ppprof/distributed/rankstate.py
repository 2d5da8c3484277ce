"""What a rank publishes through the launcher's store (its heartbeat, where it runs, what it waits on) and, from what
every rank published, which rank does not answer. Pure: no torch."""

from __future__ import annotations

from dataclasses import dataclass

WORKING = -2
"""A rank's published wait: none (it is working)."""
EVERY_RANK = -1
"""A rank's published wait: a collective (it waits on every rank)."""


@dataclass(frozen=True, slots=True)
class RankState:
    """What a rank last published: its heartbeat count, where it runs, and what it waits on."""

    beat: int
    host: str
    pid: int
    peer: int
    """The rank it waits on, EVERY_RANK in a collective, WORKING when not waiting."""
    phase: str

    def encode(self) -> str:
        return f"{self.beat} {self.host} {self.pid} {self.peer} {self.phase}"

    @classmethod
    def decode(cls, text: str) -> RankState:
        beat, host, pid, peer, phase = text.split(" ", 4)
        return cls(int(beat), host, int(pid), int(peer), phase)


def culprit(me: int, peer: int, world_size: int, states: dict[int, RankState], stale: set[int]) -> int:
    """The rank that does not answer, seen from rank `me` waiting on `peer` (EVERY_RANK in a collective): a stopped
    rank (its heartbeat stale) first, the awaited one among them if it is; else follow the published waits from the
    awaited ranks to the first one that is working (or whose state is unknown)."""
    if stale:
        return peer if peer in stale else min(stale)
    todo = [peer] if peer >= 0 else [r for r in range(world_size) if r != me]
    seen = {me}
    while todo:
        r = todo.pop(0)
        if r in seen:
            continue
        seen.add(r)
        state = states.get(r)
        if state is None or state.peer == WORKING:
            return r
        if state.peer >= 0:
            todo.insert(0, state.peer)
    return peer if peer >= 0 else (me + 1) % world_size

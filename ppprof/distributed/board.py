"""What the ranks of a job tell each other through the launcher's store: each rank's state (its heartbeat, what it
waits on) and the run's verdict, the first failure any rank published, so that every rank ends saying the same. A
call that could hang on a store that does not answer (a launcher gone) is bounded where a rank is ending."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from datetime import timedelta

from ppprof.distributed.rankstate import RankState


def launcher_store(timeout_s: float = 30.0):
    """A client of the store the launcher (or rank 0) serves at MASTER_ADDR:MASTER_PORT; None where there is none."""
    import torch.distributed as dist  # here only: the module's pure parts need no torch

    try:
        return dist.TCPStore(
            os.environ["MASTER_ADDR"],
            int(os.environ["MASTER_PORT"]),
            is_master=False,
            timeout=timedelta(seconds=timeout_s),
        )
    except (KeyError, ValueError, RuntimeError, OSError):
        return None


def bounded(fn: Callable[[], str | None], timeout_s: float = 2.0) -> str | None:
    """fn() in a helper thread, None when it fails or does not return in time (a store that does not answer)."""
    box: list = [None]

    def run() -> None:
        try:
            box[0] = fn()
        except Exception:
            pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout_s)
    return box[0]


class Board:
    """The keys of one job (one launcher's run and restart) in `store`, seen from rank `rank` of `world_size`."""

    def __init__(self, store, rank: int, world_size: int) -> None:
        self.store, self.rank, self.world_size = store, rank, world_size
        prefix = f"ppprof/{os.environ.get('TORCHELASTIC_RUN_ID', '')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)}"
        self._state_key, self._verdict_key = prefix + "/state/", prefix + "/verdict"

    def post_state(self, state: RankState) -> None:
        """Publish this rank's state (raises where the store went away)."""
        self.store.set(self._state_key + str(self.rank), state.encode())

    def states(self) -> dict[int, RankState]:
        """The other ranks' last published states, of those that published one (raises where the store went away)."""
        out = {}
        for r in range(self.world_size):
            key = self._state_key + str(r)
            if r != self.rank and self.store.check([key]):
                out[r] = RankState.decode(self.store.get(key).decode())
        return out

    def publish_verdict(self, message: str) -> str:
        """The first verdict any rank published (`message` where it is the first, or the store does not answer)."""
        return bounded(lambda: self.store.compare_set(self._verdict_key, "", message).decode()) or message

    def verdict(self) -> str | None:
        """The run's verdict, None where no rank published one (or the store does not answer)."""
        key = self._verdict_key
        return bounded(lambda: self.store.get(key).decode() if self.store.check([key]) else None)

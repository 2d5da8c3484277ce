"""The sizer takes a new PPPROF_POLICY file while serving: two ranks (threads joined by a stand-in of SGLang's world
group gather) switch at the same predict() call, or neither does; a corrupted replacement is refused on both with the
old policy kept; ranks that have not read the new file yet keep the old one, said once."""

from __future__ import annotations

import json
import logging
import threading

from ppprof.bounds import POLICY_ENV
from ppprof.policy import load
from ppprof.policy.reload import CHECK_ENV
from ppprof.sglang.sizer import PolicySizer, Runtime

from .standin import COMMITTED, Scheduler, model_config, shaped

EVERY = 4


class Group:
    """all_gather_object of `size` ranks, each calling from its own thread."""

    def __init__(self, size: int) -> None:
        self.slots, self.barrier = [None] * size, threading.Barrier(size, timeout=30)

    def gather(self, rank: int, obj) -> list:
        self.slots[rank] = obj
        self.barrier.wait()
        out = list(self.slots)
        self.barrier.wait()
        return out


def ranks(path, group: Group) -> list[PolicySizer]:
    policy = load(path)
    s = policy.settings
    out = []
    for rank in range(2):

        class Sizer(PolicySizer):
            agree_every = EVERY
            runtime = staticmethod(lambda device, rank=rank: Runtime(2, 1, None, lambda mine: group.gather(rank, mine)))

        scheduler = Scheduler(Sizer, model_config(path), chunked_prefill_size=s.base_chunk_size, page_size=s.page_size)
        out.append(scheduler)
    sizers = [None, None]

    def start(rank: int) -> None:
        sizers[rank] = out[rank].maybe_init_dynamic_chunk_sizer()

    run_ranks(start)
    assert all(s.policy is not None for s in sizers)
    return sizers


def run_ranks(job) -> None:
    threads = [threading.Thread(target=job, args=(rank,)) for rank in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)


def serve(sizers, calls: int = EVERY) -> list[list[int | None]]:
    """`calls` predict() calls on every rank, in step; each rank's answers."""
    answers = [[], []]

    def job(rank: int) -> None:
        for k in range(calls):
            answers[rank].append(sizers[rank].predict(256 * (k + 1)))

    run_ranks(job)
    return answers


def test_every_rank_switches_at_the_same_call_and_a_corrupted_file_is_refused(tmp_path, monkeypatch, caplog):
    path = shaped(COMMITTED[0], tmp_path)
    monkeypatch.setenv(POLICY_ENV, str(path))
    monkeypatch.setenv(CHECK_ENV, "3600")  # the watch's thread never looks: the test does, with poll(force=True)
    text = path.read_text()
    sizers = ranks(path, Group(2))
    old = [s.policy for s in sizers]
    caplog.set_level(logging.INFO, logger="ppprof.sglang")

    path.write_text(text[: len(text) // 2])  # a replacement cut mid-write
    for s in sizers:
        s.watch.poll(force=True)
    serve(sizers)
    assert [s.policy for s in sizers] == old, "a corrupted file replaced the policy"
    refused = [r.getMessage() for r in caplog.records if "refused, the policy in use" in r.getMessage()]
    assert len(refused) == 2 and "is not readable JSON" in refused[0], refused  # one line on each rank
    assert (
        [s.reloads[-1] for s in sizers][0]
        == sizers[1].reloads[-1]
        == {"call": EVERY, "action": "refuse", "sha256": sizers[0].reloads[-1]["sha256"]}
    )

    data = json.loads(text)
    data["provenance"]["note"] = "calibrated"  # a new file, as good as the first
    path.write_text(json.dumps(data))
    sizers[0].watch.poll(force=True)  # rank 1 has not looked yet
    serve(sizers)
    assert [s.policy for s in sizers] == old and sizers[0].reloads[-1]["action"] == "wait"
    sizers[1].watch.poll(force=True)
    answers = serve(sizers)
    assert all(s.policy is not o for s, o in zip(sizers, old)), "not switched"
    assert sizers[0].policy.provenance["note"] == sizers[1].policy.provenance["note"] == "calibrated"
    assert sizers[0].reloads == sizers[1].reloads and sizers[0].reloads[-1]["call"] == 3 * EVERY
    assert answers[0] == answers[1]
    taken = [r.getMessage() for r in caplog.records if "taken by every rank from chunked batch 12" in r.getMessage()]
    assert len(taken) == 2, taken

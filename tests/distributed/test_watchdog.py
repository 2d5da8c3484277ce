"""The watchdog of one rank: who is named when a wait runs past its deadline, and, in real subprocesses, that a wait
past its deadline, a signal and the death of the parent each end the process in bounded time with one line."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from ppprof.distributed.rankstate import EVERY_RANK, WORKING, RankState, culprit
from ppprof.distributed.stop import STOP_NOTE_ENV, write_stop_note
from ppprof.distributed.watchdog import LENIENT_FACTOR, REQUEST_FACTOR, SIGTERM_GRACE_S, Watchdog
from tests.multirank import REPO


def state(peer, beat=1, phase="run the probes"):
    return RankState(beat, "host", 100 + beat, peer, phase)


def test_rank_state_round_trips_with_spaces_in_the_phase():
    s = RankState(7, "node-1", 4242, EVERY_RANK, "write samples.csv and run.json")
    assert RankState.decode(s.encode()) == s


def test_a_stopped_rank_is_named_first_the_awaited_one_among_several():
    assert culprit(0, 1, 4, {}, stale={3}) == 3
    assert culprit(0, 2, 4, {}, stale={1, 2}) == 2
    assert culprit(0, EVERY_RANK, 4, {}, stale={2, 3}) == 2


def test_without_a_stopped_rank_the_waits_are_followed_to_the_one_that_works():
    # rank 0 waits on rank 1, which waits on rank 2, which is busy (a stuck kernel): rank 2
    assert culprit(0, 1, 3, {1: state(2), 2: state(WORKING)}, stale=set()) == 2
    # in a collective: rank 1 is in it too, rank 2 waits on rank 3, rank 3 works
    states = {1: state(EVERY_RANK), 2: state(3), 3: state(WORKING)}
    assert culprit(0, EVERY_RANK, 4, states, stale=set()) == 3
    # a rank that never published is the one
    assert culprit(0, EVERY_RANK, 3, {1: state(EVERY_RANK)}, stale=set()) == 2
    # a cycle of waits (not expected) names the awaited rank
    assert culprit(0, 1, 3, {1: state(2), 2: state(1)}, stale=set()) == 1


def test_the_deadline_follows_the_slowest_request_above_the_floor():
    w = Watchdog(0, 2, timeout_s=5)
    assert w.deadline_s == 5
    w.measured(0.1)
    assert w.deadline_s == 5
    w.measured(1.0)
    w.measured(0.2)
    assert w.deadline_s == REQUEST_FACTOR * 1.0


RANK_SCRIPT = """
import sys, time
from ppprof.distributed.watchdog import Watchdog
w = Watchdog(0, 2, timeout_s={timeout}, lenient_min_s=0).start()
w.phase = "test phase"
w.on_stop.append(lambda status, sig: print("status:", status, sig, flush=True))
{body}
time.sleep(60)
"""


def run_rank_script(
    body: str, timeout: float = 1.0, signal_after: float | None = None, sig=signal.SIGTERM, note: str | None = None
):
    script = RANK_SCRIPT.format(timeout=timeout, body=textwrap.dedent(body))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop(STOP_NOTE_ENV, None)
    if note is not None:  # the launcher's note (ppprof.distributed.stop), written before it signals
        env[STOP_NOTE_ENV] = note
    start = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if signal_after is not None:
        time.sleep(signal_after)
        p.send_signal(sig)
    out, err = p.communicate(timeout=60)
    return p.returncode, out, err, time.monotonic() - start


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout,said", [(1.0, "1"), (1.23456, "1.2")])  # a deadline to a tenth of a second
def test_a_wait_past_the_deadline_in_a_phase_that_measured_a_request_ends_the_rank_in_one_line(timeout, said):
    body = """
    w.measured(0.01)
    with w.waiting(1):
        time.sleep(60)
    """
    code, out, err, took = run_rank_script(body, timeout=timeout)
    assert code == 1, err
    assert err.strip() == f"error: [rank 0] rank 1 did not answer within {said} s during test phase"
    assert out.strip() == f"status: failed: rank 1 did not answer within {said} s during test phase None"
    assert took < 30


@pytest.mark.timeout(60)
def test_in_a_phase_without_a_measured_request_a_rank_of_unknown_state_gets_lenient_factor_deadlines():
    # (and at least LENIENT_MIN_S, 0 here)
    body = """
    w.measured(0.01)
    w.phase = "test phase"  # a new phase: nothing measured in it yet
    with w.waiting(-1):
        time.sleep(60)
    """
    code, _, err, took = run_rank_script(body, timeout=0.5)
    assert code == 1, err
    assert err.strip() == f"error: [rank 0] rank 1 did not answer within {LENIENT_FACTOR * 0.5:g} s during test phase"
    assert took >= LENIENT_FACTOR * 0.5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_ends_the_rank_even_inside_a_wait(sig, code):
    body = """
    print("ready", flush=True)
    with w.waiting(1):
        time.sleep(60)
    """
    rc, out, err, took = run_rank_script(body, timeout=30, signal_after=2.0, sig=sig)
    assert rc == code, err
    assert f"status: interrupted {signal.Signals(sig).name}" in out
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert took < 30


@pytest.mark.timeout(60)
def test_a_broken_transfer_after_the_launcher_took_a_signal_is_an_interrupt_whichever_rank_it_reached_first(tmp_path):
    """The launcher forwards SIGTERM one rank after the other: the first leaves and breaks the second's transfer
    before the second's own SIGTERM is noted."""
    note = tmp_path / "stop"
    write_stop_note(str(note), signal.SIGTERM)
    body = """
    w.failed("lost the connection to another rank (gloo: Connection reset by peer); stopping this rank now")
    """
    code, out, err, _ = run_rank_script(body, timeout=30, note=str(note))
    assert code == 143, err
    assert out.strip() == "status: interrupted SIGTERM" and err.strip() == ""


@pytest.mark.timeout(60)
def test_a_sigterm_the_launcher_sends_after_a_rank_ended_is_a_failure_not_an_interrupt(tmp_path):
    note = tmp_path / "stop"
    write_stop_note(str(note), None)
    body = """
    print("ready", flush=True)
    with w.waiting(1):
        time.sleep(60)
    """
    code, out, err, took = run_rank_script(body, timeout=30, signal_after=2.0, note=str(note))
    assert code == 1, err
    said = "stopped by the launcher during test phase: a rank of this node ended first"
    assert err.strip() == f"error: [rank 0] {said}"
    assert f"status: failed: {said} None" in out
    assert took >= 2.0 + SIGTERM_GRACE_S  # the main thread was given the grace to name the rank


@pytest.mark.timeout(60)
def test_a_rank_dies_with_its_parent():
    child = RANK_SCRIPT.format(timeout=30, body="print('child', flush=True)")
    parent = f"""
import subprocess, sys, time
c = subprocess.Popen([sys.executable, "-c", {child!r}], stdout=subprocess.PIPE, text=True)
c.stdout.readline()
print(c.pid, flush=True)
time.sleep(60)
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    p = subprocess.Popen([sys.executable, "-c", parent], env=env, stdout=subprocess.PIPE, text=True)
    child_pid = int(p.stdout.readline())
    p.kill()
    p.wait()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and alive(child_pid):
        time.sleep(0.05)
    assert not alive(child_pid)


def alive(pid: int) -> bool:
    """Running, not a zombie waiting for its reaper."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_stopped_child_of_the_launcher_is_found_by_its_rank_and_a_running_one_is_not():
    from ppprof.distributed.procfs import stopped_ranks

    def stopped_sibling(parent, rank):
        return stopped_ranks(parent).get(rank)

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, "RANK": "7"})
    try:
        assert stopped_sibling(os.getpid(), 7) is None  # running
        os.kill(child.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while stopped_sibling(os.getpid(), 7) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stopped_sibling(os.getpid(), 7) == child.pid
        assert stopped_sibling(os.getpid(), 6) is None and stopped_sibling(child.pid, 7) is None
        os.kill(child.pid, signal.SIGCONT)
        deadline = time.monotonic() + 10
        while stopped_sibling(os.getpid(), 7) is not None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert stopped_sibling(os.getpid(), 7) is None
    finally:
        child.kill()
        child.wait()

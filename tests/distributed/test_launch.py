"""The elastic launcher's arguments: torchrun's options passed on, the job's arguments last."""

import json
import os
import signal
from pathlib import Path

import pytest

from ppprof.config import ProfileConfig
from ppprof.distributed.launch import launcher_argv, num_nodes, torchrun_takes


def test_launcher_passes_torchrun_options_and_the_resolved_config():
    cfg = ProfileConfig(nproc_per_node=3, base_chunk_size=64)
    worker = ["profile", "--resolved-config", json.dumps(cfg.to_dict())]
    argv = launcher_argv(3, {"nnodes": "2", "node_rank": "1", "rdzv_endpoint": "h:1", "standalone": False}, worker)
    assert argv[:2] == ["--nproc-per-node", "3"]
    assert "--standalone" not in argv
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "1"
    assert argv[argv.index("--module") : argv.index("--module") + 3] == ["--module", "ppprof", "profile"]
    resolved = json.loads(argv[argv.index("--resolved-config") + 1])
    assert resolved["base_chunk_size"] == 64 and resolved["nproc_per_node"] == 3
    local = launcher_argv(3, {}, worker + ["--inject-fault", "skip-mamba-release"])
    assert local[-2:] == ["--inject-fault", "skip-mamba-release"]
    # a single node's rendezvous (--standalone's, given or not) on loopback, its ranks told to reach it there
    for given in ({}, {"standalone": True}, {"local_addr": "10.0.0.1"}):
        local = launcher_argv(3, given, worker)
        assert "--standalone" not in local and local.count("--local-addr") == 1, f"{given=} {local=}"
        assert local[local.index("--rdzv-endpoint") + 1] == "127.0.0.1:0"
        assert local[local.index("--local-addr") + 1] == "127.0.0.1"


@pytest.mark.parametrize("nnodes,expected", [(None, 1), ("2", 2), ("3:3", 3)])
def test_node_count(nnodes, expected):
    assert num_nodes(nnodes) == expected


@pytest.mark.parametrize("nnodes", ["1:4", "x", "0"])
def test_elastic_or_bad_node_counts_are_refused(nnodes):
    with pytest.raises(ValueError, match="--nnodes"):
        num_nodes(nnodes)


def test_a_store_listens_on_the_one_address_it_is_given():
    import datetime

    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend

    from ppprof.distributed.rendezvous import bound_stores

    with bound_stores("127.0.0.1", single_node=True):
        store = c10d_rendezvous_backend.TCPStore(
            "127.0.0.1", 0, is_master=True, multi_tenant=True, timeout=datetime.timedelta(seconds=10)
        )
        port = store.port
        assert listening(port) == ["127.0.0.1"], f"{listening(port)=}"  # torch alone: 0.0.0.0 and ::
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
        store.set("k", "v")
        assert client.get("k") == b"v"
    assert c10d_rendezvous_backend.TCPStore is dist.TCPStore  # put back


def listening(port: int) -> list[str]:
    """The local addresses of this host's listening TCP sockets on `port` (from /proc/net/tcp and tcp6)."""
    from tests.distributed.sockets import listening_sockets

    return sorted(address for address, p, _ in listening_sockets() if p == port)


def test_across_nodes_the_rendezvous_store_listens_on_the_address_named():
    import datetime
    import socket

    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous

    from ppprof.distributed.rendezvous import bound_stores

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # this host's address on its default route
        try:
            probe.connect(("192.0.2.1", 9))
            address = probe.getsockname()[0]
        except OSError:
            address = "127.0.0.1"
    if address.startswith("127."):
        pytest.skip("this host has no address besides loopback")
    with bound_stores(None, single_node=False):  # as --master-addr ADDRESS starts it
        store = static_tcp_rendezvous.TCPStore(address, 0, 1, True, datetime.timedelta(seconds=10), multi_tenant=True)
        assert listening(store.port) == [address], f"{listening(store.port)=}"


def test_a_rank_that_died_of_a_signal_is_named_first():
    from types import SimpleNamespace as Failure

    from ppprof.distributed.launch import failed_ranks

    assert (
        failed_ranks({0: Failure(exitcode=1, pid=10), 1: Failure(exitcode=-9, pid=11)})
        == "rank 1 died of SIGKILL (pid 11); rank 0 stopped after it"
    )
    assert failed_ranks({1: Failure(exitcode=-9, pid=11)}) == "rank 1 died of SIGKILL (pid 11)"
    assert (
        failed_ranks({0: Failure(exitcode=1, pid=10), 2: Failure(exitcode=1, pid=12)})
        == "rank 0, 2 failed; the [rank N] lines above say why"
    )
    # a rank the launcher's own shutdown SIGKILLed (a stopped rank takes no SIGTERM) 5 s after rank 1 failed
    assert (
        failed_ranks({1: Failure(exitcode=1, pid=11, timestamp=100), 0: Failure(exitcode=-9, pid=10, timestamp=105)})
        == "rank 1 failed; the [rank N] lines above say why"
    )
    assert (
        failed_ranks({1: Failure(exitcode=-9, pid=11, timestamp=100), 0: Failure(exitcode=1, pid=10, timestamp=101)})
        == "rank 1 died of SIGKILL (pid 11); rank 0 stopped after it"
    )


class Closed:
    """Stands in for torch's process context: what its close was told, and the launcher's note at that moment."""

    _tail_logs, filtered_stdout, filtered_stderr = (), None, None

    def __init__(self, note):
        self.note, self.calls = note, []

    def _close(self, death_sig, timeout):
        self.calls.append((death_sig, timeout, Path(self.note).read_text()))


def test_the_launcher_notes_why_it_stops_the_ranks_before_it_signals_them(monkeypatch):
    """A signal that reached the launcher is an interrupt for every rank, even one whose transfer broke first
    because the other rank took its SIGTERM sooner; a rank that ended first makes the SIGTERM a failure."""
    from torch.distributed.elastic.multiprocessing.api import PContext, SignalException

    from ppprof.distributed.launch import SHUTDOWN_TIMEOUT_S, bounded_close, stop_note
    from ppprof.distributed.stop import FAILED, INTERRUPTED, STOP_NOTE_ENV, read_stop_note

    monkeypatch.delenv(STOP_NOTE_ENV, raising=False)
    assert read_stop_note() is None  # plain torchrun: the rank judges from /proc
    with stop_note() as note, bounded_close(note):
        assert os.environ[STOP_NOTE_ENV] == note and read_stop_note() is None  # nothing written before a close
        ctx = Closed(note)
        try:
            raise SignalException("got SIGTERM", sigval=signal.SIGTERM)
        except SignalException:
            PContext.close(ctx, signal.SIGTERM, timeout=30)  # as torch's agent does on a signal
        assert ctx.calls == [(signal.SIGTERM, SHUTDOWN_TIMEOUT_S, "interrupted SIGTERM")]
        assert read_stop_note() == (INTERRUPTED, signal.SIGTERM)
        PContext.close(ctx)  # after a rank failed: outside any handler
        assert ctx.calls[-1][2] == FAILED and read_stop_note() == (FAILED, None)
    assert STOP_NOTE_ENV not in os.environ and not Path(note).parent.exists()
    monkeypatch.setenv(STOP_NOTE_ENV, note)  # gone, or garbled: no note
    assert read_stop_note() is None


def test_torchrun_takes_knows_its_flags_from_torchruns_own_parser():
    # torch 2.11's torchrun has no --shutdown-timeout and refuses a command line that passes it: the launcher asks.
    assert torchrun_takes("--nproc-per-node")
    assert not torchrun_takes("--no-such-torchrun-flag")


def test_a_rank_that_crashed_has_its_logs_last_lines_printed(tmp_path, capsys):
    """A C++ abort writes its reason to the rank's log (descriptor 2 points there), not to the launcher's stderr: a
    rank that crashed has its reason printed after the launcher's line, from where it opens (the backtrace's frames
    after it left out); a SIGKILL from outside adds nothing, nor does a log this launch did not write."""
    import os

    from ppprof.distributed.launch import Outcome
    from ppprof.run.job import record_outcome

    lines = [f"[rank 0] 01:57:11 INFO step {i}" for i in range(500)] + [
        "terminate called after throwing an instance of 'c10::Error'",
        "  what():  a C++ error",
        "Exception raised from run at pair.cc:537 (most recent call first):",
        *[f"frame #{i}: 0x7f00 in libtorch_cpu.so" for i in range(30)],
        "",
    ]
    (tmp_path / "rank0.log").write_text("\n".join(lines))
    (tmp_path / "rank1.log").write_text("[rank 1] 01:57:11 INFO probe 3\n[rank 1] 01:57:11 INFO probe 4\n")
    failure = "rank 0 died of SIGABRT (pid 5); rank 1 stopped after it"
    assert record_outcome(str(tmp_path), Outcome(1, failure)) == 1
    assert capsys.readouterr().err.splitlines() == [
        "error: rank 0's log ends: terminate called after throwing an instance of 'c10::Error'",
        "error: rank 0's log ends: what():  a C++ error",
        "error: rank 0's log ends: Exception raised from run at pair.cc:537 (most recent call first):",
    ]
    record_outcome(str(tmp_path), Outcome(1, "rank 1 died of SIGSEGV (pid 6)"))  # no reason in it: its last lines
    assert capsys.readouterr().err.splitlines() == [
        "error: rank 1's log ends: [rank 1] 01:57:11 INFO probe 3",
        "error: rank 1's log ends: [rank 1] 01:57:11 INFO probe 4",
    ]
    record_outcome(str(tmp_path), Outcome(1, "rank 1 died of SIGKILL (pid 6)"))
    record_outcome(str(tmp_path / "elsewhere"), Outcome(1, "rank 0 died of SIGSEGV (pid 7)"))  # no log on this node
    os.utime(tmp_path / "rank0.log", (1000.0, 1000.0))  # a resumed run's log, last written by an earlier launch
    record_outcome(str(tmp_path), Outcome(1, failure), since=2000.0)
    assert capsys.readouterr().err == ""


def test_the_rendezvous_events_keep_torchs_names_found_without_reading_source():
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    from ppprof.distributed.launch import cheap_event_names

    class Handler:  # as torch's handlers call it: from _record, named after _record's caller
        def _record(self):
            return dynamic_rendezvous.get_method_name()

        def next_rendezvous(self):
            return self._record()

    torchs = dynamic_rendezvous.get_method_name
    with cheap_event_names():
        assert dynamic_rendezvous.get_method_name is not torchs
        assert Handler().next_rendezvous() == "next_rendezvous"
        assert dynamic_rendezvous.get_method_name(depth=10_000) == "no_method_name"
    assert dynamic_rendezvous.get_method_name is torchs and Handler().next_rendezvous() == "next_rendezvous"

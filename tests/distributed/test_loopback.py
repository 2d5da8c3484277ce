"""A single-node profile exposes nothing beyond this host: every socket its launcher and ranks listen on (the
rendezvous stores, gloo's) is bound to loopback (torch alone binds its stores to every interface)."""

import os
import signal
import subprocess
import sys

import pytest

from tests.distributed.sockets import is_loopback, listening_sockets, socket_inodes
from tests.multirank import REPO
from tests.run.test_faults import LONG, descendants, read_until

pytestmark = [pytest.mark.multirank, pytest.mark.timeout(300)]


def test_a_single_node_profile_listens_on_loopback_only(tmp_path):
    # with --standalone or without, the same rendezvous (tests/distributed/test_launch.py)
    cmd = [sys.executable, "-m", "ppprof", "profile", "--out", str(tmp_path / "run"), *LONG]
    p = subprocess.Popen(cmd, cwd=REPO, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        read_until(p, "probe 1 (")  # the stores and every rank's group are up
        pids = [p.pid] + descendants(p.pid)
        held = {inode: pid for pid in pids for inode in socket_inodes(pid)}
        ours = [(address, port, held[inode]) for address, port, inode in listening_sockets() if inode in held]
        p.send_signal(signal.SIGINT)  # seen what it listens on: the rest of the profile adds no socket
        p.stderr.read()
        p.wait(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 130
    assert any(pid == p.pid for _, _, pid in ours), f"the launcher's store was not found: {ours=}"
    exposed = [(address, port, pid) for address, port, pid in ours if not is_loopback(address)]
    assert not exposed, f"{exposed=} of {ours=}"

"""What /proc tells of this node's processes: whether a rank of the launcher is gone, and which ones are stopped.
Linux; elsewhere each answers as if nothing were wrong."""

from __future__ import annotations

import os
from collections.abc import Iterator


def children(parent: int) -> Iterator[tuple[int, str]]:
    """(pid, state letter of /proc/PID/stat) of each child of `parent`; none where /proc cannot be read."""
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) == parent:
                yield int(entry.name), fields[0]
        except (OSError, IndexError, ValueError):
            continue


def local_rank_gone(parent: int) -> bool:
    """Whether fewer of this node's ranks (the launcher's children, LOCAL_WORLD_SIZE of them) are alive than it
    started: a SIGTERM then most likely follows a rank's death, not an interrupt. Linux (/proc); False elsewhere."""
    try:
        expected = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
    except ValueError:
        return False
    alive = sum(state != "Z" for _, state in children(parent))
    return 0 < alive < expected


def stopped_ranks(parent: int) -> dict[int, int]:
    """{rank: pid} of this node's ranks (children of the launcher `parent`, RANK=rank in their environment) that are
    stopped (SIGSTOP, a debugger), in one pass over /proc. Linux; empty elsewhere."""
    out = {}
    for pid, state in children(parent):
        if state not in ("T", "t"):
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except OSError:
            continue
        for item in environ:
            if item.startswith(b"RANK=") and item[5:].isdigit():
                out[int(item[5:])] = pid
    return out

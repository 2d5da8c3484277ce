"""What /proc tells of this node's processes: whether a rank of the launcher is gone, and which one is stopped.
Linux; elsewhere each answers as if nothing were wrong."""

from __future__ import annotations

import os


def local_rank_gone(parent: int) -> bool:
    """Whether fewer of this node's ranks (the launcher's children, LOCAL_WORLD_SIZE of them) are alive than it
    started: a SIGTERM then most likely follows a rank's death, not an interrupt. Linux (/proc); False elsewhere."""
    try:
        expected = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
        alive = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == parent and fields[0] != "Z":
                alive += 1
    except (OSError, ValueError):
        return False
    return 0 < alive < expected


def stopped_sibling(parent: int, rank: int) -> int | None:
    """The pid of this node's rank `rank` (a child of the launcher `parent` whose environment says RANK=`rank`) when
    that process is stopped (SIGSTOP, a debugger), None otherwise: running, gone, or not on this node. Linux (/proc);
    None elsewhere."""
    want = f"RANK={rank}".encode()
    try:
        entries = list(os.scandir("/proc"))
    except OSError:
        return None
    for entry in entries:
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[1]) != parent:
                continue
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                environ = f.read().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if want in environ:
            return int(entry.name) if fields[0] in ("T", "t") else None
    return None

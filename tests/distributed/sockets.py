"""The listening TCP sockets of this host and of given processes, from /proc/net/tcp{,6} and /proc/PID/fd."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path

LISTEN = "0A"  # the TCP state /proc/net/tcp writes for a listening socket


def listening_sockets() -> list[tuple[str, int, int]]:
    """(local address, port, socket inode) of each listening TCP socket of this network namespace."""
    out = []
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != LISTEN:
                continue
            hex_address, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_address)
            # the kernel writes each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            address = str(ipaddress.ip_address(raw)) if family == socket.AF_INET else str(ipaddress.IPv6Address(raw))
            out.append((address, int(hex_port, 16), int(fields[9])))
    return out


def socket_inodes(pid: int) -> set[int]:
    """The inodes of the sockets process `pid` holds open."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return ip.is_loopback or (
        isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback
    )

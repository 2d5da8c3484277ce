"""Where the launcher's rendezvous stores listen: torch's TCPStore binds every interface whatever host it is given
(pytorch/pytorch#173909), and the store has no authentication. While the launcher runs, each store it hosts listens
on a socket bound here, to one address, and handed to the store (`master_listen_fd`, as vLLM does)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
import socket
import uuid

LOOPBACK = "127.0.0.1"
"""Where a single-node run's stores listen, and the address its ranks reach them at."""


def single_node_argv() -> list[str]:
    """torchrun's options for a rendezvous on this node only (what --standalone does, but on LOOPBACK: --standalone
    names `localhost`, which may resolve to ::1, and the ranks' MASTER_ADDR to the host's name)."""
    return [
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{LOOPBACK}:0",
        "--rdzv-id",
        str(uuid.uuid4()),
        "--local-addr",
        LOOPBACK,
    ]


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on the address `host` resolves to (its first one), at `port` (0: a free one)."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address[:2] if family == socket.AF_INET else address)
        sock.listen(socket.SOMAXCONN)
    except OSError:
        sock.close()
        raise
    return sock


def resolves_to_loopback(host: str, port: int) -> bool:
    try:
        address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][4][0]
    except OSError:
        return False
    return ipaddress.ip_address(address.split("%")[0]).is_loopback


@contextlib.contextmanager
def bound_stores(worker_store_host: str | None, single_node: bool):
    """While open, every TCPStore server torch's launcher creates in this process (the c10d and static rendezvous
    stores, at the host of --rdzv-endpoint or --master-addr; the store it shares with its ranks, at
    `worker_store_host`, or every interface where that is None) listens on a socket bound to that one address.
    Across nodes, a host name that resolves to loopback here (a hostname mapped to 127.0.1.1 in /etc/hosts) keeps
    torch's every-interface store: the other nodes reach it at the name's address in their DNS."""
    import torch.distributed as dist
    from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend, dynamic_rendezvous, static_tcp_rendezvous

    def store(host_name, port, world_size=None, is_master=False, *args, **kwargs):
        if not is_master or kwargs.get("master_listen_fd") is not None:
            return dist.TCPStore(host_name, port, world_size, is_master, *args, **kwargs)
        if not single_node and resolves_to_loopback(host_name, port):
            return dist.TCPStore(host_name, port, world_size, is_master, *args, **kwargs)
        try:
            sock = bind(host_name, port)
        except OSError as e:  # what torch raises where a store cannot listen (its caller retries as a client)
            raise RuntimeError(f"cannot listen on {host_name}:{port}: {e.strerror}") from None
        port, fd = sock.getsockname()[1], sock.detach()  # the store owns the socket from here on, and closes it
        try:
            return dist.TCPStore(host_name, port, world_size, is_master, *args, master_listen_fd=fd, **kwargs)
        except BaseException:
            os.close(fd)
            raise

    def worker_store(self, master_addr, master_port):
        return (
            store(worker_store_host or master_addr, master_port, is_master=True, multi_tenant=True)
            if worker_store_host
            else original(self, master_addr, master_port)
        )

    handler = dynamic_rendezvous.DynamicRendezvousHandler
    original = handler._create_tcp_store_server
    saved = (c10d_rendezvous_backend.TCPStore, static_tcp_rendezvous.TCPStore)
    c10d_rendezvous_backend.TCPStore = static_tcp_rendezvous.TCPStore = store
    handler._create_tcp_store_server = worker_store
    try:
        yield
    finally:
        c10d_rendezvous_backend.TCPStore, static_tcp_rendezvous.TCPStore = saved
        handler._create_tcp_store_server = original

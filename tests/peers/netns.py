"""Network namespaces for peer tests: isolated interfaces and abstract unix sockets.

A test that changes interfaces, or runs ibsim (whose ``@sim:*`` abstract sockets are global
per network namespace), does it in a namespace of its own, so it neither disturbs the host
nor collides with another run. Needs root and iproute2's ``ip``.
"""

from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from tests.conftest import require_peer, require_root

CLONE_NEWNET = 0x40000000
NETNS_DIR = Path("/run/netns")
T = TypeVar("T")


@contextmanager
def network_namespace(prefix: str) -> Iterator[str]:
    """A fresh named namespace (``ip netns add``) with loopback up; deleted afterwards."""
    require_root("network namespaces")
    ip = require_peer("ip")
    name = f"{prefix}-{os.getpid()}-{threading.get_ident() % 10000}"
    subprocess.run([ip, "netns", "add", name], check=True, capture_output=True)
    try:
        subprocess.run([ip, "-n", name, "link", "set", "lo", "up"], check=True)
        yield name
    finally:
        subprocess.run([ip, "netns", "del", name], check=False, capture_output=True)


def add_test_interface(netns: str, name: str) -> None:
    """An Ethernet-like interface that is up: a dummy, or one end of a veth pair on kernels
    built without the dummy driver."""
    ip = require_peer("ip")
    made = subprocess.run(
        [ip, "-n", netns, "link", "add", name, "type", "dummy"], capture_output=True
    )
    if made.returncode != 0:
        subprocess.run(
            [ip, "-n", netns, "link", "add", name, "type", "veth", "peer", "name", f"{name}p"],
            check=True,
            capture_output=True,
        )
        _up_without_link_local(ip, netns, f"{name}p")
    _up_without_link_local(ip, netns, name)


def _up_without_link_local(ip: str, netns: str, name: str) -> None:
    # No automatic IPv6 link-local address: the tests count the addresses they add.
    subprocess.run([ip, "-n", netns, "link", "set", name, "addrgenmode", "none"], check=True)
    subprocess.run([ip, "-n", netns, "link", "set", name, "up"], check=True)


def in_namespace(name: str, make: Callable[[], T]) -> T:
    """Run ``make`` in a thread that joined the namespace: sockets it opens live there."""
    libc = ctypes.CDLL(None, use_errno=True)
    result: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        fd = os.open(NETNS_DIR / name, os.O_RDONLY)
        try:
            if libc.setns(fd, CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), f"setns({name})")
            result.append(make())
        except BaseException as exc:
            failure.append(exc)
        finally:
            os.close(fd)

    # A thread of its own: setns changes only the calling thread, which then ends.
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]


def ns_socket_factory(name: str, *, rcvbuf: int | None = None) -> Callable[[int], socket.socket]:
    """An IpMonitor socket factory opening NETLINK_ROUTE sockets inside namespace ``name``."""
    from ibacm.fabric.hw.ipmon import open_route_socket

    def factory(groups: int) -> socket.socket:
        sock = in_namespace(name, lambda: open_route_socket(groups))
        if rcvbuf is not None and groups:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        return sock

    return factory

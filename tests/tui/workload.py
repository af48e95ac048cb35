"""A tiny background workload: resolve addresses through a daemon's client socket so the
dashboard's counters, cache and plots move while a test (or a person) watches.

It speaks the client protocol exactly as ib_acme does (one RESOLVE, one reply) with the
codec from ``ibacm.wire.client``, in a thread so it works next to asyncio and trio alike.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType

from ibacm.tools.workload import resolve_request
from ibacm.wire.client import AcmHdr, AcmStatus, reply_length

ENODATA = AcmStatus.ENODATA


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the daemon closed the connection")
        data += chunk
    return data


def resolve(client_socket: Path, source: str, dest: str, *, timeout: float = 10.0) -> int:
    """Resolve ``dest`` by name from ``source``; returns the reply's ACM status (0 = path)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(client_socket))
        return _resolve_on(sock, source, dest)


def resolve_when_ready(
    client_socket: Path, source: str, dest: str, *, timeout: float = 30.0
) -> int:
    """Like ``resolve``, retrying while the daemon answers "no data" (status 3): right after
    start-up an endpoint answers so until it has joined its multicast group."""
    deadline = time.monotonic() + timeout
    while True:
        status = resolve(client_socket, source, dest)
        if status != ENODATA or time.monotonic() > deadline:
            return status
        time.sleep(0.1)


def _resolve_on(sock: socket.socket, source: str, dest: str) -> int:
    sock.sendall(resolve_request(source, dest, nodelay=False))
    first8 = _read_exactly(sock, 8)
    rest = _read_exactly(sock, reply_length(first8) - 8)
    return AcmHdr.decode(first8 + rest).status


class BackgroundWorkload:
    """Resolve ``dests`` round-robin at about ``rate`` per second until stopped."""

    def __init__(
        self, client_socket: Path, source: str, dests: Sequence[str], *, rate: float = 40.0
    ) -> None:
        if not dests:
            raise ValueError("the workload needs at least one destination")
        if rate <= 0:
            raise ValueError(f"rate must be positive, got {rate}")
        self.client_socket = client_socket
        self.source = source
        self.dests = list(dests)
        self.interval = 1.0 / rate
        self.statuses: Counter[int] = Counter()
        self.error: Exception | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workload", daemon=True)

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    def _run(self) -> None:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10.0)
                sock.connect(str(self.client_socket))
                index = 0
                while not self._stop.is_set():
                    dest = self.dests[index % len(self.dests)]
                    self.statuses[_resolve_on(sock, self.source, dest)] += 1
                    index += 1
                    self._stop.wait(self.interval)
        except (OSError, EOFError) as exc:
            self.error = exc

    def __enter__(self) -> BackgroundWorkload:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(15)

    def wait_for(self, count: int, timeout: float = 10.0) -> None:
        """Block until ``count`` resolutions were answered (or the workload failed)."""
        deadline = time.monotonic() + timeout
        while self.sent < count:
            if self.error is not None:
                raise AssertionError(f"workload failed: {self.error}")
            if time.monotonic() > deadline:
                raise AssertionError(f"workload: only {self.sent} of {count} resolutions")
            time.sleep(0.02)

"""The sd_notify client: ``KEY=VALUE`` lines in one AF_UNIX datagram to ``NOTIFY_SOCKET``.

``NOTIFY_SOCKET`` is a path, or an abstract name written with a leading ``@``. It sits on the
lowest floor because the daemon, the simulated fabric's hub and the emulated HCA all tell
their service manager (systemd, or ``ibacm-sim up``) when they are ready.
"""

from __future__ import annotations

import collections
import enum
import errno
import os
import socket
import time
from collections.abc import Mapping

import trio

from ibacm.log import get_logger

log = get_logger("ibacm.systemd")  # the name its warnings carried when this lived in core


def notify_address(env: Mapping[str, str] | None = None) -> str | bytes | None:
    """The NOTIFY_SOCKET address in the form ``socket.sendto`` takes, or None."""
    env = os.environ if env is None else env
    value = env.get("NOTIFY_SOCKET")
    if not value:
        return None
    if value.startswith("@"):
        return b"\0" + value[1:].encode()
    if not value.startswith("/"):
        # Only unix paths and abstract names exist for AF_UNIX (vsock addresses are not used).
        return None
    return value


NOTIFY_GIVE_UP = 5.0
"""Seconds a message may wait for room in the manager's queue before it is dropped (a state
message is then still retried, with a warning)."""
RETRY_PAUSE_MAX = 2.0
"""Longest pause between two tries of a message that found the manager's queue full."""


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, the clock ``MONOTONIC_USEC=`` is defined on (not trio's
    clock, whose origin is its own)."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


class _Outcome(enum.Enum):
    SENT = "sent"
    FULL = "full"
    GONE = "gone"


class Notifier:
    """Sends sd_notify messages; a no-op when NOTIFY_SOCKET is not set.

    A full queue at the manager (EAGAIN) is waited out with growing pauses. (Waiting for the
    socket to become writable does not work: an unconnected datagram socket always looks
    writable, so a retry loop on it spins a CPU, as 181 daemons starting at once showed.)

    * ``notify``/``status`` try for at most ``NOTIFY_GIVE_UP`` seconds, then drop the message:
      a later STATUS= says the same, fresher.
    * ``announce`` queues a state message (READY=1, RELOADING=1) for ``run``, which sends
      them in order and retries each until the manager has it: a READY=1 lost to a full
      queue would leave the unit "activating" until systemd kills it, a lost READY=1 after
      RELOADING=1 a reload that never ends. ``stopping`` drops what is still queued.
    """

    def __init__(self, address: str | bytes | None) -> None:
        self.address = address
        self.attempts = 0
        """sendto calls made, for tests."""
        self.gone = False
        """The manager's socket went away (``ibacm-sim up`` is done listening): STATUS= stops."""
        self.last_status: str | None = None
        """The STATUS= the manager has last been sent, by any message."""
        self._warned = False
        self._queue: collections.deque[str] = collections.deque()
        self._wakeup: trio.Event | None = None
        self._delivery: trio.CancelScope | None = None
        self._stopping = False

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None) -> Notifier:
        return cls(notify_address(env))

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @staticmethod
    def _payload(fields: Mapping[str, str]) -> str:
        return "\n".join(f"{key.upper()}={value}" for key, value in fields.items())

    def _send(self, payload: str) -> _Outcome:
        assert self.address is not None
        self.attempts += 1
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.setblocking(False)
            try:
                sock.sendto(payload.encode(), self.address)
            except BlockingIOError:
                return _Outcome.FULL
            except OSError as exc:
                # The manager went away (or never listened): nothing a daemon can do. Only
                # a socket nobody listens on stops STATUS= for good.
                self.gone = exc.errno in (errno.ECONNREFUSED, errno.ENOENT, errno.ENOTDIR)
                return _Outcome.GONE
        for line in payload.split("\n"):
            if line.startswith("STATUS="):
                self.last_status = line.removeprefix("STATUS=")
        return _Outcome.SENT

    async def _send_until(self, payload: str, give_up: float | None) -> _Outcome:
        """Try until sent, gone, or ``give_up`` seconds of a full queue (None: never)."""
        started = trio.current_time()
        pause = 0.01
        while True:
            outcome = self._send(payload)
            if outcome is not _Outcome.FULL:
                return outcome
            waited = trio.current_time() - started
            if give_up is not None and waited + pause > give_up:
                return outcome
            await trio.sleep(pause)
            pause = min(pause * 2, RETRY_PAUSE_MAX)

    async def notify(self, **fields: str) -> bool:
        """Send ``KEY=VALUE`` lines (``ready="1"`` -> ``READY=1``); True if it was sent."""
        if self.address is None:
            return False
        payload = self._payload(fields)
        outcome = await self._send_until(payload, NOTIFY_GIVE_UP)
        if outcome is _Outcome.FULL and not self._warned:
            self._warned = True
            log.warning("sd_notify dropped: the service manager's queue stays full", sent=payload)
        return outcome is _Outcome.SENT

    async def ready(self, status: str) -> bool:
        return await self.notify(ready="1", status=status, mainpid=str(os.getpid()))

    async def stopping(self, status: str = "shutting down") -> bool:
        """STOPPING=1, after dropping the state messages not delivered yet (a READY=1 after
        STOPPING=1 would tell the manager the daemon serves again)."""
        self._stopping = True
        self._queue.clear()
        if self._delivery is not None:
            self._delivery.cancel()
        return await self.notify(stopping="1", status=status)

    async def status(self, status: str) -> bool:
        if self.gone or self._stopping:
            return False
        return await self.notify(status=status)

    # -- state messages ------------------------------------------------------------------------
    def announce(self, **fields: str) -> None:
        """Queue a state message for ``run``: sent after the ones before it, retried until
        the manager has it."""
        if self.address is None or self._stopping:
            return
        self._queue.append(self._payload(fields))
        if self._wakeup is not None:
            self._wakeup.set()

    def reloading(self, status: str) -> None:
        """RELOADING=1 with the time the reload began (``Type=notify-reload``, systemd 253+,
        takes the reload as begun only with a MONOTONIC_USEC= no older than its SIGHUP)."""
        self.announce(reloading="1", monotonic_usec=str(monotonic_usec()), status=status)

    def reloaded(self, status: str) -> None:
        """READY=1: the reload is over, whether it was applied or refused."""
        self.announce(ready="1", status=status)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver the announced state messages, in order, until cancelled."""
        task_status.started()
        while True:
            self._wakeup = trio.Event()
            if not self._queue:
                await self._wakeup.wait()
                continue
            payload = self._queue[0]
            with trio.CancelScope() as self._delivery:
                await self._deliver(payload)
            self._delivery = None
            if self._queue and self._queue[0] is payload:
                self._queue.popleft()

    async def _deliver(self, payload: str) -> None:
        started = trio.current_time()
        outcome = await self._send_until(payload, NOTIFY_GIVE_UP)
        if outcome is not _Outcome.FULL:
            return
        log.warning(
            "sd_notify: the service manager's queue stays full; still trying",
            sent=payload,
            waited=round(trio.current_time() - started, 1),
        )
        if await self._send_until(payload, None) is _Outcome.SENT:
            # A warning too, so whoever saw the first one sees the end of it.
            log.warning(
                "sd_notify delivered",
                sent=payload,
                waited=round(trio.current_time() - started, 1),
            )

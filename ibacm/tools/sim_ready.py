"""Readiness of the processes ``ibacm-sim up`` starts: sd_notify ``READY=1``, at any scale.

Every process (hub, emulated device, daemon) sends one ``READY=1`` datagram to an abstract
AF_UNIX socket. The kernel queues few datagrams per socket (``net.unix.max_dgram_qlen``, 10
here); a sender finding the queue full retries for a few seconds and then drops its message.
So the receiver must empty the queue as fast as datagrams arrive: each wake-up drains every
queued datagram, and a sender is matched to its node by a pid lookup (its ancestry is read
from /proc only for a pid that is not one ``up`` started, once). The earlier receiver took
one datagram per wake-up and walked /proc for every pending node against every ready pid;
at 200 nodes the queue stayed full, READY=1 messages were dropped and ``up`` timed out
blaming nodes that were serving.

``Readiness`` is the bookkeeping (no I/O; the parent lookup is passed in); ``await_ready``
runs it against real processes; ``Progress`` shows n/N on a terminal.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import subprocess
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import trio

_ANCESTRY_DEPTH = 16
"""Wrappers between ``up`` and a daemon are few (unshare, sh); deeper is not ours."""

_DRAIN_MAX = 4096
"""Datagrams taken per wake-up at most, so a flood cannot starve the exit checks."""


def parse_notify(data: bytes, sender_pid: int) -> tuple[int, dict[str, str]]:
    """(pid the message is about, its fields): ``MAINPID=`` wins over the sender's pid."""
    fields = dict(
        line.split("=", 1) for line in data.decode(errors="replace").splitlines() if "=" in line
    )
    pid = sender_pid
    if fields.get("MAINPID", "").isdigit():
        pid = int(fields["MAINPID"])
    return pid, fields


def proc_parent(pid: int) -> int | None:
    """The parent pid of ``pid`` from /proc, None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[-1].split()[1])
    except (IndexError, ValueError):
        return None


@dataclass
class Readiness:
    """Which of the named processes have said ``READY=1``.

    ``pids`` maps a name to the pid ``up`` started; a message from another pid counts for
    the started process it descends from (``parent_of`` walks up, at most once per pid).
    """

    pids: Mapping[str, int]
    parent_of: Callable[[int], int | None] = proc_parent
    ready: dict[str, str] = field(default_factory=dict)
    """name -> how it became ready ("notify" or "serving")."""
    status: dict[str, str] = field(default_factory=dict)
    """name -> the last STATUS= it sent."""
    _by_pid: dict[int, str | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._by_pid.update({pid: name for name, pid in self.pids.items()})

    @property
    def total(self) -> int:
        return len(self.pids)

    def pending(self) -> list[str]:
        """Names not ready yet, in the order they were given."""
        return [name for name in self.pids if name not in self.ready]

    def owner(self, pid: int) -> str | None:
        """The started process ``pid`` is, or descends from; None if none."""
        if pid in self._by_pid:
            return self._by_pid[pid]
        seen = [pid]
        name: str | None = None
        current: int | None = pid
        for _ in range(_ANCESTRY_DEPTH):
            current = self.parent_of(current) if current is not None else None
            if current is None or current <= 1:
                break
            if current in self._by_pid:
                name = self._by_pid[current]
                break
            seen.append(current)
        for each in seen:  # every pid on the way is settled: no second walk for it
            self._by_pid[each] = name
        return name

    def notified(self, pid: int, fields: Mapping[str, str]) -> str | None:
        """Take one message; returns the name it made ready, if it did."""
        name = self.owner(pid)
        if name is None:
            return None
        if "STATUS" in fields:
            self.status[name] = fields["STATUS"]
        if fields.get("READY") == "1" and name not in self.ready:
            self.ready[name] = "notify"
            return name
        return None

    def mark_serving(self, name: str) -> None:
        """``name`` serves although its READY=1 never arrived (its sender dropped it)."""
        self.ready.setdefault(name, "serving")


class ReadyListener:
    """The abstract AF_UNIX datagram socket the started processes notify (NOTIFY_SOCKET)."""

    def __init__(self) -> None:
        self.name = f"@ibacm-sim-{os.getpid()}-{secrets.token_hex(6)}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setblocking(False)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        # The queue length is capped by max_dgram_qlen, not by this; it only keeps bytes
        # from being the limit too.
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)

    def bind(self) -> None:
        self.sock.bind(b"\0" + self.name[1:].encode())

    async def wait(self) -> None:
        await trio.lowlevel.wait_readable(self.sock)

    def drain(self) -> Iterator[tuple[int, dict[str, str]]]:
        """Every datagram queued now, as (pid, fields)."""
        for _ in range(_DRAIN_MAX):
            try:
                data, ancillary, _flags, _addr = self.sock.recvmsg(
                    4096, socket.CMSG_SPACE(struct.calcsize("iII"))
                )
            except (BlockingIOError, InterruptedError):
                return
            sender = 0
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                    sender = struct.unpack("iII", payload[:12])[0]
            yield parse_notify(data, sender)

    def close(self) -> None:
        self.sock.close()


class Progress:
    """``n/N ready`` on one rewritten line of a terminal; silent when not a terminal."""

    def __init__(self, stream: TextIO, what: str, *, interval: float = 0.2) -> None:
        self.stream = stream
        self.what = what
        self.interval = interval
        self.enabled = stream.isatty()
        self._shown: tuple[int, int] | None = None
        self._last = -interval

    def update(self, done: int, total: int, *, force: bool = False) -> None:
        if not self.enabled or (done, total) == self._shown:
            return
        now = trio.current_time()
        if not force and done < total and now - self._last < self.interval:
            return
        self._shown, self._last = (done, total), now
        self.stream.write(f"\r\x1b[Kibacm-sim: {self.what} {done}/{total} ready")
        self.stream.flush()

    def finish(self) -> None:
        """End the progress line, so what follows starts on a line of its own."""
        if self.enabled and self._shown is not None:
            self.stream.write("\n")
            self.stream.flush()
            self._shown = None


class ReadyError(Exception):
    """A process did not get ready; ``name`` is the one to look at."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


async def await_ready(
    listener: ReadyListener,
    procs: Mapping[str, subprocess.Popen[bytes]],
    timeout: float,
    *,
    serving: Callable[[str], bool] | None = None,
    progress: Progress | None = None,
    exit_check_interval: float = 0.25,
) -> Readiness:
    """Wait until every process has sent READY=1.

    Raises ``ReadyError`` for the first process that exits before it is ready, or at the
    timeout. At the timeout, a process ``serving`` reports as serving counts as ready (its
    READY=1 was lost), and the error names a process that is really not ready.
    """
    state = Readiness({name: proc.pid for name, proc in procs.items()})
    next_check = trio.current_time()
    with trio.move_on_after(timeout):
        while len(state.ready) < state.total:
            with trio.move_on_after(exit_check_interval):
                await listener.wait()
            for pid, fields in listener.drain():
                state.notified(pid, fields)
            if progress is not None:
                progress.update(len(state.ready), state.total)
            if trio.current_time() >= next_check:
                next_check = trio.current_time() + exit_check_interval
                _raise_if_exited(state, procs)
        _finish(progress, state)
        return state
    for pid, fields in listener.drain():  # what came in with the deadline
        state.notified(pid, fields)
    _raise_if_exited(state, procs)
    stuck = []
    for name in state.pending():
        if serving is not None and serving(name):
            state.mark_serving(name)
        else:
            stuck.append(name)
    _finish(progress, state)
    if not stuck:
        return state
    name = stuck[0]
    status = state.status.get(name, "no status")
    raise ReadyError(
        name,
        f"{len(stuck)} process(es) not ready after {timeout:g} s, first {name} "
        f"(pid {procs[name].pid}, last status: {status})",
    )


def _finish(progress: Progress | None, state: Readiness) -> None:
    if progress is not None:
        progress.update(len(state.ready), state.total, force=True)
        progress.finish()


def _raise_if_exited(state: Readiness, procs: Mapping[str, subprocess.Popen[bytes]]) -> None:
    for name in state.pending():
        code = procs[name].poll()
        if code is not None:
            raise ReadyError(name, f"{name} exited with status {code} before it was ready")

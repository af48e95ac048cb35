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

The queue must also be emptied while ``up`` is still starting processes (500 starts take
long enough for the first daemons to give up), and a node whose READY=1 was lost anyway
still counts once it serves.

``Readiness`` is the bookkeeping (no I/O; the parent lookup is passed in); ``ReadyWaiter``
runs it against real processes as they are started; ``Progress`` shows n/N on stderr.
"""

from __future__ import annotations

import os
import secrets
import socket
import struct
import subprocess
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import trio

_ANCESTRY_DEPTH = 16
"""Wrappers between ``up`` and a daemon are few (unshare, sh); deeper is not ours."""

_DRAIN_MAX = 4096
"""Datagrams taken per wake-up at most, so a flood cannot starve the exit checks."""

_ORPHANS_MAX = 4096
"""Messages kept for processes not named yet; beyond, strangers' messages are dropped."""


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

    pids: dict[str, int]
    parent_of: Callable[[int], int | None] = proc_parent
    ready: dict[str, str] = field(default_factory=dict)
    """name -> how it became ready ("notify" or "serving")."""
    status: dict[str, str] = field(default_factory=dict)
    """name -> the last STATUS= it sent."""
    _by_pid: dict[int, str | None] = field(default_factory=dict)
    _orphans: list[tuple[int, Mapping[str, str]]] = field(default_factory=list)
    """Messages from no known process yet: a process may notify before ``add`` names it."""

    def __post_init__(self) -> None:
        self._by_pid.update({pid: name for name, pid in self.pids.items()})

    def add(self, name: str, pid: int) -> None:
        """One more started process (``up`` listens while it starts them)."""
        self.pids[name] = pid
        self._by_pid[pid] = name
        if self._orphans:  # it (or a child) may have spoken already: settle them again
            self._by_pid = {p: n for p, n in self._by_pid.items() if n is not None}
            orphans, self._orphans = self._orphans, []
            self.take(orphans)

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
            if len(self._orphans) < _ORPHANS_MAX:
                self._orphans.append((pid, fields))
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

    def take(self, messages: Iterable[tuple[int, Mapping[str, str]]]) -> None:
        for pid, fields in messages:
            self.notified(pid, fields)


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


LINE_INTERVAL = 3.0
"""Seconds between progress lines when stderr is not a terminal (a log, a pipe)."""


class Progress:
    """``n/N ready`` (or another ``verb``) as work advances.

    On a terminal one line, rewritten at most every ``interval`` seconds; otherwise a line of
    its own every ``line_interval`` seconds, changed or not (a quick run prints nothing), and
    the final count if any line was printed: a long ``up`` or ``down`` in a log is seen to
    advance, or to wait.
    """

    def __init__(
        self,
        stream: TextIO,
        what: str,
        *,
        verb: str = "ready",
        interval: float = 0.2,
        line_interval: float = LINE_INTERVAL,
    ) -> None:
        self.stream = stream
        self.what = what
        self.verb = verb
        self.tty = stream.isatty()
        self.interval = interval if self.tty else line_interval
        self._shown: tuple[int, int] | None = None
        self._last: float | None = None
        self._lines = 0

    def _text(self, done: int, total: int) -> str:
        return f"ibacm-sim: {self.what} {done}/{total} {self.verb}"

    def update(self, done: int, total: int, *, force: bool = False) -> None:
        now = trio.current_time()
        if self.tty:
            if (done, total) == self._shown:
                return
            due = self._last is None or force or done >= total or now - self._last >= self.interval
            if due:
                self.stream.write(f"\r\x1b[K{self._text(done, total)}")
                self.stream.flush()
                self._shown, self._last = (done, total), now
            return
        if self._last is None:
            self._last = now  # the first line comes one interval after the start
            return
        # Unchanged counts are printed again: a line every few seconds shows it still waits.
        if now - self._last >= self.interval or (
            force and self._lines and (done, total) != self._shown
        ):
            self.stream.write(self._text(done, total) + "\n")
            self.stream.flush()
            self._shown, self._last = (done, total), now
            self._lines += 1

    def finish(self) -> None:
        """End the progress line, so what follows starts on a line of its own."""
        if self.tty and self._shown is not None:
            self.stream.write("\n")
            self.stream.flush()
        self._shown, self._last, self._lines = None, None, 0


class ReadyError(Exception):
    """A process did not get ready; ``name`` is the one to look at."""

    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


class ReadyWaiter:
    """Collects READY=1 for processes as they are started, then waits for the rest.

    Each ``add`` also takes what has arrived so far: while ``up`` starts hundreds of
    processes, the first ones are already notifying, and a queue left full for seconds makes
    their senders drop READY=1.
    """

    def __init__(
        self,
        listener: ReadyListener,
        *,
        serving: Callable[[str], bool] | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.listener = listener
        self.serving = serving
        self.progress = progress
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.state = Readiness({})

    def add(self, name: str, proc: subprocess.Popen[bytes]) -> None:
        self.procs[name] = proc
        self.state.add(name, proc.pid)
        self.state.take(self.listener.drain())
        self._show()

    async def wait(
        self,
        timeout: float,
        *,
        exit_check_interval: float = 0.25,
        probe_interval: float = 5.0,
    ) -> Readiness:
        """Wait until every process is ready.

        Raises ``ReadyError`` for the first process that exits before it is ready, or at the
        timeout, naming a process that is really not ready. Every ``probe_interval`` seconds
        the pending processes ``serving`` reports as serving count as ready: a sender that
        found the queue full for too long dropped its READY=1 and will not send it again.
        """
        state = self.state
        now = trio.current_time()
        next_check, next_probe = now, now + probe_interval
        with trio.move_on_after(timeout):
            while len(state.ready) < state.total:
                with trio.move_on_after(exit_check_interval):
                    await self.listener.wait()
                state.take(self.listener.drain())
                self._show()
                now = trio.current_time()
                if now >= next_check:
                    next_check = now + exit_check_interval
                    self._raise_if_exited()
                if now >= next_probe:
                    next_probe = now + probe_interval
                    self._probe()
            self._finish()
            return state
        state.take(self.listener.drain())  # what came in with the deadline
        self._raise_if_exited()
        self._probe()
        self._finish()
        stuck = state.pending()
        if not stuck:
            return state
        name = stuck[0]
        status = state.status.get(name, "no status")
        raise ReadyError(
            name,
            f"{len(stuck)} process(es) not ready after {timeout:g} s, first {name} "
            f"(pid {self.procs[name].pid}, last status: {status})",
        )

    def _probe(self) -> None:
        if self.serving is None:
            return
        for name in self.state.pending():
            if self.serving(name):
                self.state.mark_serving(name)

    def _show(self) -> None:
        if self.progress is not None:
            self.progress.update(len(self.state.ready), self.state.total)

    def _finish(self) -> None:
        if self.progress is not None:
            self.progress.update(len(self.state.ready), self.state.total, force=True)
            self.progress.finish()

    def _raise_if_exited(self) -> None:
        for name in self.state.pending():
            code = self.procs[name].poll()
            if code is not None:
                raise ReadyError(name, f"{name} exited with status {code} before it was ready")


async def await_ready(
    listener: ReadyListener,
    procs: Mapping[str, subprocess.Popen[bytes]],
    timeout: float,
    *,
    serving: Callable[[str], bool] | None = None,
    progress: Progress | None = None,
    probe_interval: float = 5.0,
) -> Readiness:
    """Wait until every one of ``procs`` (already started) has sent READY=1 (``ReadyWaiter``)."""
    waiter = ReadyWaiter(listener, serving=serving, progress=progress)
    for name, proc in procs.items():
        waiter.add(name, proc)
    return await waiter.wait(timeout, probe_interval=probe_interval)

"""The processes of an ``ibacm-sim`` cluster: which of them run, and stopping them.

A node's daemon is the one ``up`` (or ``start``) recorded in ``pids.json``; failing that, the
process that holds its lock file, or one whose command line gives the node's option file after
``-O``: a daemon an operator restarted by hand. ``status`` shows such a daemon running, and
``stop``/``down`` stop it like any other.

Stopping sends SIGTERM to each process once, then waits for as long as they keep stopping: at least
``grace`` seconds plus a little per process (hundreds of daemons shutting down together share
the CPU, so the last one may need far more than ``grace``), and then until none has stopped
for ``grace`` seconds. Only then are the ones still running sent SIGKILL, through a pidfd (a
pid reused meanwhile is never hit), and a process counts as killed only if it was still
running (not a zombie) when SIGKILL went out: the count ``down`` prints is exact.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import trio

from ibacm.tools.sim_ready import Progress

PER_PROCESS_WAIT = 0.1
"""Seconds added to the wait for each process stopped together (shared CPU at shutdown):
80 daemons sharing 2 busy cores took 3.2 s to stop, 0.04 s each."""

_POLL = 0.05
_KILL_WAIT = 5.0
"""Seconds to wait for SIGKILLed processes to disappear."""


def cmdline(pid: int) -> list[str] | None:
    """The arguments of ``pid``, None if it is gone or unreadable."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    # Each argument ends with a NUL, unless the process rewrote its command line.
    return raw.decode(errors="replace").rstrip("\0").split("\0") if raw else []


def joined(argv: Iterable[str]) -> str:
    """The command line as markers are matched against it."""
    # Every argument followed by a space: a marker "--sim-node node1 " never matches node10.
    return "".join(f"{arg} " for arg in argv)


def running(pid: int | None) -> bool:
    """``pid`` exists and is not a zombie."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X")


def alive(pid: int | None, marker: str | None = None) -> bool:
    """``pid`` runs (not a zombie) and, if ``marker`` is given, has it in its command line."""
    if not running(pid):
        return False
    if marker is None:
        return True
    assert pid is not None
    argv = cmdline(pid)
    return argv is not None and marker in joined(argv)


def names_option_file(argv: list[str], opts: Path) -> bool:
    """``argv`` gives ``opts`` as its option file (``-O FILE`` or ``-OFILE``)."""
    path = str(opts)
    return any(
        (arg == "-O" and nxt == path) or arg == f"-O{path}"
        for arg, nxt in zip(argv, [*argv[1:], ""], strict=True)
    )


def lock_holder(lock_file: Path) -> int | None:
    """The running process that holds the POSIX lock on ``lock_file`` (ibacm's pid file,
    ``lockf``'d by ours and by rdma-core's), from /proc/locks: the pid written in a stale
    file may have been reused by anything."""
    try:
        st = lock_file.stat()
        table = Path("/proc/locks").read_text()
    except OSError:
        return None
    wanted = (os.major(st.st_dev), os.minor(st.st_dev), st.st_ino)
    for line in table.splitlines():
        # "1: POSIX  ADVISORY  WRITE 1234 fe:00:5678 0 EOF"; a blocked waiter has "->" after
        # the number.
        fields = line.split()
        if len(fields) < 6 or fields[1] != "POSIX":
            continue
        try:
            major, minor, inode = fields[5].split(":")
            where = (int(major, 16), int(minor, 16), int(inode))
            pid = int(fields[4])
        except ValueError:
            continue
        if where == wanted and running(pid):
            return pid
    return None


def dir_marker(node_dir: Path) -> str:
    return f"{node_dir}/"


def scan(match: Callable[[list[str]], str | None]) -> dict[int, str]:
    """Every running process (not this one or its parent) whose arguments ``match`` names."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (os.getpid(), os.getppid()):
            continue
        argv = cmdline(int(entry.name))
        if not argv:
            continue
        name = match(argv)
        if name is not None and running(int(entry.name)):
            found[int(entry.name)] = name
    return found


def _signal(pid: int, sig: signal.Signals) -> None:
    """Signal ``pid`` once: its whole group if it leads one (``up`` starts each process in a
    session of its own, so a --daemon-cmd wrapper takes the real daemon with it).

    Once only: a daemon that gets a second SIGTERM after it closed its signal handling (late
    in its shutdown) dies of it, before its last log line.
    """
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if os.getpgid(pid) == pid:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def _kill(pid: int, marker: str) -> bool:
    """SIGKILL ``pid`` if it still runs; True if it did (so this ended it)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False  # gone (reaped) already
    try:
        # The pidfd pins this process: the checks and the signal are about the same one.
        if not alive(pid, marker):
            return False
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:  # what it started goes with it
                os.killpg(pid, signal.SIGKILL)
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True
    finally:
        os.close(pidfd)


async def stop(
    procs: Mapping[int, str],
    *,
    grace: float,
    progress: Progress | None = None,
    per_process: float = PER_PROCESS_WAIT,
) -> list[int]:
    """SIGTERM every process (pid -> marker), wait while they stop, SIGKILL the rest.

    Returns the pids SIGKILL ended (those still running when it went out).
    """
    pending = {pid: marker for pid, marker in procs.items() if alive(pid, marker)}
    total = len(procs)
    if not total:
        progress = None
    for pid in pending:
        _signal(pid, signal.SIGTERM)
    start = last_exit = trio.current_time()
    allowance = grace + per_process * len(pending)
    while pending:
        if progress is not None:
            progress.update(total - len(pending), total)
        now = trio.current_time()
        if now - start >= allowance and now - last_exit >= grace:
            break
        await trio.sleep(_POLL)
        before = len(pending)
        pending = {pid: marker for pid, marker in pending.items() if alive(pid, marker)}
        if len(pending) < before:
            last_exit = trio.current_time()
    killed = [pid for pid, marker in pending.items() if _kill(pid, marker)]
    with trio.move_on_after(_KILL_WAIT):
        while any(alive(pid, pending[pid]) for pid in killed):
            await trio.sleep(_POLL)
    if progress is not None:
        progress.update(total, total, force=True)
        progress.finish()
    return killed

"""``ibacm-sim up`` readiness: many real notifiers at once, the culprit of a timeout, progress."""

from __future__ import annotations

import contextlib
import fcntl
import io
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from ibacm.tools.sim_ready import (
    LINE_INTERVAL,
    Progress,
    Readiness,
    ReadyError,
    ReadyListener,
    ReadyWaiter,
    await_ready,
    parse_notify,
)

# A sender as the daemon sends (ibacm.sd_notify.Notifier): one READY=1 datagram, retried on
# a full queue (EAGAIN) with growing pauses for at most argv[4] s (the daemon: 5), then dropped
# (exit 7). It starts when the test unlocks the file given as argv[1] (it waits for a shared
# lock): all at once. argv[2]: "ready" (notify, then wait to be killed), "silent" (mark argv[3]
# as serving, never notify), "hang" (neither), "fail" (exit 3).
SENDER = r"""
import fcntl, os, socket, sys, time
fcntl.flock(open(sys.argv[1]), fcntl.LOCK_SH)
mode = sys.argv[2]
if mode == "fail":
    sys.exit(3)
if mode == "silent":
    open(sys.argv[3], "w").close()
if mode == "ready":
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.setblocking(False)
    address = "\0" + os.environ["NOTIFY_SOCKET"][1:]
    deadline, pause = time.monotonic() + float(sys.argv[4]), 0.01
    while True:
        try:
            s.sendto(b"READY=1\nSTATUS=serving (sender)", address)
            break
        except BlockingIOError:
            if time.monotonic() + pause > deadline:
                sys.exit(7)
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
time.sleep(120)
"""


class Senders:
    """Real processes notifying one listener, released together by a file lock."""

    def __init__(self, tmp: Path, listener: ReadyListener, *, give_up: float = 5.0) -> None:
        self.gate = tmp / "start"
        self.gate.touch()
        self.give_up = give_up
        self._lock = open(self.gate)  # noqa: SIM115 - held until release()
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.tmp = tmp
        self.env = dict(os.environ, NOTIFY_SOCKET=listener.name)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def add(
        self, name: str, mode: str = "ready", *, wrapped: bool = False
    ) -> subprocess.Popen[bytes]:
        argv = [sys.executable, "-S", "-c", SENDER, str(self.gate), mode]
        argv += [str(self.serving(name)), str(self.give_up)]
        if wrapped:  # the notifier is a child of the started process (as under unshare + sh)
            argv = ["/bin/sh", "-c", '"$@"; exit $?', "wrapper", *argv]
        # A session of its own: stop() ends a wrapped sender's child with it.
        self.procs[name] = subprocess.Popen(
            argv, env=self.env, stdout=subprocess.DEVNULL, start_new_session=True
        )
        return self.procs[name]

    def serving(self, name: str) -> Path:
        return self.tmp / f"{name}.serving"

    def open_gate(self) -> None:
        """Let every sender go as soon as it starts."""
        self._lock.close()

    async def release(self) -> None:
        """Once every sender waits for the lock (as /proc/locks shows), let them all go."""
        inode = f":{os.stat(self.gate).st_ino} "
        with trio.fail_after(60):
            while True:
                locks = Path("/proc/locks").read_text().splitlines()
                waiting = [line for line in locks if "->" in line and inode in line]
                if len(waiting) >= len(self.procs):
                    break
                await trio.sleep(0.05)
        self._lock.close()

    def stop(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in self.procs.values():
            proc.wait()
        self._lock.close()


@pytest.fixture
def listener() -> Iterator[ReadyListener]:
    sock = ReadyListener()
    sock.bind()
    yield sock
    sock.close()


def test_a_sender_is_matched_by_pid_and_its_ancestry_is_walked_once() -> None:
    parents = {1001: 100, 1002: 1001, 2001: 200, 9000: 1}
    calls: list[int] = []

    def parent_of(pid: int) -> int | None:
        calls.append(pid)
        return parents.get(pid)

    state = Readiness({"node1": 100, "node2": 200}, parent_of)
    assert state.notified(200, {"READY": "1"}) == "node2" and calls == []  # no /proc for a pid
    assert state.notified(1002, {"STATUS": "starting"}) is None  # a grandchild of node1
    assert state.status == {"node1": "starting"}
    assert state.notified(1001, {"READY": "1"}) == "node1"
    assert calls == [1002, 1001]  # 1001 was settled on the first walk
    assert state.notified(9000, {"READY": "1"}) is None  # not one of ours
    assert state.pending() == [] and state.ready == {"node1": "notify", "node2": "notify"}


def test_the_ancestry_walk_stays_linear_at_500_nodes() -> None:
    started = {f"node{i}": 10_000 + i for i in range(500)}
    parents = {20_000 + i: 10_000 + i for i in range(500)}  # each notifier is a wrapper's child
    calls = 0

    def parent_of(pid: int) -> int | None:
        nonlocal calls
        calls += 1
        return parents.get(pid)

    state = Readiness(started, parent_of)
    for i in range(500):
        state.notified(20_000 + i, {"READY": "1"})
    assert len(state.ready) == 500 and calls == 500


def test_mainpid_names_the_process_the_message_is_about() -> None:
    assert parse_notify(b"READY=1\nMAINPID=42\nSTATUS=a=b", 7) == (
        42,
        {"READY": "1", "MAINPID": "42", "STATUS": "a=b"},
    )
    assert parse_notify(b"READY=1\ngarbage\nMAINPID=x", 7)[0] == 7


@pytest.mark.trio
async def test_150_notifiers_at_once_are_all_heard(tmp_path: Path, listener: ReadyListener) -> None:
    """The kernel queues 10 datagrams per socket here; a receiver that takes one per wake-up
    and walks /proc for every pending process made senders drop READY=1 (issue 21.5)."""
    senders = Senders(tmp_path, listener)
    try:
        for i in range(150):
            senders.add(f"node{i}", wrapped=i % 10 == 0)
        await senders.release()
        state = await await_ready(listener, senders.procs, 60)
        assert len(state.ready) == 150 and set(state.ready.values()) == {"notify"}
        assert state.status["node10"] == "serving (sender)"  # a wrapped one
        assert [n for n, p in senders.procs.items() if p.poll() is not None] == []  # none dropped
    finally:
        senders.stop()


@pytest.mark.trio
async def test_notifiers_are_heard_while_the_others_are_still_being_started(
    tmp_path: Path, listener: ReadyListener
) -> None:
    """Each sender notifies as soon as it starts and gives up after 0.3 s, while starting all
    of them takes longer: the queue must be emptied between two starts (at 500 nodes ``up``
    spent long enough starting daemons that 320 of them dropped READY=1)."""
    senders = Senders(tmp_path, listener, give_up=0.3)
    senders.open_gate()
    waiter = ReadyWaiter(listener)
    try:
        for i in range(120):
            waiter.add(f"node{i}", senders.add(f"node{i}"))
            time.sleep(0.01)  # a start takes this long on a loaded machine (blocking, like fork)
        state = await waiter.wait(60)
        assert len(state.ready) == 120
        assert [n for n, p in senders.procs.items() if p.poll() is not None] == []
    finally:
        senders.stop()


@pytest.mark.trio
async def test_the_timeout_names_a_process_that_is_really_not_ready(
    tmp_path: Path, listener: ReadyListener
) -> None:
    senders = Senders(tmp_path, listener)
    try:
        senders.add("node1")
        senders.add("node2", "silent")  # serves, but its READY=1 was lost
        senders.add("node3", "hang")
        senders.add("node4", "silent")
        await senders.release()
        with pytest.raises(ReadyError) as caught:
            await await_ready(
                listener, senders.procs, 3, serving=lambda name: senders.serving(name).exists()
            )
        assert caught.value.name == "node3"
        assert str(caught.value).startswith("1 process(es) not ready after 3 s, first node3")
        # The serving ones count as ready at the next probe, long before the timeout.
        silent = {name: senders.procs[name] for name in ("node2", "node4")}
        with trio.fail_after(20):
            state = await await_ready(
                listener,
                silent,
                60,
                serving=lambda name: senders.serving(name).exists(),
                probe_interval=0.2,
            )
        assert state.ready == {"node2": "serving", "node4": "serving"}
    finally:
        senders.stop()


@pytest.mark.trio
async def test_a_process_that_exits_is_named_at_once(
    tmp_path: Path, listener: ReadyListener
) -> None:
    senders = Senders(tmp_path, listener)
    try:
        senders.add("node1", "hang")
        senders.add("node2", "fail")
        await senders.release()
        with trio.fail_after(20):  # long before the 60 s timeout
            with pytest.raises(ReadyError, match="node2 exited with status 3 before it was ready"):
                await await_ready(listener, senders.procs, 60)
    finally:
        senders.stop()


def _read_line(fd: int) -> str:
    """What a terminal shows up to its first newline (a pty may hand it over in pieces)."""
    shown = b""
    while not shown.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], 10)
        assert ready, f"the terminal stopped at {shown!r}"
        shown += os.read(fd, 4096)
    return shown.decode()


@pytest.mark.trio
async def test_progress_counts_on_a_terminal_only() -> None:
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as tty:
        progress = Progress(tty, "nodes", interval=0)
        for done in range(4):
            progress.update(done, 3)
        progress.finish()
        shown = _read_line(master)
    os.close(master)
    assert "ibacm-sim: nodes 0/3 ready" in shown and shown.rstrip().endswith("nodes 3/3 ready")
    assert shown.endswith("\n")
    plain = io.StringIO()
    quiet = Progress(plain, "nodes")
    quiet.update(1, 3)
    quiet.finish()
    assert plain.getvalue() == ""


def test_a_message_before_its_process_is_named_still_counts() -> None:
    """Processes started together may notify before ``up`` has named them all: a message
    from a stranger so far must count once its process (or its parent) is named."""
    state = Readiness({"node1": 100}, {301: 300}.get)
    state.notified(200, {"READY": "1", "STATUS": "early"})  # node2, not named yet
    state.notified(301, {"READY": "1"})  # a child of node3, not named yet
    state.notified(9000, {"READY": "1"})  # a stranger for good
    assert state.ready == {}
    state.add("node2", 200)
    assert state.ready == {"node2": "notify"} and state.status["node2"] == "early"
    state.add("node3", 300)
    assert state.ready == {"node2": "notify", "node3": "notify"}
    assert state.pending() == ["node1"]


@pytest.mark.trio
async def test_progress_prints_a_line_every_few_seconds_without_a_terminal(
    mock_clock: trio.testing.MockClock,
) -> None:
    """In a log or a pipe: nothing for a quick run, else a line every LINE_INTERVAL seconds
    (changed or not: it shows the wait goes on) and the final count."""
    quick = io.StringIO()
    progress = Progress(quick, "nodes", verb="stopped")
    for done in range(4):
        progress.update(done, 3)
        mock_clock.jump(0.5)
    progress.update(3, 3, force=True)
    progress.finish()
    assert quick.getvalue() == ""

    slow = io.StringIO()
    progress = Progress(slow, "nodes")
    progress.update(0, 4)
    for done in (1, 1, 1, 3):
        mock_clock.jump(LINE_INTERVAL / 2)
        progress.update(done, 4)
    progress.update(4, 4, force=True)
    progress.finish()
    assert slow.getvalue().splitlines() == [
        "ibacm-sim: nodes 1/4 ready",
        "ibacm-sim: nodes 3/4 ready",
        "ibacm-sim: nodes 4/4 ready",
    ]

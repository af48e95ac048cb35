"""``ibacm-sim up`` readiness: many real notifiers at once, the culprit of a timeout, progress."""

from __future__ import annotations

import fcntl
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from ibacm.tools.sim_ready import (
    Progress,
    Readiness,
    ReadyError,
    ReadyListener,
    await_ready,
    parse_notify,
)

# A sender as the daemon sends (ibacm.core.systemd.Notifier): one READY=1 datagram, retried on
# a full queue (EAGAIN) with growing pauses for at most 5 s, then dropped (exit 7). It starts
# when the test unlocks the file given as argv[1] (it waits for a shared lock): all at once.
# argv[2]: "ready" (notify, then wait for SIGTERM), "silent" (mark argv[3] as serving, never
# notify), "hang" (neither), "fail" (exit 3).
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
    deadline, pause = time.monotonic() + 5.0, 0.01
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

    def __init__(self, tmp: Path, listener: ReadyListener) -> None:
        self.gate = tmp / "start"
        self.gate.touch()
        self._lock = open(self.gate)  # noqa: SIM115 - held until release()
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        self.tmp = tmp
        self.env = dict(os.environ, NOTIFY_SOCKET=listener.name)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def add(self, name: str, mode: str = "ready", *, wrapped: bool = False) -> None:
        argv = [sys.executable, "-S", "-c", SENDER, str(self.gate), mode, str(self.serving(name))]
        if wrapped:  # the notifier is a child of the started process (as under unshare + sh)
            argv = ["/bin/sh", "-c", '"$@"; exit $?', "wrapper", *argv]
        self.procs[name] = subprocess.Popen(argv, env=self.env, stdout=subprocess.DEVNULL)

    def serving(self, name: str) -> Path:
        return self.tmp / f"{name}.serving"

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
            proc.kill()
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
        # Without a stuck one, the serving ones count as ready.
        silent = {name: senders.procs[name] for name in ("node2", "node4")}
        state = await await_ready(
            listener, silent, 1, serving=lambda name: senders.serving(name).exists()
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


@pytest.mark.trio
async def test_progress_counts_on_a_terminal_only() -> None:
    master, slave = os.openpty()
    with os.fdopen(slave, "w") as tty:
        progress = Progress(tty, "nodes", interval=0)
        for done in range(4):
            progress.update(done, 3)
        progress.finish()
        shown = os.read(master, 4096).decode()
    os.close(master)
    assert "ibacm-sim: nodes 0/3 ready" in shown and shown.rstrip().endswith("nodes 3/3 ready")
    assert shown.endswith("\n")
    plain = io.StringIO()
    quiet = Progress(plain, "nodes")
    quiet.update(1, 3)
    quiet.finish()
    assert plain.getvalue() == ""

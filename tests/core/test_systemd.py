"""sd_notify and the socket-activation environment (the full --systemd run is in test_cli)."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path

import pytest
import trio
import trio.testing

from ibacm.core import systemd
from ibacm.core.systemd import (
    InheritedSockets,
    Notifier,
    SocketActivationError,
    notify_address,
    take_listen_fds,
)


def test_notify_address_forms() -> None:
    assert notify_address({}) is None
    assert notify_address({"NOTIFY_SOCKET": "/run/systemd/notify"}) == "/run/systemd/notify"
    assert notify_address({"NOTIFY_SOCKET": "@sd-abc"}) == b"\0sd-abc"
    assert notify_address({"NOTIFY_SOCKET": "vsock:2:1234"}) is None


@pytest.mark.trio
@pytest.mark.parametrize("abstract", [False, True])
async def test_notifier_sends_one_datagram(tmp_path: Path, abstract: bool) -> None:
    receiver = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"@ibacm-test-{os.getpid()}-{id(receiver)}" if abstract else str(tmp_path / "notify")
    with receiver:
        await receiver.bind(b"\0" + name[1:].encode() if abstract else name)
        notifier = Notifier.from_environment({"NOTIFY_SOCKET": name})
        assert notifier.enabled
        assert await notifier.ready("serving /run/ibacm-unix.sock")
        message = (await receiver.recv(4096)).decode()
        lines = message.split("\n")
        assert lines[0] == "READY=1"
        assert "STATUS=serving /run/ibacm-unix.sock" in lines
        assert f"MAINPID={os.getpid()}" in lines
        assert await notifier.stopping()
        assert (await receiver.recv(4096)).decode().startswith("STOPPING=1\n")


@pytest.mark.trio
async def test_notifier_without_a_manager() -> None:
    assert not await Notifier(None).ready("x")
    # A socket nobody listens on: the daemon carries on.
    assert not await Notifier("/nonexistent/notify").ready("x")


def test_no_activation() -> None:
    env = {"PATH": "/bin"}
    assert take_listen_fds(env, pid=1) == InheritedSockets()


def test_activation_meant_for_another_process() -> None:
    env = {"LISTEN_PID": "1", "LISTEN_FDS": "1"}
    assert take_listen_fds(env, pid=2).stream is None
    assert "LISTEN_FDS" not in env  # not inherited further


@pytest.mark.parametrize(
    ("fds", "message"),
    [("3", "at most one listening stream socket"), ("x", "not numbers"), ("-1", "negative")],
)
def test_activation_errors(fds: str, message: str) -> None:
    with pytest.raises(SocketActivationError, match=message):
        take_listen_fds({"LISTEN_PID": "7", "LISTEN_FDS": fds}, pid=7)


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


@pytest.mark.trio
async def test_a_full_manager_queue_is_waited_out_without_spinning(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """EAGAIN from a full notify queue: growing pauses for a bounded time, then one drop.
    (An unconnected datagram socket always looks writable: waiting for that spun a CPU.)"""
    name = b"\0ibacm-test-full-" + os.urandom(6).hex().encode()
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(name)
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    filler.setblocking(False)
    with manager, filler:
        with contextlib.suppress(BlockingIOError):
            while True:  # fill the manager's receive queue
                filler.sendto(b"x" * 512, name)
        notifier = Notifier(name)
        started = trio.current_time()
        assert not await notifier.ready("up")
        assert systemd.NOTIFY_GIVE_UP - 1 <= trio.current_time() - started <= systemd.NOTIFY_GIVE_UP
        assert notifier.attempts <= 20  # pauses, not a busy loop
        # Room again: the next message goes through at once.
        while True:
            try:
                manager.recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
        assert await notifier.status("still here")

"""sd_notify and the socket-activation environment (the full --systemd run is in test_cli)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import trio

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

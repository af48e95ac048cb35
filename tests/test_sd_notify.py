"""The sd_notify client: datagrams to the service manager, a full queue, state messages."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from pathlib import Path

import pytest
import structlog
import trio
import trio.testing

from ibacm import sd_notify
from ibacm.sd_notify import Notifier, notify_address


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
        assert (
            sd_notify.NOTIFY_GIVE_UP - 1
            <= trio.current_time() - started
            <= sd_notify.NOTIFY_GIVE_UP
        )
        assert notifier.attempts <= 20  # pauses, not a busy loop
        # Room again: the next message goes through at once.
        while True:
            try:
                manager.recv(4096, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
        assert await notifier.status("still here")


def _fill(name: bytes) -> socket.socket:
    """A socket that has filled the manager's receive queue (its owner closes it)."""
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    filler.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:
            filler.sendto(b"x" * 512, name)
    return filler


async def _messages_until(manager: trio.socket.SocketType, key: str) -> list[str]:
    """Every datagram (filler ones skipped) up to the first that has ``key``."""
    seen = []
    while True:
        data = await manager.recv(4096)
        if data.startswith(b"x"):
            continue
        seen.append(data.decode())
        if key in seen[-1].split("\n"):
            return seen


@pytest.mark.trio
async def test_a_ready_that_found_the_queue_full_is_retried_until_delivered(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Given up after NOTIFY_GIVE_UP seconds, READY=1 is not lost: systemd would otherwise
    keep the unit "activating" and kill a daemon that serves."""
    name = b"\0ibacm-test-ready-" + os.urandom(6).hex().encode()
    manager = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await manager.bind(name)
    with manager, _fill(name), structlog.testing.capture_logs() as logs:
        notifier = Notifier(name)
        async with trio.open_nursery() as nursery:
            await nursery.start(notifier.run)
            notifier.announce(ready="1", status="serving")
            await trio.sleep(30)  # a manager busy for a minute
            before = notifier.attempts
            await trio.sleep(30)
            # Pauses grown to RETRY_PAUSE_MAX, not a busy loop.
            assert 1 <= notifier.attempts - before <= 30 / sd_notify.RETRY_PAUSE_MAX + 1
            started = trio.current_time()
            messages = await _messages_until(manager, "READY=1")
            assert trio.current_time() - started <= sd_notify.RETRY_PAUSE_MAX
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
    assert messages == ["READY=1\nSTATUS=serving"]
    events = [entry["event"] for entry in logs]
    assert events.count("sd_notify: the service manager's queue stays full; still trying") == 1
    assert "sd_notify delivered" in events


@pytest.mark.trio
async def test_state_messages_go_in_order_and_stopping_drops_the_rest(
    autojump_clock: trio.testing.MockClock,
) -> None:
    name = b"\0ibacm-test-order-" + os.urandom(6).hex().encode()
    manager = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await manager.bind(name)
    with manager:
        notifier = Notifier(name)
        async with trio.open_nursery() as nursery:
            await nursery.start(notifier.run)
            with _fill(name):
                notifier.announce(ready="1", status="serving")
                notifier.reloading("reloading")
                notifier.reloaded("serving again")
                await trio.sleep(10)
                # Room again: all three, in the order they were announced.
                first = await _messages_until(manager, "READY=1")
                reload = await _messages_until(manager, "READY=1")
            assert [m.split("\n")[0] for m in first + reload] == [
                "READY=1",
                "RELOADING=1",
                "READY=1",
            ]
            # Full again: what is still queued when stopping starts is never sent.
            with _fill(name):
                notifier.reloading("reloading")
                notifier.reloaded("serving")
                await trio.sleep(1)
                async with trio.open_nursery() as stopping:
                    stopping.start_soon(notifier.stopping)
                    await trio.sleep(2)
                    tail = await _messages_until(manager, "STOPPING=1")
            assert [m.split("\n")[0] for m in tail] == ["STOPPING=1"]
            notifier.announce(ready="1")  # after STOPPING=1: ignored
            with trio.move_on_after(30):
                late = await manager.recv(4096)
                raise AssertionError(f"sent after STOPPING=1: {late!r}")
            nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_reloading_carries_the_monotonic_time_systemd_compares() -> None:
    """Type=notify-reload (systemd 253+) takes RELOADING=1 as the answer to its SIGHUP only
    with a MONOTONIC_USEC= (CLOCK_MONOTONIC, microseconds) no older than the signal."""
    name = b"\0ibacm-test-reload-" + os.urandom(6).hex().encode()
    manager = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await manager.bind(name)
    with manager:
        notifier = Notifier(name)
        async with trio.open_nursery() as nursery:
            await nursery.start(notifier.run)
            before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            notifier.reloading("reloading the configuration")
            after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
            notifier.reloaded("serving")
            with trio.fail_after(10):
                reloading = (await manager.recv(4096)).decode().split("\n")
                ready = (await manager.recv(4096)).decode().split("\n")
            nursery.cancel_scope.cancel()
    assert reloading[0] == "RELOADING=1"
    fields = dict(line.split("=", 1) for line in reloading)
    assert before <= int(fields["MONOTONIC_USEC"]) <= after
    assert fields["STATUS"] == "reloading the configuration"
    assert ready == ["READY=1", "STATUS=serving"]


@pytest.mark.trio
async def test_a_manager_that_stopped_listening_gets_no_more_status(tmp_path: Path) -> None:
    """``ibacm-sim up`` listens only until every node is up; its daemons then stop STATUS=."""
    path = tmp_path / "notify"
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(str(path))
    notifier = Notifier(str(path))
    with manager:
        assert await notifier.status("serving")
        assert manager.recv(4096) == b"STATUS=serving"
    assert not notifier.gone
    assert not await notifier.status("serving, later")  # the socket file is left: refused
    assert notifier.gone
    attempts = notifier.attempts
    assert not await notifier.status("serving, even later")
    assert notifier.attempts == attempts  # not even tried

"""The daemon as systemd sees it: STATUS= while it serves, RELOADING=1/READY=1 around a
SIGHUP reload, and a READY=1 that found the manager's queue full. A real datagram socket
plays systemd's NOTIFY_SOCKET; daemons run on the simulated fabric (in this process for
STATUS=, as ``ibacm`` processes for the signals)."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from ibacm.core import daemon as daemon_module
from ibacm.sd_notify import NOTIFY_GIVE_UP, RETRY_PAUSE_MAX, Notifier
from ibacm.tools.workload import receive_reply, resolve_request
from ibacm.wire.client import AcmHdr, AcmStatus
from tests.core.support import cluster
from tests.core.test_cli import (
    IBACM,
    Sim,
    env_with,
    ep_config,
    notified,
    sim_args,
    simulated,
    write_opts,
)

# A look every STATUS_INTERVAL seconds, plus room for a loaded machine.
STATUS_WAIT = daemon_module.STATUS_INTERVAL * 3


async def status_matching(
    receiver: trio.socket.SocketType, pattern: str, seen: list[str] | None = None
) -> str:
    """The STATUS= of the first datagram whose STATUS= matches ``pattern`` (each STATUS= on
    the way is added to ``seen``)."""
    with trio.fail_after(STATUS_WAIT):
        while True:
            lines = (await receiver.recv(4096)).decode().split("\n")
            for line in lines:
                if line.startswith("STATUS="):
                    if seen is not None:
                        seen.append(line.removeprefix("STATUS="))
                    if re.search(pattern, line):
                        return line.removeprefix("STATUS=")


@pytest.mark.trio
async def test_status_tells_endpoints_cache_entries_and_clients(tmp_path: Path) -> None:
    name = f"@ibacm-test-status-{os.getpid()}-{id(tmp_path)}"
    receiver = trio.socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    await receiver.bind(b"\0" + name[1:].encode())

    def node1_notifies(node: str) -> dict[str, object]:
        notifier = Notifier.from_environment({"NOTIFY_SOCKET": name})
        return {"kernel_service": False, **({"notifier": notifier} if node == "node1" else {})}

    with receiver:
        async with cluster(tmp_path, nodes=2, daemon_args=node1_notifies) as run:
            ready = (await receiver.recv(4096)).decode().split("\n")
            assert ready[0] == "READY=1"
            status = next(line for line in ready if line.startswith("STATUS="))
            seen = [status.removeprefix("STATUS=")]
            assert re.fullmatch(
                r"STATUS=serving: [01]/1 endpoint ready, \d+ cache entr(y|ies), 0 clients", status
            )
            if "0/1" in status:  # the group join makes the endpoint ready
                await status_matching(receiver, r"1/1 endpoint ready", seen)
            # A port going down and up again: told at once, not at the next look.
            run.world.set_port_state("node1", "mlx5_0", 1, False)
            await status_matching(receiver, r"serving: 0/0 endpoints ready", seen)
            run.world.set_port_state("node1", "mlx5_0", 1, True)
            await status_matching(receiver, r"serving: 1/1 endpoint ready")
            stream = await trio.open_unix_socket(run.socket("node1"))
            async with stream:
                with trio.fail_after(30):
                    await stream.send_all(resolve_request("node1", "node2", nodelay=False))
                    reply = AcmHdr.decode(await receive_reply(stream))
                assert reply.status == AcmStatus.SUCCESS
                entries = run.daemons["node1"].snapshot()["endpoints"][0]["cache_entries"]
                assert entries >= 1
                line = await status_matching(receiver, r", 1 client$", seen)
                assert line == (
                    f"serving: 1/1 endpoint ready, {entries} cache "
                    f"entr{'y' if entries == 1 else 'ies'}, 1 client"
                )
            await status_matching(receiver, r", 0 clients$", seen)
    # Told when it changed, not again and again.
    assert all(before != after for before, after in itertools.pairwise(seen)), seen


def fill(name: str) -> socket.socket:
    """A socket that has filled the receive queue of the abstract socket ``name``."""
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    filler.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:
            filler.sendto(b"x" * 512, b"\0" + name[1:].encode())
    return filler


async def state_messages(sim: Sim, count: int) -> list[dict[str, str]]:
    """The next ``count`` datagrams that are not only a STATUS= (nor filler), as fields."""
    found: list[dict[str, str]] = []
    with trio.fail_after(30):
        while len(found) < count:
            data = await sim.notify.recv(4096)
            if data.startswith(b"x"):
                continue
            fields = dict(line.split("=", 1) for line in data.decode().split("\n") if line)
            if set(fields) != {"STATUS"}:
                found.append(fields)
    return found


@contextlib.asynccontextmanager
async def daemon_process(sim: Sim, tmp_path: Path, opts: Path) -> AsyncIterator[trio.Process]:
    process = await trio.lowlevel.open_process(
        [*IBACM, "-P", *sim_args(sim, tmp_path, opts)],
        env=env_with(sim),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        yield process
        process.send_signal(signal.SIGTERM)
        with trio.fail_after(15):
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


@pytest.mark.trio
async def test_a_sighup_reload_is_reloading_then_ready(tmp_path: Path) -> None:
    """What ``Type=notify-reload`` waits for after its SIGHUP; a refused reload ends in
    READY=1 too (the running configuration serves), its STATUS= says why."""
    opts = write_opts(tmp_path)
    good = opts.read_text()
    (tmp_path / "ibacm_addr.cfg").write_text("node1 mlx5_0 1 default\n")
    async with simulated(tmp_path) as sim, daemon_process(sim, tmp_path, opts) as process:
        await notified(sim, "READY=1")
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        process.send_signal(signal.SIGHUP)
        reloading, ready = await state_messages(sim, 2)
        assert next(iter(reloading)) == "RELOADING" and reloading["RELOADING"] == "1"
        assert "READY" not in reloading
        assert before <= int(reloading["MONOTONIC_USEC"])
        assert int(reloading["MONOTONIC_USEC"]) <= time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        assert reloading["STATUS"] == "reloading the configuration"
        assert ready["READY"] == "1" and ready["STATUS"].startswith("serving: ")
        assert "refused" not in ready["STATUS"]

        opts.write_text(good + "timeout banana\nretries -5\n")
        process.send_signal(signal.SIGHUP)
        reloading, ready = await state_messages(sim, 2)
        assert (reloading["RELOADING"], ready["READY"]) == ("1", "1")
        assert ready["STATUS"].endswith("; last reload refused (2 invalid settings)")
        # The next looks do not tell it again: READY=1 told it.
        with trio.move_on_after(daemon_module.STATUS_INTERVAL + 1):
            while True:
                again = (await sim.notify.recv(4096)).decode()
                assert again != f"STATUS={ready['STATUS']}"
        # Until a reload is applied, the periodic STATUS= keeps saying so.
        opts.write_text(good)
        process.send_signal(signal.SIGHUP)
        reloading, ready = await state_messages(sim, 2)
        assert "refused" not in ready["STATUS"]


@pytest.mark.trio
async def test_a_ready_that_found_the_queue_full_is_delivered_once_there_is_room(
    tmp_path: Path,
) -> None:
    """systemd would keep the unit "activating" and kill it at TimeoutStartSec= had the
    daemon given READY=1 up after NOTIFY_GIVE_UP seconds of a full queue."""
    opts = write_opts(tmp_path)
    (tmp_path / "ibacm_addr.cfg").write_text("node1 mlx5_0 1 default\n")
    log = tmp_path / "ibacm.log"
    async with simulated(tmp_path) as sim:
        with fill(sim.notify_name):
            async with daemon_process(sim, tmp_path, opts):
                started = trio.current_time()
                with trio.fail_after(30):
                    while not (tmp_path / "run" / "ibacm-unix.sock").exists():
                        await trio.sleep(0.05)
                    await ep_config(str(tmp_path / "run" / "ibacm-unix.sock"))  # it serves
                    while "still trying" not in (log.read_text() if log.exists() else ""):
                        await trio.sleep(0.1)
                assert trio.current_time() - started >= NOTIFY_GIVE_UP - 1
                # Room again: READY=1 comes within one retry pause.
                with trio.fail_after(RETRY_PAUSE_MAX + 5):
                    (ready,) = await state_messages(sim, 1)
                assert ready["READY"] == "1" and ready["MAINPID"].isdigit()
                with trio.fail_after(10):
                    while '"sd_notify delivered"' not in log.read_text():
                        await trio.sleep(0.1)

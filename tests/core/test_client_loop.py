"""The client loop's thread against the trio side changing what it reads.

A client process pipelines RESOLVEs at node1 (hits, answered in the loop's thread from the
route tables) while the test, on the trio side, flushes the cache, adds and removes node1's
addresses, moves the SM and drops routes: every reply must still be the right one (in order,
the asked destination's path), and nothing may fail in the daemon.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import socket
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import structlog
import trio

from ibacm.core.client_loop import ClientLimits, ClientLoop, Note, NoteKind
from ibacm.core.hits import HitPath
from ibacm.provider.acmp.provider import AcmpProvider
from ibacm.wire.client import AcmHdr, AcmMessage, AcmOp, AcmStatus, EpAddr, EpFlag
from tests.core.support import AcmClient
from tests.reliability.live import live_cluster

HITS = 1_000_000
"""Hits the thread serves while the trio side changes what it reads."""


@pytest.mark.trio
async def test_the_loop_serves_right_answers_while_trio_changes_its_tables(
    tmp_path: Path,
) -> None:
    rng = random.Random(28)
    async with live_cluster(tmp_path, 4) as cluster:
        node1 = cluster["node1"]
        daemon = node1.daemon
        provider = daemon.providers.get("ibacmp")
        assert isinstance(provider, AcmpProvider)
        endpoint = node1.endpoints()[0]
        world = cluster.world
        peers = ("node2", "node3", "node4")
        dests = [f"{name}={world.node(name).gids[0].hex()}" for name in peers]
        client = await trio.lowlevel.open_process(
            [
                sys.executable,
                "-m",
                "tests.core.pipelined_client",
                node1.socket_path,
                "node1",
                *dests,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert client.stdin is not None and client.stdout is not None
        changes = 0
        with structlog.testing.capture_logs() as logs:
            with trio.fail_after(600):
                while daemon.clients.hits < HITS:
                    await trio.sleep(rng.uniform(0.002, 0.05))
                    change = changes % 5
                    if change == 0:
                        provider.flush(endpoint)  # every learned entry goes
                    elif change == 1:
                        world.add_address("node1", "ib0", f"10.77.{changes % 250}.1")
                    elif change == 2:
                        world.remove_address("node1", f"10.77.{(changes - 1) % 250}.1")
                    elif change == 3:
                        endpoint.invalidate_routes()  # READY entries back to ADDR_RESOLVED
                    else:
                        world.move_sm(f"node{2 + changes % 3}")
                    changes += 1
            await client.stdin.send_all(b"stop\n")
            with trio.fail_after(60):
                out = b""
                while not out.endswith(b"\n"):
                    chunk = await client.stdout.receive_some()
                    if not chunk:
                        break
                    out += chunk
            await client.wait()
        result = json.loads(out)
        assert result["wrong"] == []
        assert result["answered"] >= HITS
        statuses = {int(status): count for status, count in result["statuses"].items()}
        # A flush or an SM move may cost a request ENODATA; never a wrong path.
        assert statuses.get(0, 0) >= 0.95 * result["answered"], statuses
        assert changes >= 20
        failures = [entry for entry in logs if entry["log_level"] in ("error", "critical")]
        assert failures == []
        assert daemon.clients.stats.dropped == 0


@pytest.mark.trio
async def test_out_of_descriptors_the_listener_rests_instead_of_spinning(tmp_path: Path) -> None:
    """accept() failing with EMFILE leaves the client in the backlog; the loop must not spin
    on the still-readable listener, and the client is served once descriptors are free."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(tmp_path / "s"))
    listener.listen(8)
    listener.setblocking(False)
    notes: list[Note] = []
    loop = ClientLoop(
        [listener],
        HitPath([], 8),
        time.monotonic,
        limits=ClientLimits(),
        capacity=100,
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(partial(trio.to_thread.run_sync, loop.run))
        try:
            await _starve_and_recover(loop, tmp_path, notes)
        finally:
            loop.stop()
    loop.close()
    loop.outbox.close()


async def _starve_and_recover(loop: ClientLoop, tmp_path: Path, notes: list[Note]) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    await trio.sleep(0.1)  # the loop's thread is running before descriptors run out
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        # No descriptor left: the limit just above the highest open one, the holes below
        # filled. The client's socket exists already; the daemon's accept needs one more.
        highest = max(int(name) for name in os.listdir("/proc/self/fd"))
        resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
        with contextlib.suppress(OSError):
            while True:
                fillers.append(os.open("/dev/null", os.O_RDONLY))
        client.connect(str(tmp_path / "s"))
        with trio.fail_after(10):
            while not loop.accept_resting:
                await trio.sleep(0.01)
        cpu = time.process_time()
        await trio.sleep(0.5)
        assert time.process_time() - cpu < 0.25  # resting, not spinning on the listener
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    loop.sweep(time.monotonic())
    with trio.fail_after(10):
        while loop.active != 1:
            await trio.sleep(0.01)
    assert not loop.accept_resting
    notes += [note for _, handed in loop.outbox.take() for note in handed]  # no trio side here
    assert any(note.kind is NoteKind.ACCEPT_FAILED for note in notes)
    client.close()


@pytest.mark.trio
async def test_only_a_resolve_is_a_hit_and_a_repeated_one_is_answered_from_the_memo(
    tmp_path: Path,
) -> None:
    """The bytes of a cached RESOLVE under another opcode are not a hit: as a PERF_QUERY
    (opcode 2, big-endian length) they get the counters, under opcode byte 0x81 the
    connection is closed as for any undecodable request. A RESOLVE asked again is answered
    from the loop's memo; after a flush it is not, and it is resolved anew."""
    async with live_cluster(tmp_path, 2) as cluster:
        node1 = cluster["node1"]
        daemon = node1.daemon
        provider = daemon.providers.get("ibacmp")
        assert isinstance(provider, AcmpProvider)
        entries = [EpAddr.from_name("node1", EpFlag.SOURCE), EpAddr.from_name("node2", EpFlag.DEST)]
        request = AcmMessage(hdr=AcmHdr(opcode=AcmOp.RESOLVE), entries=entries).encode()
        assert len(request) == 160
        client = await AcmClient.unix(node1.socket_path)
        assert AcmHdr.decode(await client.request(request)).status == AcmStatus.SUCCESS
        hits = daemon.clients.hits
        for _ in range(3):  # from the route table, then from the memo
            reply = await client.request(request)
            assert AcmHdr.decode(reply).status == AcmStatus.SUCCESS and len(reply) == 88
        assert daemon.clients.hits == hits + 3
        perf = bytes([1, 2, 0, 0, 0, 0, 0, 160]) + request[8:]
        reply = await client.request(perf)
        assert reply[1] == 0x82 and daemon.clients.hits == hits + 3
        provider.flush(node1.endpoints()[0])  # the route goes: the memo must not answer
        reply = await client.request(request)
        assert AcmHdr.decode(reply).status == AcmStatus.SUCCESS
        assert daemon.clients.hits == hits + 3  # resolved anew, not a hit
        assert AcmHdr.decode(await client.request(request)).status == AcmStatus.SUCCESS
        assert daemon.clients.hits == hits + 4
        await client.send(bytes([1, 0x81, 0, 0, 0, 0, 0, 160]) + request[8:])
        assert await client.closed_by_peer()
        await client.aclose()

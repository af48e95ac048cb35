"""Load on the client socket with the real provider behind it.

* 2000 clients ask at once, half for a cached peer and half for one nobody resolved yet: all
  are answered, and the 1000 that wait share one ACM resolution (one multicast request);
* hostile clients (one floods pipelined RESOLVEs and never reads, one dribbles a request a
  byte at a time, one connects and hangs up in a loop) never delay a well-behaved client
  beyond a second, and the one that never reads is dropped.
"""

from __future__ import annotations

import contextlib
import resource
from pathlib import Path

import pytest
import trio

from ibacm.core.client_loop import MAX_PENDING_REPLIES
from tests.conftest import require
from tests.reliability.errors import logged_errors
from tests.reliability.live import Client, live_cluster, resolve_frame, soak

CLIENTS = 2000
GOOD_ROUNDS = soak(200, 5000)


def acm_requests(cluster: object) -> int:
    return int(cluster.world.count(0x2C, 0x01))  # type: ignore[attr-defined]


@pytest.mark.trio
async def test_2000_concurrent_resolving_clients(tmp_path: Path) -> None:
    require(
        resource.getrlimit(resource.RLIMIT_NOFILE)[1] >= 2 * CLIENTS + 200,
        "the hard open-file limit is too low for 2000 clients in one process",
    )
    async with live_cluster(tmp_path, 3) as cluster:
        path = cluster["node1"].socket_path
        warm = await Client.connect(path)
        assert (await warm.request(resolve_frame("node1", "node2")))[2] == 0
        await warm.aclose()
        before = acm_requests(cluster)
        clients = [await Client.connect(path) for _ in range(CLIENTS)]
        replies: list[bytes] = []

        async def ask(client: Client, dest: str) -> None:
            replies.append(await client.request(resolve_frame("node1", dest)))

        with trio.fail_after(60):
            async with trio.open_nursery() as nursery:
                for index, client in enumerate(clients):
                    nursery.start_soon(ask, client, "node2" if index % 2 else "node3")
        assert len(replies) == CLIENTS
        assert all((reply[2], len(reply)) == (0, 88) for reply in replies)
        assert acm_requests(cluster) - before == 1
        assert cluster["node1"].daemon.clients.active >= CLIENTS
        for client in clients:
            await client.aclose()


@pytest.mark.trio
async def test_hostile_clients_do_not_delay_a_good_one(tmp_path: Path) -> None:
    with logged_errors() as errors:
        async with live_cluster(tmp_path, 2) as cluster:
            node = cluster["node1"]
            path = node.socket_path
            frame = resolve_frame("node1", "node2")
            good = await Client.connect(path)
            assert (await good.request(frame))[2] == 0
            flooder = await trio.open_unix_socket(path)
            dribbler = await trio.open_unix_socket(path)
            stop = trio.Event()

            async def flood() -> None:
                # Far more replies than the daemon holds for one client: it must drop us.
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    for _ in range(4 * MAX_PENDING_REPLIES):
                        await flooder.send_all(frame * 16)

            async def dribble() -> None:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    while not stop.is_set():
                        for byte in frame:
                            await dribbler.send_all(bytes([byte]))
                            await trio.sleep(0.005)

            async def churn() -> None:
                while not stop.is_set():
                    stream = await trio.open_unix_socket(path)
                    await stream.send_all(frame[:40])
                    await stream.aclose()
                    await trio.sleep(0)

            worst = 0.0
            async with trio.open_nursery() as nursery:
                nursery.start_soon(flood)
                nursery.start_soon(dribble)
                nursery.start_soon(churn)
                for _ in range(GOOD_ROUNDS):
                    started = trio.current_time()
                    with trio.fail_after(5):
                        reply = await good.request(frame)
                    worst = max(worst, trio.current_time() - started)
                    assert (reply[2], len(reply)) == (0, 88)
                stop.set()
            assert worst < 1.0, f"a good request waited {worst:.3f} s"
            # The flooder was dropped: what it did not read is followed by the end of stream.
            with trio.fail_after(30):
                while True:
                    try:
                        data = await flooder.receive_some(65536)
                    except trio.BrokenResourceError:
                        break
                    if not data:
                        break
            assert (await good.request(frame))[2] == 0
            await flooder.aclose()
            await dribbler.aclose()
            await good.aclose()
            assert node.alive
    assert [e for e in errors if "does not read" not in str(e.get("event"))] == []

"""The world carries storms: every node multicasting to every node, unicast cost flat in N."""

from __future__ import annotations

import time

import pytest
import trio

from ibacm.fabric.api import MULTICAST_QPN, AddressVector, UdQp
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.mad import McMemberRecord, SaMad, build_mc_join
from tests.fabric.helpers import ACM_MGID, NodePort, acm_join_record, open_node, running

REQUEST = bytes([1, 0x2C, 1, 1, 0, 0, 0, 1]) + bytes(248)


@pytest.mark.trio
async def test_all_to_all_multicast_storm(autojump_clock: trio.abc.Clock) -> None:
    size = 256
    world = SimWorld(generate(size))
    async with running(world):
        nodes = [await open_node(world.fabric(f"node{i}")) for i in range(1, size + 1)]
        qps = [await node.qp(recv_depth=2 * size) for node in nodes]
        mlids: set[int] = set()

        async def join(node: NodePort, qp: UdQp) -> None:
            answer = SaMad.decode(await node.sa(build_mc_join(1, acm_join_record(node.gid))))
            mlids.add(McMemberRecord.decode(answer.data[:56]).mlid)
            await qp.attach_mcast(ACM_MGID, min(mlids))

        async with trio.open_nursery() as nursery:
            for node, qp in zip(nodes, qps, strict=True):
                nursery.start_soon(join, node, qp)
        assert len(mlids) == 1
        mlid = mlids.pop()
        for qp in qps:
            await qp.send(REQUEST, AddressVector(dlid=mlid, dgid=ACM_MGID), MULTICAST_QPN)
        await trio.sleep(1)
        assert world.stats["delivered"] == size * size
        assert world.counters[(0x2C, 1, 0)] == size
        senders = {(await qps[-1].receive()).src_qp for _ in range(size)}
        assert senders == {qp.qpn for qp in qps}


async def _unicast_seconds(nodes: int, count: int) -> float:
    """Best of two batches of ``count`` unicasts across a fabric of ``nodes`` nodes."""
    world = SimWorld(generate(nodes))
    async with running(world):
        a = await open_node(world.fabric("node1"))
        b = await open_node(world.fabric(f"node{nodes}"))
        qa, qb = await a.qp(), await b.qp(recv_depth=2 * count)
        timings = []
        for _ in range(2):
            start = time.perf_counter()
            for _ in range(count):
                await qa.send(REQUEST, AddressVector(dlid=b.lid), qb.qpn)
            await trio.sleep(1)
            timings.append(time.perf_counter() - start)
        assert world.stats["delivered"] == 2 * count
    return min(timings)


@pytest.mark.trio
async def test_unicast_cost_does_not_grow_with_the_fabric(autojump_clock: trio.abc.Clock) -> None:
    small = await _unicast_seconds(64, 2000)
    large = await _unicast_seconds(4096, 2000)
    assert large < small * 4, (small, large)

"""Latency, SA service time and overload, and injected faults, observed on trio's mock clock."""

from __future__ import annotations

import pytest
import trio

from ibacm.fabric.api import AddressVector, UdQp
from ibacm.fabric.sim.faults import Faults, FaultSettingError
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.mad import SaMad, build_path_get
from ibacm.wire.path_record import PathRecord
from tests.fabric.helpers import open_node, running


def acm_mad(tag: int) -> bytes:
    return bytes([1, 0x2C, 1, 1, 0, 0, 0, 1]) + tag.to_bytes(8, "big") + bytes(240)


@pytest.mark.trio
async def test_latency_is_hops_times_link_latency_plus_delay(
    autojump_clock: trio.abc.Clock,
) -> None:
    world = SimWorld(generate(64, switches=2), link_latency=0.001)
    async with running(world):
        a, near, far = [await open_node(world.fabric(n)) for n in ("node1", "node2", "node40")]
        qa, q_near, q_far = await a.qp(), await near.qp(), await far.qp()

        async def one_way(target_qp: UdQp, dlid: int) -> float:
            start = trio.current_time()
            await qa.send(acm_mad(0), AddressVector(dlid=dlid), target_qp.qpn)
            await target_qp.receive()
            return trio.current_time() - start

        assert await one_way(q_near, near.lid) == pytest.approx(0.002)  # node-leaf-node
        assert await one_way(q_far, far.lid) == pytest.approx(0.004)  # node-leaf-spine-leaf-node
        world.faults.delay = 0.5
        assert await one_way(q_far, far.lid) == pytest.approx(0.504)


@pytest.mark.trio
async def test_sa_requests_queue_behind_the_service_time(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(4), sa_service_time=0.01, link_latency=0.0)
    async with running(world):
        nodes = [await open_node(world.fabric(f"node{i}")) for i in (1, 2, 3, 4)]
        done: list[float] = []
        start = trio.current_time()

        async def ask(i: int) -> None:
            node = nodes[i % 4]
            answer = await node.sa(build_path_get(i + 1, PathRecord(dlid=node.lid)))
            assert SaMad.decode(answer).mad.status == 0
            done.append(trio.current_time() - start)

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(ask, i)
        # One server, 10 ms each: answers come every 10 ms, the last after 200 ms.
        assert sorted(done) == pytest.approx([0.01 * (i + 1) for i in range(20)])
        assert world.stats["sa_served"] == 20


@pytest.mark.trio
async def test_an_overloaded_sa_answers_busy(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(2), sa_service_time=0.01)
    world.faults.sa_queue_limit = 5
    async with running(world):
        a = await open_node(world.fabric("node1"))
        statuses: list[int] = []

        async def ask(i: int) -> None:
            answer = await a.sa(build_path_get(i + 1, PathRecord(dlid=a.lid)), retries=0)
            statuses.append(SaMad.decode(answer).mad.status)

        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(ask, i)
        assert sorted(statuses) == [0] * 5 + [0x0001] * 15  # MAD status BUSY
        assert world.stats["sa_overload"] == 15
        world.faults.sa_busy = 1.0
        answer = await a.sa(build_path_get(99, PathRecord(dlid=a.lid)))
        assert SaMad.decode(answer).mad.status == 0x0001
        assert world.stats["sa_busy"] == 1


@pytest.mark.trio
async def test_ten_percent_loss_shows_in_counts(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(2), seed=1)
    world.faults.loss = 0.1
    async with running(world):
        a, b = await open_node(world.fabric("node1")), await open_node(world.fabric("node2"))
        qa, qb = await a.qp(), await b.qp(recv_depth=4000)
        for tag in range(2000):
            await qa.send(acm_mad(tag), AddressVector(dlid=b.lid), qb.qpn)
        await trio.sleep(1)
        assert world.counters[(0x2C, 1, 0)] == 2000  # all were sent...
        lost = world.stats["lost"]
        assert 150 < lost < 250  # ...about 10 % never arrived
        assert world.stats["delivered"] == 2000 - lost


@pytest.mark.trio
async def test_duplication_and_corruption_are_visible(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(2))
    async with running(world):
        a, b = await open_node(world.fabric("node1")), await open_node(world.fabric("node2"))
        qa, qb = await a.qp(), await b.qp()
        world.faults.duplicate = 1.0
        await qa.send(acm_mad(1), AddressVector(dlid=b.lid), qb.qpn)
        assert [(await qb.receive()).mad for _ in range(2)] == [acm_mad(1)] * 2
        world.faults.duplicate = 0.0
        world.faults.corrupt = 1.0
        await qa.send(acm_mad(2), AddressVector(dlid=b.lid), qb.qpn)
        damaged = (await qb.receive()).mad
        assert len(damaged) == 256
        assert sum(x != y for x, y in zip(damaged, acm_mad(2), strict=True)) == 1
        assert (world.stats["duplicated"], world.stats["corrupted"]) == (1, 1)


def test_fault_settings_are_checked() -> None:
    faults = Faults()
    faults.set("loss", "0.25")
    faults.set("sa_down", "on")
    assert (faults.loss, faults.sa_down) == (0.25, True)
    for name, value, message in [
        ("loss", "1.5", "probability"),
        ("delay", "-1", ">= 0"),
        ("sa_down", "maybe", "on/off"),
        ("sa_queue_limit", "0", ">= 1"),
        ("jitter", "1", "unknown fault 'jitter'"),
        ("loss", "lots", "cannot use"),
    ]:
        with pytest.raises(FaultSettingError, match=message):
            faults.set(name, value)
    with pytest.raises(FaultSettingError):
        faults.corrupt = "x"  # type: ignore[assignment]
    assert faults.loss == 0.25

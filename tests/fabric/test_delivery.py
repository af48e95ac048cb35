"""UD delivery: unicast, multicast, partitions, Q_Keys, receive queues, ports going down."""

from __future__ import annotations

from collections import Counter
from random import Random

import pytest
import trio

from ibacm.fabric.api import (
    MULTICAST_QPN,
    AddressVector,
    FabricError,
    PortDownError,
    PortEventType,
    PortState,
    ReceivedMad,
    SaSendError,
)
from ibacm.fabric.sim.delivery import Delivery, mad_key
from ibacm.fabric.sim.directory import Directory
from ibacm.fabric.sim.fabric import SimPort
from ibacm.fabric.sim.faults import FaultInjector, Faults
from ibacm.fabric.sim.multicast import GroupTable
from ibacm.fabric.sim.routing import Router
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.mad import McMemberRecord, SaMad, build_mc_join
from tests.fabric.helpers import ACM_MGID, NodePort, acm_join_record, open_node, running


def acm_mad(method: int = 0x01, tag: int = 0) -> bytes:
    """A 256-byte class 0x2C MAD; ``tag`` marks it so tests can tell MADs apart."""
    return bytes([1, 0x2C, 1, method, 0, 0, 0, 1]) + tag.to_bytes(8, "big") + bytes(240)


async def join(node: NodePort) -> McMemberRecord:
    answer = SaMad.decode(await node.sa(build_mc_join(1, acm_join_record(node.gid))))
    assert answer.mad.status == 0
    return McMemberRecord.decode(answer.data[:56])


@pytest.mark.trio
async def test_unicast_reaches_the_qp_with_grh_and_completion_fields(
    autojump_clock: trio.abc.Clock,
) -> None:
    world = SimWorld(generate(3))
    async with running(world):
        a, b = await open_node(world.fabric("node1")), await open_node(world.fabric("node2"))
        qa, qb = await a.qp(), await b.qp()
        await qa.send(acm_mad(tag=7), AddressVector(dlid=b.lid, dgid=b.gid), qb.qpn)
        got = await qb.receive()
        assert got.mad == acm_mad(tag=7)
        assert (got.sgid, got.dgid, got.slid, got.src_qp) == (a.gid, b.gid, a.lid, qa.qpn)
        assert (got.pkey_index, got.dlid_path_bits) == (0, 0)
        # Nothing else got it, and the MAD was counted once as (class 0x2C, GET, attr 0).
        with trio.move_on_after(1):
            await qa.receive()
            pytest.fail("the sender received its own unicast")
        assert world.counters[(0x2C, 0x01, 0)] == 1
        assert world.count(mgmt_class=0x2C) == 1


@pytest.mark.trio
async def test_multicast_reaches_every_attached_member_including_the_sender(
    autojump_clock: trio.abc.Clock,
) -> None:
    world = SimWorld(generate(4))
    async with running(world):
        nodes = [await open_node(world.fabric(f"node{i}")) for i in (1, 2, 3, 4)]
        qps = [await node.qp() for node in nodes]
        group = await join(nodes[0])
        await join(nodes[1])
        await join(nodes[2])  # joined but never attaches: the HCA has no QP for it
        for node_qp in qps[:2] + qps[3:]:
            await node_qp.attach_mcast(ACM_MGID, group.mlid)  # node4 attaches without joining
        await qps[0].send(
            acm_mad(tag=1), AddressVector(dlid=group.mlid, dgid=ACM_MGID), MULTICAST_QPN
        )
        for receiver in qps[:2]:
            got = await receiver.receive()
            assert (got.mad, got.dgid, got.src_qp, got.slid) == (
                acm_mad(tag=1),
                ACM_MGID,
                qps[0].qpn,
                nodes[0].lid,
            )
        for silent in qps[2:]:
            with trio.move_on_after(1):
                await silent.receive()
                pytest.fail("a port that did not join and attach got the multicast")
        assert world.stats["delivered"] == 2


@pytest.mark.trio
async def test_partitions_qkeys_and_bad_sends(autojump_clock: trio.abc.Clock) -> None:
    topology = generate(3)
    topology.host("node2").hcas[0].ports[0].pkeys = (0xFFFF, 0x8001)
    topology.host("node3").hcas[0].ports[0].pkeys = (0x0001, 0x7FFF)
    world = SimWorld(topology)
    async with running(world):
        a, b, c = [await open_node(world.fabric(f"node{i}")) for i in (1, 2, 3)]
        qa = await a.qp()
        qb_8001 = await b.port.open_ud(1, recv_depth=4)
        qc_limited = await c.port.open_ud(0, recv_depth=4)  # 0x0001: limited member of 0x8001
        qc_7fff = await c.port.open_ud(1, recv_depth=4)  # limited default partition
        assert isinstance(b.port, SimPort)
        qb_odd_qkey = await b.port.open_ud(0, recv_depth=4, qkey=0x1234)
        # 0xffff -> 0x7fff: one full member is enough.
        await qa.send(acm_mad(tag=1), AddressVector(dlid=c.lid), qc_7fff.qpn)
        assert (await qc_7fff.receive()).mad == acm_mad(tag=1)
        # 0x8001 (full) <-> 0x0001 (limited) share the partition; 0xffff does not.
        await qb_8001.send(acm_mad(tag=2), AddressVector(dlid=c.lid), qc_limited.qpn)
        assert (await qc_limited.receive()).pkey_index == 0
        await qa.send(acm_mad(tag=3), AddressVector(dlid=c.lid), qc_limited.qpn)
        await qa.send(acm_mad(tag=4), AddressVector(dlid=b.lid), qb_odd_qkey.qpn)
        await qa.send(acm_mad(tag=5), AddressVector(dlid=b.lid), 1)  # QP1: no ACM agent
        await qa.send(acm_mad(tag=6), AddressVector(dlid=0x999), qb_8001.qpn)
        await trio.sleep(1)
        assert world.stats["pkey_drop"] == 1
        assert world.stats["qkey_drop"] == 1
        assert world.stats["gsi_drop"] == 1
        assert world.stats["no_route"] == 1
        with pytest.raises(FabricError, match="256 bytes"):
            await qa.send(b"short", AddressVector(dlid=b.lid), qb_8001.qpn)
        with pytest.raises(FabricError, match="GID index 3"):
            await qa.send(acm_mad(), AddressVector(dlid=b.lid, sgid_index=3), qb_8001.qpn)
        with pytest.raises(FabricError, match="multicast DLID"):
            await qa.send(acm_mad(), AddressVector(dlid=b.lid), MULTICAST_QPN)
        with pytest.raises(FabricError, match="P_Key index 5"):
            await a.port.open_ud(5, recv_depth=4)
        with pytest.raises(FabricError, match="recv_depth"):
            await a.port.open_ud(0, recv_depth=0)


@pytest.mark.trio
async def test_full_receive_queue_drops_and_counts(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(2))
    async with running(world):
        a, b = await open_node(world.fabric("node1")), await open_node(world.fabric("node2"))
        qa, qb = await a.qp(), await b.qp(recv_depth=3)
        for tag in range(10):
            await qa.send(acm_mad(tag=tag), AddressVector(dlid=b.lid), qb.qpn)
        await trio.sleep(1)
        assert [(await qb.receive()).mad for _ in range(3)] == [acm_mad(tag=t) for t in (0, 1, 2)]
        assert world.stats["rnr_drop"] == 7
        # Closing the QP ends a pending receive with ClosedResourceError.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(qb.aclose)
            with pytest.raises(trio.ClosedResourceError):
                await qb.receive()
        with pytest.raises(FabricError, match="destroyed"):
            await qb.send(acm_mad(), AddressVector(dlid=a.lid), qa.qpn)


@pytest.mark.trio
async def test_receive_many_takes_what_is_queued_in_order(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(2))
    async with running(world):
        a, b = await open_node(world.fabric("node1")), await open_node(world.fabric("node2"))
        qa, qb = await a.qp(), await b.qp()
        for tag in range(5):
            await qa.send(acm_mad(tag=tag), AddressVector(dlid=b.lid), qb.qpn)
        await trio.sleep(1)
        assert [got.mad for got in await qb.receive_many(2)] == [acm_mad(tag=t) for t in (0, 1)]
        assert [got.mad for got in await qb.receive_many(10)] == [acm_mad(tag=t) for t in (2, 3, 4)]
        # An empty queue waits for the next MAD, then gives what is there.
        async with trio.open_nursery() as nursery:
            nursery.start_soon(qa.send, acm_mad(tag=9), AddressVector(dlid=b.lid), qb.qpn)
            assert [got.mad for got in await qb.receive_many(10)] == [acm_mad(tag=9)]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(qb.aclose)
            with pytest.raises(trio.ClosedResourceError):
                await qb.receive_many(10)


@pytest.mark.trio
async def test_down_port_cannot_send_and_receives_nothing(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(2))
    async with running(world):
        a, b = await open_node(world.fabric("node1")), await open_node(world.fabric("node2"))
        qa, qb = await a.qp(), await b.qp()
        device_b = (await b.fabric.open())[0]
        world.set_port_state("node2", "mlx5_0", 1, False)
        assert await device_b.wait_event() == await_event(1, PortEventType.PORT_ERR)
        assert (await b.port.query()).state == PortState.DOWN
        with pytest.raises(PortDownError):
            await qb.send(acm_mad(), AddressVector(dlid=a.lid), qa.qpn)
        with pytest.raises(SaSendError, match="DOWN"):
            await b.sa(bytes(256))
        await qa.send(acm_mad(tag=1), AddressVector(dlid=b.lid), qb.qpn)
        await trio.sleep(1)
        assert world.stats["port_down_drop"] == 1
        world.set_port_state("node2", "mlx5_0", 1, True)
        assert await device_b.wait_event() == await_event(1, PortEventType.PORT_ACTIVE)
        await qa.send(acm_mad(tag=2), AddressVector(dlid=b.lid), qb.qpn)
        assert (await qb.receive()).mad == acm_mad(tag=2)


def await_event(port: int, kind: PortEventType) -> object:
    from ibacm.fabric.api import PortEvent

    return PortEvent(port, kind)


@pytest.mark.trio
async def test_ports_without_a_cable_are_down_and_the_world_must_run(
    autojump_clock: trio.abc.Clock,
) -> None:
    from ibacm.fabric.sim.topo_file import parse_ibnetdiscover
    from tests.fabric.helpers import net_example

    world = SimWorld(parse_ibnetdiscover(net_example("net.2sw2path4hca")))
    node = await open_node(world.fabric("Hca1"))
    with pytest.raises(FabricError, match="not running"):
        await (await node.qp()).send(acm_mad(), AddressVector(dlid=1), 5)
    port2 = (await world.fabric("Hca1").open())[0].port(2)
    attrs = await port2.query()
    assert (attrs.state, attrs.lid, attrs.sm_lid) == (PortState.DOWN, 0, 0)
    with pytest.raises(FabricError, match="no link"):
        world.set_port_state("Hca1", "mlx5_0", 2, True)
    with pytest.raises(FabricError, match="no port 3"):
        (await world.fabric("Hca1").open())[0].port(3)
    with pytest.raises(FabricError, match="no node named"):
        world.fabric("Hca9")


class Received:
    """A QP's receive queue as the fabric sees it: it takes at most ``room`` MADs."""

    def __init__(self, room: int = 8) -> None:
        self.mads: list[tuple[float, ReceivedMad]] = []
        self.room = room

    def deliver(self, received: ReceivedMad) -> bool:
        if len(self.mads) >= self.room:
            return False
        self.mads.append((trio.current_time(), received))
        return True


def test_mad_key_names_class_method_and_attribute() -> None:
    assert mad_key(acm_mad(method=0x81)) == (0x2C, 0x81, 0)  # ACM MADs have no attribute
    assert mad_key(build_mc_join(1, acm_join_record(bytes(16)))) == (0x03, 0x02, 0x38)


@pytest.mark.trio
async def test_delivery_takes_the_hops_latency_and_counts_what_it_drops(
    autojump_clock: trio.abc.Clock,
) -> None:
    topology = generate(2)
    directory = Directory(topology, Router(topology))
    faults, stats = Faults(), Counter[str]()
    delivery = Delivery(
        directory, GroupTable(), faults, FaultInjector(faults, Random(0)), stats, link_latency=0.5
    )
    a, b = (directory.port(name, "mlx5_0", 1) for name in ("node1", "node2"))
    sink, wrong_qkey = Received(room=1), Received()
    qa = delivery.create_qp(a, 0, Received())
    qb = delivery.create_qp(b, 0, sink)
    qc = delivery.create_qp(b, 0, wrong_qkey, qkey=0x1234)
    av = AddressVector(dlid=b.lid, dgid=b.gid0)
    with pytest.raises(FabricError, match="not running"):
        delivery.ud_send(qa, acm_mad(), av, qb.qpn)
    async with trio.open_nursery() as nursery:
        await nursery.start(delivery.run)
        started = trio.current_time()
        delivery.ud_send(qa, acm_mad(tag=1), av, qb.qpn)
        delivery.ud_send(qa, acm_mad(tag=2), av, qb.qpn)  # the receive queue is full
        delivery.ud_send(qa, acm_mad(tag=3), av, qc.qpn)
        delivery.ud_send(qa, acm_mad(tag=4), av, 0x999)
        faults.loss = 1.0
        delivery.ud_send(qa, acm_mad(tag=5), av, qb.qpn)
        await trio.sleep(5)
        nursery.cancel_scope.cancel()
    hops = directory.router.path(a.guid, b.guid)
    assert hops is not None and hops.hops == 2  # HCA -> switch -> HCA
    ((arrived, got),) = sink.mads
    assert arrived - started == pytest.approx(2 * 0.5) and got.mad == acm_mad(tag=1)
    assert not wrong_qkey.mads
    assert (stats["rnr_drop"], stats["qkey_drop"], stats["no_qp"], stats["lost"]) == (1, 1, 1, 1)
    assert delivery.count(mgmt_class=0x2C) == 5  # every MAD put on the wire is counted
    delivery.destroy_qp(qb)
    assert qb.closed and qb.qpn not in b.qps

"""Fabric events: port flap, LID change, SM move, client re-register, IP address changes."""

from __future__ import annotations

import ipaddress

import pytest
import trio

from ibacm.fabric.api import (
    MULTICAST_QPN,
    AddressVector,
    Device,
    FabricError,
    PortEventType,
    SaDestination,
    SaTimeout,
)
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.mad import McMemberRecord, SaMad, build_mc_join, build_path_get
from ibacm.wire.path_record import PathRecord
from tests.fabric.helpers import ACM_MGID, acm_join_record, open_node, running

E = PortEventType


async def events(device: Device, count: int) -> list[PortEventType]:
    return [(await device.wait_event()).type for _ in range(count)]


def acm_mad() -> bytes:
    return bytes([1, 0x2C, 1, 1, 0, 0, 0, 1]) + bytes(248)


@pytest.mark.trio
async def test_port_flap_drops_memberships_and_asks_for_reregistration(
    autojump_clock: trio.abc.Clock,
) -> None:
    world = SimWorld(generate(2))
    async with running(world):
        a, b = await open_node(world.fabric("node1")), await open_node(world.fabric("node2"))
        device_b = (await b.fabric.open())[0]
        qa, qb = await a.qp(), await b.qp()
        for node, qp in ((a, qa), (b, qb)):
            answer = SaMad.decode(await node.sa(build_mc_join(1, acm_join_record(node.gid))))
            mlid = McMemberRecord.decode(answer.data[:56]).mlid
            await qp.attach_mcast(ACM_MGID, mlid)
        start = trio.current_time()
        await world.port_flap("node2", "mlx5_0", 1, 2.0)
        assert trio.current_time() - start == pytest.approx(2.0)
        assert await events(device_b, 3) == [E.PORT_ERR, E.PORT_ACTIVE, E.CLIENT_REREGISTER]
        # The SM forgot node2's membership: a multicast no longer reaches it until it re-joins.
        await qa.send(acm_mad(), AddressVector(dlid=mlid, dgid=ACM_MGID), MULTICAST_QPN)
        await qa.receive()
        with trio.move_on_after(1):
            await qb.receive()
            pytest.fail("a flapped port still got the group's traffic")
        await b.sa(build_mc_join(2, acm_join_record(b.gid)))
        await qa.send(acm_mad(), AddressVector(dlid=mlid, dgid=ACM_MGID), MULTICAST_QPN)
        assert (await qb.receive()).slid == a.lid


@pytest.mark.trio
async def test_lid_change_moves_unicast(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(3))
    async with running(world):
        a, b = await open_node(world.fabric("node1")), await open_node(world.fabric("node2"))
        device_b = (await b.fabric.open())[0]
        qa, qb = await a.qp(), await b.qp()
        old = b.lid
        world.set_lid("node2", "mlx5_0", 1, 100)
        assert await events(device_b, 1) == [E.LID_CHANGE]
        assert (await b.port.query()).lid == 100
        await qa.send(acm_mad(), AddressVector(dlid=old), qb.qpn)
        await qa.send(acm_mad(), AddressVector(dlid=100), qb.qpn)
        assert (await qb.receive()).dlid_path_bits == 0
        assert world.stats["no_route"] == 1
        answer = await a.sa(build_path_get(1, PathRecord(dgid=b.gid, sgid=a.gid)))
        assert PathRecord.decode(SaMad.decode(answer).data[:64]).dlid == 100
        with pytest.raises(FabricError, match="already used by node1"):
            world.set_lid("node2", "mlx5_0", 1, a.lid)
        with pytest.raises(FabricError, match="not a unicast LID"):
            world.set_lid("node2", "mlx5_0", 1, 0xC000)


@pytest.mark.trio
async def test_sm_move_tells_every_port_and_answers_only_at_the_new_lid(
    autojump_clock: trio.abc.Clock,
) -> None:
    world = SimWorld(generate(3))
    async with running(world):
        nodes = [await open_node(world.fabric(f"node{i}")) for i in (1, 2, 3)]
        devices = [(await n.fabric.open())[0] for n in nodes]
        old_dest = nodes[1].dest
        await nodes[1].sa(build_mc_join(1, acm_join_record(nodes[1].gid)))
        assert old_dest.sm_lid == nodes[0].lid
        world.move_sm("node3")
        for device in devices:
            assert await events(device, 2) == [E.SM_CHANGE, E.CLIENT_REREGISTER]
        attrs = await nodes[1].port.query()
        assert attrs.sm_lid == nodes[2].lid
        # C defect 23: a daemon that keeps the old SM LID gets no answers any more.
        query = build_path_get(2, PathRecord(dlid=nodes[1].lid))
        port = nodes[1].port
        with pytest.raises(SaTimeout):
            await port.sa_send(query, old_dest, timeout_ms=50, retries=1)
        assert world.stats["sa_not_sm"] == 2
        new_dest = SaDestination(attrs.sm_lid, 0, 0)
        fresh = await port.sa_send(query, new_dest, timeout_ms=50, retries=1)
        assert SaMad.decode(fresh).mad.status == 0
        # The new SM knows no groups but the IPoIB broadcast group.
        assert sorted(world.sa.groups.by_mlid) == [0xC000]
        world.client_reregister("node2")
        assert await events(devices[1], 1) == [E.CLIENT_REREGISTER]
        with pytest.raises(FabricError, match="no node named 'nowhere'"):
            world.move_sm("nowhere")


@pytest.mark.trio
async def test_ip_address_changes_reach_the_node(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(2))
    async with running(world):
        fabric = world.fabric("node1")
        before = await fabric.interface_addresses()
        assert [str(x.address) for x in before] == ["10.0.0.1", "fd00::1"]
        assert before[0].display == "10.0.0.1/16" and before[0].pkey == 0xFFFF
        added = world.add_address("node1", "ib0", "10.9.0.1/24")
        event = await fabric.wait_ip_event()
        assert event.added and event.address == added
        assert added.gid == before[0].gid
        assert len(await fabric.interface_addresses()) == 3
        world.remove_address("node1", "10.9.0.1")
        event = await fabric.wait_ip_event()
        assert not event.added and event.address.address == ipaddress.ip_address("10.9.0.1")
        with pytest.raises(FabricError, match="already configured on node2"):
            world.add_address("node1", "ib0", "10.0.0.2/16")
        with pytest.raises(FabricError, match="no IPoIB interface"):
            world.add_address("node1", "ib7", "10.9.0.2/16")

"""The hub: daemons in other processes share one world through HubFabric over a unix socket.

Both ends run in one trio test here (the protocol is the same as across processes); the hub
end is ``serve_hub``, the daemon end ``HubFabric``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from ibacm.fabric.api import (
    MULTICAST_QPN,
    AddressVector,
    FabricError,
    NoDevicesError,
    PortDownError,
    PortEventType,
    PortState,
    SaSendError,
)
from ibacm.fabric.sim import hub_protocol as hp
from ibacm.fabric.sim.hub import HubError, HubFabric, hub_call, serve_hub
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.mad import McMemberRecord, SaMad, build_mc_join, build_path_get_table
from ibacm.wire.path_record import PathRecord
from tests.fabric.helpers import ACM_MGID, acm_join_record, hub, open_node, running


def acm_mad(method: int, tag: int) -> bytes:
    return bytes([1, 0x2C, 1, method, 0, 0, 0, 1]) + tag.to_bytes(8, "big") + bytes(240)


@pytest.mark.trio
async def test_two_daemons_exchange_unicast_and_multicast_through_the_hub(
    tmp_path: Path,
) -> None:
    world = SimWorld(generate(3))
    async with hub(world, tmp_path / "hub.sock") as path:
        f1, f2 = HubFabric(path, "node1"), HubFabric(path, "node2")
        a, b = await open_node(f1), await open_node(f2)
        assert (a.lid, b.lid, f1.hostname) == (2, 3, "node1")
        assert [str(x.address) for x in await f2.interface_addresses()] == ["10.0.0.2", "fd00::2"]
        qa, qb = await a.qp(), await b.qp()
        mlids = []
        for node, qp in ((a, qa), (b, qb)):
            answer = SaMad.decode(await node.sa(build_mc_join(1, acm_join_record(node.gid))))
            assert answer.mad.status == 0 and answer.mad.tid >> 32 != 0
            mlids.append(McMemberRecord.decode(answer.data[:56]).mlid)
            await qp.attach_mcast(ACM_MGID, mlids[-1])
        assert mlids[0] == mlids[1] >= 0xC000
        # Request by multicast: both members (the sender too) receive it.
        await qa.send(acm_mad(1, 7), AddressVector(dlid=mlids[0], dgid=ACM_MGID), MULTICAST_QPN)
        for qp in (qa, qb):
            got = await qp.receive()
            assert (got.mad, got.sgid, got.slid, got.src_qp) == (acm_mad(1, 7), a.gid, 2, qa.qpn)
        # Response by unicast to the requester's QP.
        await qb.send(acm_mad(0x81, 7), AddressVector(dlid=a.lid, dgid=a.gid), qa.qpn)
        got = await qa.receive()
        assert (got.mad[3], got.sgid, got.dgid, got.src_qp) == (0x81, b.gid, a.gid, qb.qpn)
        # Several queued MADs come in one receive_many, in order, at most the limit.
        for tag in (1, 2, 3):
            await qb.send(acm_mad(0x81, tag), AddressVector(dlid=a.lid, dgid=a.gid), qa.qpn)
        batches: list[list[int]] = []
        while sum(map(len, batches)) < 3:
            batches.append([got.mad[15] for got in await qa.receive_many(2)])
        assert [tag for batch in batches for tag in batch] == [1, 2, 3]
        assert all(1 <= len(batch) <= 2 for batch in batches)
        # A GetTable answer crosses the hub as RMPP segments and is reassembled by the client.
        table = SaMad.decode(await a.sa(build_path_get_table(2, PathRecord(sgid=a.gid))))
        assert len(table.records(64)) == 4
        stats = await hub_call(path, {"op": "stats"})
        assert stats["connected"] == ["node1", "node2"]
        assert [0x2C, 0x81, 0, 4] in stats["counters"]  # the answer and the three tagged
        await f1.aclose()
        await f2.aclose()


@pytest.mark.trio
async def test_events_and_control_requests_reach_daemons(tmp_path: Path) -> None:
    world = SimWorld(generate(2))
    async with hub(world, tmp_path / "hub.sock") as path:
        fabric = HubFabric(path, "node2")
        node = await open_node(fabric)
        device = (await fabric.open())[0]
        await hub_call(
            path, {"op": "port", "node": "node2", "device": "mlx5_0", "port": 1, "down_for": 0.05}
        )
        kinds = [(await device.wait_event()).type for _ in range(3)]
        assert kinds == [
            PortEventType.PORT_ERR,
            PortEventType.PORT_ACTIVE,
            PortEventType.CLIENT_REREGISTER,
        ]
        await hub_call(path, {"op": "move_sm", "node": "node2"})
        assert (await device.wait_event()).type == PortEventType.SM_CHANGE
        assert (await node.port.query()).sm_lid == node.lid
        world.add_address("node2", "ib0", "10.7.0.2/16")
        event = await fabric.wait_ip_event()
        assert event.added and str(event.address.address) == "10.7.0.2"
        faults = await hub_call(path, {"op": "faults", "set": {"loss": "0.5"}})
        assert faults["loss"] == 0.5 and world.faults.loss == 0.5
        with pytest.raises(FabricError, match="probability"):
            await hub_call(path, {"op": "faults", "set": {"loss": "2"}})
        with pytest.raises(HubError, match="unknown operation 'explode'"):
            await hub_call(path, {"op": "explode"})
        with pytest.raises(FabricError, match="no node named 'node9'"):
            await hub_call(
                path, {"op": "port", "node": "node9", "device": "mlx5_0", "port": 1, "up": False}
            )
        assert "fe80::" in await hub_call(path, {"op": "hosts"})
        await fabric.aclose()


@pytest.mark.trio
async def test_a_lost_hub_takes_the_ports_down(tmp_path: Path) -> None:
    world = SimWorld(generate(2))
    async with running(world):
        # Not ``hub``: this hub ends by itself, and the nursery waits for it.
        async with trio.open_nursery() as nursery:
            path = await nursery.start(serve_hub, world, tmp_path / "hub.sock")
            fabric = HubFabric(path, "node1")
            node = await open_node(fabric)
            device = (await fabric.open())[0]
            qp = await node.qp()
            await hub_call(path, {"op": "shutdown"})  # the hub goes away
        assert (await device.wait_event()).type == PortEventType.PORT_ERR
        attrs = await node.port.query()
        assert (attrs.state, attrs.lid) == (PortState.DOWN, node.lid)
        with pytest.raises(PortDownError):
            await qp.send(acm_mad(1, 1), AddressVector(dlid=3), 0x100)
        with pytest.raises(SaSendError, match="hub connection lost"):
            await node.sa(bytes(256))
        assert not (tmp_path / "hub.sock").exists()
        await fabric.aclose()


@pytest.mark.trio
async def test_hub_refuses_unknown_nodes_and_missing_sockets(tmp_path: Path) -> None:
    with pytest.raises(NoDevicesError, match="cannot reach the simulator hub"):
        await HubFabric(tmp_path / "nothing.sock", "node1").open()
    world = SimWorld(generate(1))
    async with hub(world, tmp_path / "hub.sock") as path:
        with pytest.raises(NoDevicesError, match="no node named 'node7'"):
            await HubFabric(path, "node7").open()
        with pytest.raises(FabricError, match="already serving"):
            await serve_hub(world, path)
        # A client sending garbage is dropped; the hub keeps serving others.
        stream = await trio.open_unix_socket(path)
        await stream.send_all(b"\xff\xff\xff\xff\x01")
        assert await stream.receive_some(10) == b""
        assert (await hub_call(path, {"op": "stats"}))["connected"] == []


def test_frames_round_trip_and_reject_damage() -> None:
    av = AddressVector(dlid=0xC001, dgid=ACM_MGID, sl=3, hop_limit=64, flow_label=0x12345)
    mad = acm_mad(1, 9)
    data = hp.encode_ud_send(7, 2, 0xFFFFFF, av, mad) + hp.encode_ok(7)
    decoder = hp.FrameDecoder()
    frames = decoder.feed(data[:10]) + decoder.feed(data[10:])  # split anywhere
    assert [f.type for f in frames] == [hp.FrameType.UD_SEND, hp.FrameType.OK]
    assert hp.decode_ud_send(frames[0].body) == (7, 2, 0xFFFFFF, av, mad)
    assert hp.decode_ok(frames[1].body) == 7
    assert decoder.pending == 0
    call_id, payload = hp.decode_json_body(
        hp.FrameDecoder().feed(hp.encode_reply(3, error=PortDownError("down")))[0].body
    )
    assert (call_id, payload) == (3, {"error": {"type": "PortDownError", "message": "down"}})
    with pytest.raises(hp.HubProtocolError, match="frame length"):
        hp.FrameDecoder().feed(b"\x00\x00\x00\x00")
    with pytest.raises(hp.HubProtocolError, match="MAD of 3 bytes"):
        hp.encode_ud_send(1, 1, 1, av, b"abc")
    with pytest.raises(hp.HubProtocolError, match="out of range"):
        hp.encode_ud_send(1, 1, 1, AddressVector(dlid=0x10000), mad)
    with pytest.raises(hp.HubProtocolError, match="UD_RECV"):
        hp.decode_ud_recv(b"short")
    with pytest.raises(hp.HubProtocolError, match="unknown event code"):
        hp.decode_event(b"\x00\x01\x63")
    with pytest.raises(hp.HubProtocolError, match="bad JSON"):
        hp.decode_json_body(b"\x00\x00\x00\x01{")

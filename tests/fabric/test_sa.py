"""The simulated SA: PathRecord GET/GetTable, MCMemberRecord join/leave, errors, umad rules."""

from __future__ import annotations

import itertools

import pytest
import trio

from ibacm.fabric.api import SaDestination, SaTimeout
from ibacm.fabric.sim.topo_file import SPEED_CODES, Link, generate, parse_ibnetdiscover
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.mad import (
    McComp,
    McMemberRecord,
    Method,
    SaMad,
    build_mc_join,
    build_mc_leave,
    build_path_get,
    build_path_get_table,
)
from ibacm.wire.path_record import PathRecord
from tests.conftest import SPEC, require_file
from tests.fabric.helpers import acm_join_record, net_example, open_node, running

NO_RECORDS, REQ_INVALID, INSUFFICIENT = 0x0300, 0x0200, 0x0600


def path_of(answer: bytes) -> PathRecord:
    return PathRecord.decode(SaMad.decode(answer).data[:64])


def status_of(answer: bytes) -> int:
    return SaMad.decode(answer).mad.status


@pytest.mark.trio
async def test_path_get_for_every_hca_pair_of_2sw2path4hca(autojump_clock: trio.abc.Clock) -> None:
    topology = parse_ibnetdiscover(net_example("net.2sw2path4hca"))
    world = SimWorld(topology)
    names = topology.host_names
    async with running(world):
        nodes = {name: await open_node(world.fabric(name)) for name in names}
        for src, dst in itertools.product(names, names):
            a, b = nodes[src], nodes[dst]
            # What ibacmp sends for an ACM-learned peer: sgid, dgid, pkey (mask 0x200C).
            answer = await a.sa(build_path_get(9, PathRecord(dgid=b.gid, sgid=a.gid, pkey=0xFFFF)))
            assert SaMad.decode(answer).sa.comp_mask == 0x200C
            path = path_of(answer)
            assert (path.dlid, path.slid, path.dgid, path.sgid) == (b.lid, a.lid, b.gid, a.gid)
            # ibsim's links are 4x SDR (10 Gb/s) and its ports carry 2048-byte MTUs.
            assert (path.mtu_byte, path.rate_byte) == (0x84, 0x83), (src, dst)
            assert path.reversible_numpath == 0x80
            assert path.packetlifetime_byte == (0x80 if src == dst else 0x92)
            assert path.pkey == 0xFFFF
            by_lid = path_of(await a.sa(build_path_get(10, PathRecord(dlid=b.lid, slid=a.lid))))
            assert by_lid.encode() == path.encode()


@pytest.mark.trio
async def test_path_mtu_and_rate_are_the_narrowest_link(autojump_clock: trio.abc.Clock) -> None:
    topology = generate(64, switches=2)  # node1..32 on leaf1, node33..64 on leaf2
    slow = topology.host("node40").hcas[0].ports[0]
    slow.mtu = 3  # a 1024-byte HCA
    topology.links = [
        Link(link.a, link.b, link.width, SPEED_CODES["FDR"])
        if link.a.node_guid == topology.host("node40").hcas[0].node_guid
        else link
        for link in topology.links
    ]
    world = SimWorld(topology)
    async with running(world):
        a, b = await open_node(world.fabric("node1")), await open_node(world.fabric("node40"))
        path = path_of(await a.sa(build_path_get(1, PathRecord(dgid=b.gid, sgid=a.gid))))
        assert (path.mtu, path.rate) == (3, 12)  # 1024 bytes, 4x FDR = 56 Gb/s
        assert b.attrs.active_mtu == 3
        # Selectors: "exactly 4096" cannot be met, "less than 56G" gives the next lower rate
        # (50G), "greater than 512" gives what the path has.
        wants_4096 = PathRecord(dgid=b.gid, sgid=a.gid, mtu_selector=2, mtu=5)
        assert status_of(await a.sa(build_path_get(2, wants_4096))) == NO_RECORDS
        below = PathRecord(dgid=b.gid, sgid=a.gid, rate_selector=1, rate=12)
        assert path_of(await a.sa(build_path_get(3, below))).rate == 20
        above = PathRecord(dgid=b.gid, sgid=a.gid, mtu_selector=0, mtu=2)
        assert path_of(await a.sa(build_path_get(4, above))).mtu == 3


@pytest.mark.trio
async def test_path_errors_and_no_records(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(3))
    async with running(world):
        a, b = await open_node(world.fabric("node1")), await open_node(world.fabric("node2"))
        assert status_of(await a.sa(build_path_get(1, PathRecord(dlid=0x999)))) == NO_RECORDS
        unknown = PathRecord(dgid=bytes.fromhex("fe80000000000000" + "00000000deadbeef"))
        assert status_of(await a.sa(build_path_get(2, unknown))) == NO_RECORDS
        other_partition = PathRecord(dgid=b.gid, sgid=a.gid, pkey=0x8001)
        assert status_of(await a.sa(build_path_get(3, other_partition))) == NO_RECORDS
        mismatch = PathRecord(dgid=b.gid, dlid=a.lid)  # GID and LID of different ports
        assert status_of(await a.sa(build_path_get(4, mismatch))) == REQ_INVALID
        half_service = build_path_get(5, PathRecord(service_id=7), comp_mask=0x1)
        assert status_of(await a.sa(half_service)) == INSUFFICIENT
        set_path = bytearray(build_path_get(6, PathRecord(dlid=b.lid)))
        set_path[3] = Method.SET
        assert status_of(await a.sa(bytes(set_path))) == 0x000C  # METHOD_ATTR_UNSUPPORTED
        odd_attr = bytearray(build_path_get(7, PathRecord(dlid=b.lid)))
        odd_attr[16:18] = b"\x00\x99"
        assert status_of(await a.sa(bytes(odd_attr))) == 0x000C
        old_version = bytearray(build_path_get(8, PathRecord(dlid=b.lid)))
        old_version[2] = 1
        assert status_of(await a.sa(bytes(old_version))) == 0x0004  # bad class version
        # A response sent to the SA is not answered at all.
        response = bytearray(build_path_get(9, PathRecord(dlid=b.lid)))
        response[3] = Method.GET_RESP
        with pytest.raises(SaTimeout):
            await a.sa(bytes(response), timeout_ms=50, retries=0)


@pytest.mark.trio
async def test_get_table_arrives_in_rmpp_segments_and_is_reassembled(
    autojump_clock: trio.abc.Clock,
) -> None:
    world = SimWorld(generate(8))
    async with running(world):
        a = await open_node(world.fabric("node1"))
        answer = await a.sa(build_path_get_table(1, PathRecord(sgid=a.gid)))
        table = SaMad.decode(answer)
        assert table.mad.method == Method.GET_TABLE_RESP and table.mad.status == 0
        records = [PathRecord.decode(r) for r in table.records(64)]
        # The switch and the eight HCA ports, in LID order.
        assert [r.dlid for r in records] == list(range(1, 10))
        assert {r.slid for r in records} == {a.lid}
        # 9 x 64 bytes = 576 bytes travel as three 200-byte RMPP segments.
        assert world.counters[(3, Method.GET_TABLE_RESP, 0x35)] == 3
        empty = SaMad.decode(await a.sa(build_path_get_table(2, PathRecord(dlid=0x999))))
        assert (empty.mad.status, empty.records(64)) == (0, [])


@pytest.mark.trio
async def test_acm_group_join_leave_semantics(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(3))
    async with running(world):
        a, b, c = [await open_node(world.fabric(f"node{i}")) for i in (1, 2, 3)]
        first = SaMad.decode(await a.sa(build_mc_join(1, acm_join_record(a.gid))))
        assert first.mad.method == Method.GET_RESP and first.mad.status == 0
        group = McMemberRecord.decode(first.data[:56])
        assert group.mlid >= 0xC000 and group.scope_join == 0x51
        assert (group.qkey, group.mtu_byte, group.rate_byte, group.pkey) == (
            0x80010000,
            0x84,
            0x83,
            0xFFFF,
        )
        # Later joiners must match the group, as OpenSM checks.
        for wrong in (
            acm_join_record(b.gid, qkey=0x80010001),
            acm_join_record(b.gid, mtu=5),
            acm_join_record(b.gid, rate=7),
        ):
            assert status_of(await b.sa(build_mc_join(2, wrong))) == REQ_INVALID, wrong
        joined = McMemberRecord.decode(
            SaMad.decode(await b.sa(build_mc_join(3, acm_join_record(b.gid)))).data[:56]
        )
        assert joined.mlid == group.mlid
        # Creating a group needs Q_Key, TClass, P_Key, FlowLabel and SL components.
        sparse = build_mc_join(
            4,
            acm_join_record(c.gid, mgid=bytes.fromhex("ff15" + "11" * 14)),
            comp_mask=McComp.MGID | McComp.PORT_GID | McComp.JOIN_STATE,
        )
        assert status_of(await c.sa(sparse)) == INSUFFICIENT
        # Leave: the group stays while a full member remains and goes with the last one.
        left = SaMad.decode(await a.sa(build_mc_leave(5, acm_join_record(a.gid))))
        assert left.mad.method == Method.DELETE_RESP and left.mad.status == 0
        assert McMemberRecord.decode(left.data[:56]).scope_join == 0x50
        assert group.mlid in world.sa.groups.by_mlid
        assert status_of(await a.sa(build_mc_leave(6, acm_join_record(a.gid)))) == REQ_INVALID
        await b.sa(build_mc_leave(7, acm_join_record(b.gid)))
        assert group.mlid not in world.sa.groups.by_mlid
        # The next group gets the lowest free MLID again.
        again = SaMad.decode(await c.sa(build_mc_join(8, acm_join_record(c.gid))))
        assert McMemberRecord.decode(again.data[:56]).mlid == group.mlid


@pytest.mark.trio
async def test_ipoib_groups_follow_the_broadcast_groups_qkey(
    autojump_clock: trio.abc.Clock,
) -> None:
    world = SimWorld(generate(2))
    broadcast = bytes.fromhex("ff12401bffff000000000000ffffffff")
    all_nodes_v6 = bytes.fromhex("ff12601bffff00000000000000000001")
    async with running(world):
        a = await open_node(world.fabric("node1"))

        def ipoib(mgid: bytes, qkey: int) -> bytes:
            record = acm_join_record(a.gid, mgid=mgid, qkey=qkey)
            record.scope = 2
            return build_mc_join(1, record)

        assert status_of(await a.sa(ipoib(broadcast, 0x80010000))) == REQ_INVALID
        joined = SaMad.decode(await a.sa(ipoib(broadcast, 0x0B1B)))
        record = McMemberRecord.decode(joined.data[:56])
        assert (record.mlid, record.qkey, record.packetlifetime_byte) == (0xC000, 0x0B1B, 0x92)
        assert status_of(await a.sa(ipoib(all_nodes_v6, 0x80010000))) == REQ_INVALID
        assert status_of(await a.sa(ipoib(all_nodes_v6, 0x0B1B))) == 0


@pytest.mark.trio
async def test_umad_rewrites_tid_and_retries(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(2))
    async with running(world):
        a = await open_node(world.fabric("node1"))
        request = build_path_get(0x12345678, PathRecord(dlid=a.lid))
        answer = SaMad.decode(await a.sa(request))
        # The kernel's agent number is in the upper 32 bits; callers match the low 32 bits.
        assert answer.mad.tid & 0xFFFFFFFF == 0x12345678
        assert answer.mad.tid >> 32 != 0
        world.faults.sa_down = True
        start = trio.current_time()
        with pytest.raises(SaTimeout):
            await a.sa(build_path_get(2, PathRecord(dlid=a.lid)), timeout_ms=100, retries=2)
        assert trio.current_time() - start == pytest.approx(0.3)
        assert world.count(mgmt_class=3, method=Method.GET) == 1 + 3
        assert world.stats["sa_down"] == 3
        # A MAD to a LID without an SA behind it is never answered either.
        world.faults.sa_down = False
        elsewhere = SaDestination(a.lid + 1, 0, 0)
        with pytest.raises(SaTimeout):
            await a.port.sa_send(
                build_path_get(3, PathRecord(dlid=a.lid)), elsewhere, timeout_ms=10, retries=0
            )
        assert world.stats["sa_not_sm"] == 1


def spec_example(title: str) -> bytes:
    """The hex dump following ``title`` in mad-protocol.md §9.9, zero-padded to 256 bytes."""
    text = require_file(SPEC / "mad-protocol.md").read_text()
    block = text[text.index(title) :].split("```")[1]
    data = bytearray(256)
    for line in block.strip().splitlines():
        offset, _, rest = line.partition(":")
        octets = [int(x, 16) for x in rest.split()[:16] if len(x) == 2]
        start = int(offset, 16)
        data[start : start + len(octets)] = bytes(octets)
    return bytes(data)


@pytest.mark.trio
async def test_the_specs_worked_examples_are_answered(autojump_clock: trio.abc.Clock) -> None:
    topology = generate(2)
    # Give the ports the GIDs of the examples (fe80::2:c903:1:e3f1 and fe80::2:c903:a:2b3d).
    topology.hosts[0].hcas[0].ports[0].guid = 0x0002C9030001E3F1
    topology.hosts[1].hcas[0].ports[0].guid = 0x0002C903000A2B3D
    topology.sm_guid = 0x0002C9030001E3F1
    world = SimWorld(topology)
    async with running(world):
        a, b = await open_node(world.fabric("node1")), await open_node(world.fabric("node2"))
        join = spec_example("MCMemberRecord join for group 0")
        assert join[:4] == bytes([1, 3, 2, 2]) and join[48:56] == bytes.fromhex("000000000001b3f7")
        answer = SaMad.decode(await a.sa(join))
        assert (answer.mad.status, answer.mad.method, answer.mad.tid & 0xFFFFFFFF) == (0, 0x81, 7)
        assert answer.sa.comp_mask == 0x1B3F7
        record = McMemberRecord.decode(answer.data[:56])
        assert record.mgid == join[56:72] and record.port_gid == a.gid
        assert (record.qkey, record.mtu_byte, record.rate_byte, record.scope_join) == (
            0x80010000,
            0x84,
            0x83,
            0x51,
        )
        query = spec_example("PathRecord GET for an ACM-learned peer")
        path = path_of(await a.sa(query))
        assert (path.dgid, path.sgid, path.dlid, path.slid) == (b.gid, a.gid, b.lid, a.lid)

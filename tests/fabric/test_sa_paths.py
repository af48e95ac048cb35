"""PathRecord queries to the simulated SA; its GetTable fast path gives what one GET per pair does.

A PathRecord GetTable from one source works the source side out once for every destination
(``Router.bottlenecks_from``, ``PathRecords._table_from`` in ``sa_paths.py``); these tests hold
it to the per-pair rules (``Router.path``, PathRecord GET) on fabrics with mixed link speeds and
MTUs, partitions, a port that is down, and queries with selectors and the reversible bit.
"""

from __future__ import annotations

import pytest

from ibacm.fabric.api import PortState
from ibacm.fabric.sim.directory import Directory
from ibacm.fabric.sim.multicast import GroupTable
from ibacm.fabric.sim.routing import Router
from ibacm.fabric.sim.runtime import PortRuntime
from ibacm.fabric.sim.sa_paths import MAX_PAIRS, PathRecords
from ibacm.fabric.sim.sa_view import SaFail
from ibacm.fabric.sim.topo_file import SPEED_CODES, Link, Topology, generate, parse_ibnetdiscover
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.mad import (
    Method,
    RmppReassembler,
    SaMad,
    SaStatus,
    build_path_get,
    build_path_get_table,
    sa_status_word,
)
from ibacm.wire.path_record import PathComp, PathRecord
from tests.fabric.helpers import net_example

NO_RECORDS = 0x0300


def mixed_fabric() -> Topology:
    """Three leaves; a few hosts with slower links, smaller MTUs or other partitions."""
    topology = generate(40, switches=3)
    slow = {topology.host(name).hcas[0].node_guid for name in ("node3", "node17", "node30")}
    topology.links = [
        Link(link.a, link.b, link.width, SPEED_CODES["FDR"])
        if slow & {link.a.node_guid, link.b.node_guid}
        else link
        for link in topology.links
    ]
    topology.host("node5").hcas[0].ports[0].mtu = 3
    topology.host("node17").hcas[0].ports[0].mtu = 4
    topology.host("node8").hcas[0].ports[0].pkeys = (0x8001,)
    topology.host("node9").hcas[0].ports[0].pkeys = (0x0001, 0xFFFF)
    topology.host("node10").hcas[0].ports[0].pkeys = (0x7FFF,)
    return topology


def world_of(topology: Topology) -> SimWorld:
    world = SimWorld(topology)
    world.set_port_state("node12", "mlx5_0", 1, False)
    return world


def whole_answer(world: SimWorld, requester: PortRuntime, mad: bytes) -> SaMad:
    reassembler = RmppReassembler()
    answers = world.sa.handle(requester, mad)
    whole = [reassembler.feed(answer) for answer in answers][-1]
    assert whole is not None
    return SaMad.decode(whole)


@pytest.mark.parametrize("fabric", ["mixed", "ibnetdiscover"])
def test_bottlenecks_from_agree_with_path(fabric: str) -> None:
    topology = (
        mixed_fabric()
        if fabric == "mixed"
        else parse_ibnetdiscover(net_example("net.2sw2path4hca"))
    )
    world = SimWorld(topology)
    guids = [endpoint.guid for endpoint in world.endpoints()] + [0xDEAD]
    router = world.router
    for src in guids:
        expected = []
        for dst in guids:
            info = router.path(src, dst)
            expected.append(None if info is None else (info.mtu, info.rate))
        assert router.bottlenecks_from(src, guids) == expected, hex(src)


QUERIES: list[tuple[str, PathRecord, int | None]] = [
    ("bulk preload", PathRecord(pkey=0xFFFF), int(PathComp.SGID | PathComp.PKEY)),
    ("sgid only", PathRecord(), None),
    ("other partition", PathRecord(pkey=0x8001), int(PathComp.SGID | PathComp.PKEY)),
    ("reversible", PathRecord(reversible=True, sl=3), None),
    ("mtu exactly 4096", PathRecord(mtu_selector=2, mtu=5), None),
    ("mtu below 4096", PathRecord(mtu_selector=1, mtu=5), None),
    ("mtu above 1024", PathRecord(mtu_selector=0, mtu=3, reversible=True), None),
    ("rate below 100G", PathRecord(rate_selector=1, rate=16, reversible=True), None),
    ("rate exactly 56G", PathRecord(rate_selector=2, rate=12), None),
    ("packet life", PathRecord(packet_life_selector=1, packet_life=20), None),
    ("fixed slid", PathRecord(slid=0), None),
]


@pytest.mark.parametrize(("name", "query", "mask"), QUERIES, ids=[q[0] for q in QUERIES])
def test_get_table_is_one_get_per_pair(name: str, query: PathRecord, mask: int | None) -> None:
    world = world_of(mixed_fabric())
    targets = world.endpoints()
    prefix = world.topology.subnet_prefix.to_bytes(8, "big")
    for source in ("node1", "node3", "node5", "node8", "node9", "node17"):
        port = world.port(source, "mlx5_0", 1)
        query.sgid = port.gid0
        if name == "fixed slid":
            query.slid = port.lid
        table_mask = query.comp_mask() if mask is None else mask
        table = whole_answer(world, port, build_path_get_table(7, query, table_mask))
        assert table.mad.method == Method.GET_TABLE_RESP and table.mad.status == 0
        expected = []
        for target in targets:
            pair = PathRecord.decode(query.encode())
            pair.dgid = prefix + target.guid.to_bytes(8, "big")
            get = build_path_get(8, pair, table_mask | PathComp.DGID)
            answer = SaMad.decode(world.sa.handle(port, get)[0])
            if answer.mad.status == NO_RECORDS:
                continue
            assert answer.mad.status == 0, (name, source, target.lid)
            expected.append(answer.data[:64])
        assert table.records(64) == expected, (name, source)
        decoded = PathRecord.decode_table(table.data, table.sa.attr_offset * 8, len(expected))
        assert [record.encode() for record in decoded] == expected


def test_the_sa_counts_the_records_it_answers() -> None:
    """What a job start costs the SA is records, not queries: a GetTable of the bulk preload
    carries one PathRecord per reachable port, a GET one, a failed GET none."""
    world = SimWorld(generate(12))
    port = world.port("node1", "mlx5_0", 1)
    query = PathRecord(pkey=0xFFFF, sgid=port.gid0)
    mask = int(PathComp.SGID | PathComp.PKEY)
    table = whole_answer(world, port, build_path_get_table(1, query, mask))
    records = len(table.records(64))
    assert records == len(world.endpoints()) and world.sa.records_sent[0x35] == records
    pair = PathRecord.decode(query.encode())
    pair.dgid = world.port("node2", "mlx5_0", 1).gid0
    assert SaMad.decode(world.sa.handle(port, build_path_get(2, pair, mask | PathComp.DGID))[0])
    pair.dgid = bytes(16)
    world.sa.handle(port, build_path_get(3, pair, mask | PathComp.DGID))  # no such port
    assert world.sa.records_sent[0x35] == records + 1


def test_path_records_give_a_get_one_record_and_a_table_every_reachable_port() -> None:
    topology = generate(4)
    directory = Directory(topology, Router(topology))
    paths = PathRecords(directory, GroupTable())
    directory.set_state(directory.port("node4", "mlx5_0", 1), PortState.DOWN)
    port = directory.port("node1", "mlx5_0", 1)
    query = PathRecord(pkey=0xFFFF, sgid=port.gid0)
    mask = int(PathComp.SGID | PathComp.PKEY)
    table = paths.query(port, SaMad.decode(build_path_get_table(1, query, mask)))
    # The switch, node1 (loopback) and node2, node3: not the port that is down.
    assert [PathRecord.decode(r).dlid for r in table] == [1, 2, 3, 4]
    (only,) = paths.query(port, SaMad.decode(build_path_get(2, query, mask)))
    assert PathRecord.decode(only).dlid == 1  # the first match in LID order
    query.dgid = directory.port("node4", "mlx5_0", 1).gid0
    assert paths.query(port, SaMad.decode(build_path_get(3, query, mask | PathComp.DGID))) == []


MAX_PAIRS_NODES = 500
"""With its switches, more than sqrt(MAX_PAIRS) endpoints: every source to every destination."""


def test_a_query_over_too_many_pairs_is_refused() -> None:
    topology = generate(MAX_PAIRS_NODES)
    directory = Directory(topology, Router(topology))
    paths = PathRecords(directory, GroupTable())
    port = directory.port("node1", "mlx5_0", 1)
    assert len(directory.endpoints()) ** 2 > MAX_PAIRS
    with pytest.raises(SaFail) as failure:
        paths.query(port, SaMad.decode(build_path_get_table(1, PathRecord(), 0)))
    assert failure.value.status == sa_status_word(SaStatus.NO_RESOURCES)

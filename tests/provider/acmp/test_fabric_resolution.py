"""ibacmp on the simulated fabric: address resolution and routes between real provider
instances, counted MAD by MAD (mad-protocol.md §6, behavior.md §10-§12)."""

from __future__ import annotations

import pytest
import trio

from ibacm.config.option_values import RouteProt
from ibacm.config.options import Options
from ibacm.provider.acmp.endpoint import AcmpEndpoint
from ibacm.provider.acmp.entry import EntryState, PendingQuery
from ibacm.provider.acmp.keys import cache_key
from ibacm.provider.api import Counter
from ibacm.wire.client import AcmStatus, AddrType, EpAddr, EpFlag
from ibacm.wire.path_record import PathRecord
from tests.provider.acmp.harness import Cluster, cluster, gid, ipv4, ipv6, lid, name

pytestmark = pytest.mark.trio


def options(**changes: object) -> Options:
    opts = Options()
    for key, value in changes.items():
        setattr(opts, key, value)
    return opts


def addresses(c: Cluster, kind: str, node: str) -> EpAddr:
    if kind == "ipv4":
        return ipv4(c.world, node)
    if kind == "ipv6":
        return ipv6(c.world, node)
    return name(node)


def check_path(c: Cluster, src: str, dst: str, path: PathRecord) -> None:
    source, dest = c.world.node(src), c.world.node(dst)
    assert path.dlid == dest.lids[0]
    assert path.dgid == dest.gids[0]
    assert path.slid == source.lids[0]
    assert path.sgid == source.gids[0]
    assert path.pkey == 0xFFFF


@pytest.mark.parametrize("route_prot", [RouteProt.SA, RouteProt.ACM])
async def test_sixteen_nodes_resolve_every_pair_by_ipv4_ipv6_and_name(
    autojump_clock: object, route_prot: RouteProt
) -> None:
    async with cluster(16, options(route_prot=route_prot)) as c:
        names = c.world.node_names
        pairs = [(a, b) for a in names for b in names if a != b]
        for kind in ("ipv4", "ipv6", "name"):
            requests, sa = c.acm_requests(), c.sa_path_queries()
            for src, dst in pairs:
                result = await c[src].resolve(addresses(c, kind, src), addresses(c, kind, dst))
                assert result.status == AcmStatus.SUCCESS, (kind, src, dst)
                check_path(c, src, dst, result.paths[0])
            # One multicast per unordered pair: the answer to A's question taught B about A.
            assert c.acm_requests() - requests == len(pairs) // 2
            assert c.acm_responses() >= len(pairs) // 2
            if route_prot is RouteProt.SA:
                # Requester and responder each ask the SA once per pair, nobody else does.
                assert c.sa_path_queries() - sa == len(pairs)
            else:
                assert c.sa_path_queries() == 0


async def test_one_resolution_costs_one_multicast_one_answer_and_two_path_queries(
    autojump_clock: object,
) -> None:
    async with cluster(4) as c:
        result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node3"))
        assert result.status == AcmStatus.SUCCESS
        assert (c.acm_requests(), c.acm_responses(), c.sa_path_queries()) == (1, 1, 2)
        # Again: from the cache, nothing on the wire.
        again = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node3"))
        assert again.status == AcmStatus.SUCCESS and again.paths == result.paths
        assert (c.acm_requests(), c.acm_responses(), c.sa_path_queries()) == (1, 1, 2)
        counters = c["node1"].counters()
        assert counters[Counter.RESOLVE] == 2
        assert counters[Counter.ADDR_QUERY] == 1
        assert counters[Counter.ROUTE_QUERY] == 1
        assert counters[Counter.ROUTE_CACHE] == 1
        assert c["node3"].counters()[Counter.ROUTE_QUERY] == 1
        assert c["node1"].core.counters.snapshot()[Counter.ADDR_QUERY] == 1


async def test_every_receiver_learns_the_requester(autojump_clock: object) -> None:
    async with cluster(4) as c:
        await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node3"))
        # node2 only overheard the question; it knows node1's address, not yet its route.
        result = await c["node2"].resolve(ipv4(c.world, "node2"), ipv4(c.world, "node1"))
        assert result.status == AcmStatus.SUCCESS
        check_path(c, "node2", "node1", result.paths[0])
        assert c.acm_requests() == 1  # no multicast for node1's address
        assert c["node2"].counters()[Counter.ADDR_CACHE] == 1
        # node3 was asked and resolved its route back to node1 before answering.
        back = await c["node3"].resolve(ipv4(c.world, "node3"), ipv4(c.world, "node1"))
        assert back.status == AcmStatus.SUCCESS
        assert c["node3"].counters()[Counter.ROUTE_CACHE] == 1


async def test_route_acm_learned_from_overheard_request_needs_no_query(
    autojump_clock: object,
) -> None:
    async with cluster(4, options(route_prot=RouteProt.ACM)) as c:
        await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node3"))
        requests = c.acm_requests()
        result = await c["node2"].resolve(ipv4(c.world, "node2"), ipv4(c.world, "node1"))
        assert result.status == AcmStatus.SUCCESS
        check_path(c, "node2", "node1", result.paths[0])
        assert c.acm_requests() == requests
        assert c["node2"].counters()[Counter.ROUTE_CACHE] == 1
        assert c.sa_path_queries() == 0


async def test_address_vectors_to_peers_are_built_only_when_an_answer_needs_one(
    autojump_clock: object,
) -> None:
    async with cluster(4, options(route_prot=RouteProt.ACM)) as c:
        await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node3"))
        node1 = c.world.node("node1")
        key = cache_key(AddrType.IP, bytes(ipv4(c.world, "node1").info))
        # node2 only overheard node1's request: it knows where node1 is, and built nothing.
        overheard = c.endpoint("node2").cache.get(key)
        assert overheard is not None and overheard.av is None
        group = c.endpoint("node2").joined[overheard.mgid]
        assert group.av is not None
        av = c.endpoint("node2").peer_av(overheard)
        assert av is not None and c.endpoint("node2").peer_av(overheard) is av
        assert (av.dlid, av.dgid) == (node1.lids[0], node1.gids[0])
        assert (av.sl, av.static_rate) == (group.av.sl, group.av.static_rate)
        # node3 was asked: its answer went to node1 along the group's vector.
        answered = c.endpoint("node3").cache.get(key)
        assert answered is not None and answered.av is not None
        assert answered.av.dlid == node1.lids[0] and not answered.route_av


async def test_answers_after_an_sa_route_follow_the_route(autojump_clock: object) -> None:
    async with cluster(4) as c:
        await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node3"))
        key = cache_key(AddrType.IP, bytes(ipv4(c.world, "node1").info))
        entry = c.endpoint("node3").cache.get(key)
        assert entry is not None and entry.route_av and entry.path is not None
        av = c.endpoint("node3").peer_av(entry)
        assert av is not None
        assert (av.dlid, av.dgid, av.sl) == (entry.path.dlid, entry.path.dgid, entry.path.sl)
        # The query template was never stored: it is made from the group and the peer.
        assert entry.query is None
        query = entry.route_query()
        assert query is not None and query.dgid == c.world.node("node1").gids[0]


async def test_route_acm_prefers_the_faster_shared_group(autojump_clock: object) -> None:
    async with cluster(3, options(route_prot=RouteProt.ACM)) as c:
        endpoint = c.endpoint("node1")
        with trio.fail_after(60):
            while not all(group.joined for group in endpoint.groups):
                await trio.sleep(0.1)
        assert len(endpoint.groups) == 2  # EDR 4x (100G) / 4096 differs from 10G / 2048
        result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        assert result.status == AcmStatus.SUCCESS
        path = result.paths[0]
        assert (path.rate, path.mtu) == (16, 5)
        assert path.reversible and path.numb_path == 1


async def test_gid_and_lid_destinations_are_answered(autojump_clock: object) -> None:
    async with cluster(4) as c:
        by_gid = await c["node1"].resolve(ipv4(c.world, "node1"), gid(c.world, "node4"))
        assert by_gid.status == AcmStatus.SUCCESS
        check_path(c, "node1", "node4", by_gid.paths[0])
        by_lid = await c["node1"].resolve(ipv4(c.world, "node1"), lid(c.world, "node2"))
        assert by_lid.status == AcmStatus.SUCCESS
        check_path(c, "node1", "node2", by_lid.paths[0])
        assert c.acm_requests() == 2


async def test_names_are_case_insensitive_keys(autojump_clock: object) -> None:
    async with cluster(3) as c:
        first = await c["node1"].resolve(name("node1"), EpAddr.from_name("NODE2"))
        assert first.status == AcmStatus.SUCCESS
        check_path(c, "node1", "node2", first.paths[0])
        second = await c["node1"].resolve(name("node1"), EpAddr.from_name("Node2"))
        assert second.status == AcmStatus.SUCCESS
        assert c.acm_requests() == 1


async def test_unknown_address_times_out_after_the_acm_budget(autojump_clock: object) -> None:
    async with cluster(3) as c:
        start = trio.current_time()
        result = await c["node1"].resolve(ipv4(c.world, "node1"), EpAddr.from_ip("10.9.9.9"))
        elapsed = trio.current_time() - start
        assert result.status == AcmStatus.ETIMEDOUT
        # 3 transmissions x (2000 ms + 2^(18-8) ms subnet timeout)
        assert c.acm_requests() == 3
        assert elapsed == pytest.approx(3 * 3.024, abs=0.05)
        assert c["node1"].counters()[Counter.ERROR] == 1


async def test_local_addresses_resolve_from_loopback_entries(autojump_clock: object) -> None:
    async with cluster(2) as c:
        result = await c["node1"].resolve(ipv4(c.world, "node1"), name("node1"))
        assert result.status == AcmStatus.SUCCESS
        check_path(c, "node1", "node1", result.paths[0])
        assert result.paths[0].mtu == 5 and result.paths[0].rate == 16
        assert c.acm_requests() == 0 and c.sa_path_queries() == 0


async def test_loopback_none_resolves_itself_through_the_fabric(autojump_clock: object) -> None:
    from ibacm.config.option_values import LoopbackProt

    async with cluster(2, options(loopback_prot=LoopbackProt.NONE)) as c:
        result = await c["node1"].resolve(ipv4(c.world, "node1"), name("node1"))
        assert result.status == AcmStatus.SUCCESS
        check_path(c, "node1", "node1", result.paths[0])
        assert c.acm_requests() == 1


async def test_nodelay_answers_enodata_then_the_cache(autojump_clock: object) -> None:
    async with cluster(3) as c:
        node1 = c["node1"]
        start = trio.current_time()
        first = await node1.resolve(
            ipv4(c.world, "node1"), ipv4(c.world, "node2"), flags=EpFlag.NODELAY
        )
        assert first.status == AcmStatus.ENODATA
        assert trio.current_time() == start  # at once
        await trio.sleep(1)
        second = await node1.resolve(
            ipv4(c.world, "node1"), ipv4(c.world, "node2"), flags=EpFlag.NODELAY
        )
        assert second.status == AcmStatus.SUCCESS
        counters = node1.counters()
        assert counters[Counter.NODATA] == 1 and counters[Counter.ROUTE_CACHE] == 1


async def test_parked_requests_share_one_resolution(autojump_clock: object) -> None:
    async with cluster(3) as c:
        results = []

        async def ask() -> None:
            results.append(await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2")))

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(ask)
        assert [r.status for r in results] == [AcmStatus.SUCCESS] * 10
        assert c.acm_requests() == 1 and c.sa_path_queries() == 2


async def test_resolve_depth_limits_requests_in_flight(autojump_clock: object) -> None:
    class Watched(dict[int, PendingQuery]):
        most = 0

        def __setitem__(self, key: int, value: PendingQuery) -> None:
            super().__setitem__(key, value)
            Watched.most = max(Watched.most, len(self))

    async with cluster(6) as c:
        endpoint = c.endpoint("node1")
        endpoint.outstanding = Watched()

        async def ask(dst: str) -> None:
            result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, dst))
            assert result.status == AcmStatus.SUCCESS

        async with trio.open_nursery() as asks:
            for dst in ("node2", "node3", "node4", "node5", "node6"):
                asks.start_soon(ask, dst)
        assert Watched.most == 1
        assert c.acm_requests() == 5


async def test_path_form_by_lid_and_gid_queries_the_sa(autojump_clock: object) -> None:
    async with cluster(3) as c:
        node3 = c.world.node("node3")
        by_lid = await c["node1"].resolve_path(PathRecord(dlid=node3.lids[0], reversible=True))
        assert by_lid.status == AcmStatus.SUCCESS
        check_path(c, "node1", "node3", by_lid.paths[0])
        by_gid = await c["node1"].resolve_path(PathRecord(dgid=node3.gids[0]))
        assert by_gid.status == AcmStatus.SUCCESS
        check_path(c, "node1", "node3", by_gid.paths[0])
        assert c.acm_requests() == 0 and c.sa_path_queries() == 2
        again = await c["node1"].resolve_path(PathRecord(dlid=node3.lids[0]))
        assert again.paths == by_lid.paths and c.sa_path_queries() == 2
        missing = await c["node1"].resolve_path(PathRecord(dlid=999))
        assert missing.status == AcmStatus.ENODATA  # SA "no records" passed through


async def test_query_sa_passes_the_record_through_and_caches_nothing(
    autojump_clock: object,
) -> None:
    async with cluster(3) as c:
        node2 = c.world.node("node2")
        for _ in range(2):
            status, record = await c["node1"].query_sa(
                PathRecord(dlid=node2.lids[0], slid=c.world.node("node1").lids[0])
            )
            assert status == AcmStatus.SUCCESS and record is not None
            assert record.dlid == node2.lids[0]
        assert c.sa_path_queries() == 2
        status, record = await c["node1"].query_sa(PathRecord(dlid=4000))
        assert status == 3 and record is not None  # no records, record still returned
        counters = c["node1"].counters()
        assert counters[Counter.ROUTE_QUERY] == 3 and counters[Counter.ERROR] == 1
        assert counters[Counter.RESOLVE] == 0


async def test_own_gid_and_lid_resolve_like_local_addresses(autojump_clock: object) -> None:
    async with cluster(2) as c:
        for dest in (gid(c.world, "node1"), lid(c.world, "node1")):
            result = await c["node1"].resolve(ipv4(c.world, "node1"), dest)
            assert result.status == AcmStatus.SUCCESS
            check_path(c, "node1", "node1", result.paths[0])
        assert c.acm_requests() == 0


async def test_removed_address_is_no_longer_local(autojump_clock: object) -> None:
    async with cluster(2) as c:
        node1 = c["node1"]
        v6 = ipv6(c.world, "node1")
        ctx = node1.address_ctx(v6.type, v6.info)
        node1.provider.remove_address(ctx)
        result = await node1.resolve(ipv4(c.world, "node1"), v6)
        assert result.status == AcmStatus.ETIMEDOUT  # nobody owns it any more
        assert c.acm_requests() == 3


async def test_flush_and_describe_for_the_admin_socket(autojump_clock: object) -> None:
    async with cluster(3) as c:
        node1 = c["node1"]
        for dst in ("node2", "node3"):
            assert (await node1.resolve(ipv4(c.world, "node1"), ipv4(c.world, dst))).status == 0
        described = node1.provider.describe_endpoint(node1.endpoint_ctx)
        assert described["state"] == "ready"
        assert described["groups"][0]["state"] == "joined"
        addresses = {entry["dest"] for entry in described["cache"]}
        assert {"10.0.0.2", "10.0.0.3", "node1"} <= addresses
        dest = ipv4(c.world, "node2")
        assert node1.provider.flush(node1.endpoint_ctx, (AddrType.IP, dest.info)) == 1
        assert node1.provider.flush(node1.endpoint_ctx, (AddrType.IP, dest.info)) == 0
        assert node1.provider.flush(node1.endpoint_ctx) == 1  # node3; local entries stay
        published = [data for kind, data in node1.core.events if kind == "cache"]
        assert any(d["dest"] == "10.0.0.3" and d["state"] == "READY" for d in published)
        assert any(d["dest"] == "10.0.0.2" and d.get("removed") for d in published)
        local = await node1.resolve(ipv4(c.world, "node1"), name("node1"))
        assert local.status == AcmStatus.SUCCESS
        again = await node1.resolve(ipv4(c.world, "node1"), dest)
        assert again.status == AcmStatus.SUCCESS and c.acm_requests() == 3


async def test_each_partition_has_its_own_endpoint_and_group(autojump_clock: object) -> None:
    async with cluster(3, pkeys=(0xFFFF, 0x8001)) as c:
        endpoints = [
            ctx for _, ctx in c["node1"].first_port.endpoints if isinstance(ctx, AcmpEndpoint)
        ]
        assert [e.pkey for e in endpoints] == [0xFFFF, 0x8001]
        with trio.fail_after(30):
            while not all(e.ready for e in endpoints):
                await trio.sleep(0.01)
        mgids = [e.group0.mgid.hex() for e in endpoints]
        assert mgids == [
            "ff154001ffff00030400000000000000",
            "ff154001800100030400000000000000",
        ]
        result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        assert result.status == AcmStatus.SUCCESS and result.paths[0].pkey == 0xFFFF
        other = endpoints[1]
        assert other.stats.requests_received == 0


async def test_a_route_from_the_group_is_aimed_at_the_peer_when_asked_for(
    autojump_clock: object,
) -> None:
    """route_prot acm: the entry keeps the shared group record, not a PathRecord of its own
    (a job start of N nodes held N-1 of them per daemon); the route read from it is the
    group's aimed at the peer."""
    async with cluster(4, options(route_prot=RouteProt.ACM)) as c:
        await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node3"))
        key = cache_key(AddrType.IP, bytes(ipv4(c.world, "node1").info))
        entry = c.endpoint("node2").cache.get(key)
        assert entry is not None and entry.state is EntryState.READY
        group = c.endpoint("node2").joined[entry.mgid]
        assert entry.group_route is group.route and entry._path is None
        assert group.route is not None and group.route.record is group.path
        path = entry.path
        assert path is not None and path is not entry.path  # made when asked for, not kept
        # A cache hit's answer is the same bytes, put together without building the record.
        assert entry.packed_path() == path.encode()
        node1 = c.world.node("node1")
        assert (path.dgid, path.dlid) == (node1.gids[0], node1.lids[0])
        assert path.encode()[:8] == group.path.encode()[:8]  # the group's record otherwise
        assert path.mtu == group.path.mtu and path.rate == group.path.rate
        result = await c["node2"].resolve(ipv4(c.world, "node2"), ipv4(c.world, "node1"))
        assert result.status == AcmStatus.SUCCESS and result.paths[0].dlid == node1.lids[0]

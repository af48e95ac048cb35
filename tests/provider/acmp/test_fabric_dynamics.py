"""ibacmp when the fabric misbehaves or changes: loss, SA outages and BUSY, port flaps, SM
and LID changes, client reregister, and bad MADs from peers (behavior.md §5, §9, §13)."""

from __future__ import annotations

import pytest
import trio

from ibacm.config.option_values import RouteProt
from ibacm.config.options import Options
from ibacm.fabric.api import AddressVector, UdQp
from ibacm.fabric.sim.world import SimWorld
from ibacm.provider.acmp.entry import EntryState
from ibacm.provider.acmp.keys import cache_key
from ibacm.provider.api import Counter, ResolveResult
from ibacm.wire.acm_mad import AcmMad, acm_request, acm_response
from ibacm.wire.client import AcmStatus, AddrType, EpAddr
from ibacm.wire.path_record import PathRecord
from tests.provider.acmp.harness import Cluster, cluster, ipv4, ipv6, name

pytestmark = pytest.mark.trio

ACM_BUDGET = 3 * (2.0 + 1.024)  # 3 transmissions x (timeout + 2^(18-8) ms)
SA_BUDGET = 3 * 2.0


def options(**changes: object) -> Options:
    opts = Options()
    for key, value in changes.items():
        setattr(opts, key, value)
    return opts


def joins(world: SimWorld) -> int:
    return world.count(0x03, 0x02, 0x38)


async def test_ten_percent_loss_still_resolves(autojump_clock: object) -> None:
    async with cluster(6, options(retries=3), seed=7) as c:
        c.world.faults.loss = 0.1
        names = c.world.node_names
        for src in names:
            for dst in names:
                if src != dst:
                    result = await c[src].resolve(ipv4(c.world, src), ipv4(c.world, dst))
                    assert result.status == AcmStatus.SUCCESS, (src, dst)
        assert c.world.stats["lost"] > 0


async def test_sa_down_gives_etimedout_within_the_budgets(autojump_clock: object) -> None:
    async with cluster(4) as c:
        assert (
            await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node3"))
        ).status == 0
        c.world.faults.sa_down = True
        # Address known (overheard), route phase only: one SA budget.
        start = trio.current_time()
        result = await c["node2"].resolve(ipv4(c.world, "node2"), ipv4(c.world, "node1"))
        assert result.status == AcmStatus.ETIMEDOUT
        assert trio.current_time() - start == pytest.approx(SA_BUDGET, abs=0.01)
        # Address unknown: the responder cannot get its route, so nobody answers.
        start = trio.current_time()
        result = await c["node2"].resolve(ipv4(c.world, "node2"), ipv4(c.world, "node4"))
        assert result.status == AcmStatus.ETIMEDOUT
        assert trio.current_time() - start <= ACM_BUDGET + SA_BUDGET
        assert c["node2"].counters()[Counter.ERROR] == 2
        # The SA is back: the same resolution works (failures are not cached).
        c.world.faults.sa_down = False
        result = await c["node2"].resolve(ipv4(c.world, "node2"), ipv4(c.world, "node4"))
        assert result.status == AcmStatus.SUCCESS


async def test_route_acm_does_not_need_the_sa(autojump_clock: object) -> None:
    async with cluster(4, options(route_prot=RouteProt.ACM)) as c:
        c.world.faults.sa_down = True
        result = await c["node2"].resolve(ipv4(c.world, "node2"), ipv4(c.world, "node4"))
        assert result.status == AcmStatus.SUCCESS


async def test_sa_busy_is_retried_after_a_backoff(autojump_clock: object) -> None:
    async with cluster(3) as c:
        c.world.faults.sa_busy = 0.6
        for dst in ("node2", "node3"):
            result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, dst))
            assert result.status == AcmStatus.SUCCESS
        assert c.world.stats["sa_busy"] > 0
        retried = sum(c[n].port_ctx.sa.busy_retries for n in c.nodes)
        assert retried == c.world.stats["sa_busy"]


async def test_failed_joins_are_retried_and_not_ready_means_enodata(
    autojump_clock: object,
) -> None:
    async with cluster(3, ready=False, faults={"sa_down": True}) as c:
        await trio.sleep(30)
        assert not c.endpoint("node1").ready
        result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        assert result.status == AcmStatus.ENODATA
        assert c["node1"].counters()[Counter.NODATA] == 1
        attempts = c.endpoint("node1").group0.attempts
        assert attempts >= 2
        c.world.faults.sa_down = False
        await c.wait_ready()
        result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        assert result.status == AcmStatus.SUCCESS


async def test_port_flap_fails_parked_requests_and_rejoins(autojump_clock: object) -> None:
    async with cluster(4) as c:
        results: list[ResolveResult] = []

        async def ask() -> None:
            source = ipv4(c.world, "node1")
            results.append(await c["node1"].resolve(source, EpAddr.from_ip("10.0.9.9")))

        joined = joins(c.world)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            await trio.sleep(1.0)
            start = trio.current_time()
            nursery.start_soon(c.world.port_flap, "node1", "mlx5_0", 1, 5.0)
            with trio.fail_after(1):
                while not results:
                    await trio.sleep(0.001)
            assert trio.current_time() - start < 0.1  # failed at once, not after the timeout
        assert results[0].status == AcmStatus.ENODATA
        assert not c["node1"].ports  # still down
        await trio.sleep(5)
        await c.wait_ready()
        assert joins(c.world) > joined  # the reopened endpoint joined again
        result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        assert result.status == AcmStatus.SUCCESS


async def test_client_reregister_rejoins_and_keeps_the_cache(autojump_clock: object) -> None:
    async with cluster(3) as c:
        assert (
            await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        ).status == 0
        joined = joins(c.world)
        c.world.client_reregister("node1")
        await trio.sleep(0.001)
        await c.wait_ready()
        assert joins(c.world) > joined
        again = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        assert again.status == AcmStatus.SUCCESS
        assert c.acm_requests() == 1


async def test_sm_change_drops_routes_but_keeps_addresses(autojump_clock: object) -> None:
    async with cluster(4) as c:
        assert (
            await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        ).status == 0
        queries = c.sa_path_queries()
        c.world.move_sm("node3")
        await trio.sleep(0.001)
        await c.wait_ready()
        result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        assert result.status == AcmStatus.SUCCESS
        assert c.sa_path_queries() == queries + 1  # the route again, from the new SM
        assert c.acm_requests() == 1  # the address was kept


async def test_lid_change_drops_routes_that_start_at_the_old_lid(autojump_clock: object) -> None:
    async with cluster(3) as c:
        assert (
            await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        ).status == 0
        c.world.set_lid("node1", "mlx5_0", 1, 100)
        await trio.sleep(0.001)
        await c.wait_ready()
        result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        assert result.status == AcmStatus.SUCCESS
        assert result.paths[0].slid == 100
        assert c.acm_requests() == 1


async def test_cache_bound_evicts_least_recently_used(autojump_clock: object) -> None:
    async with cluster(6, options(cache_max_entries=3)) as c:
        node1 = c["node1"]
        for dst in ("node2", "node3", "node4", "node5"):
            assert (await node1.resolve(ipv4(c.world, "node1"), ipv4(c.world, dst))).status == 0
        cache = c.endpoint("node1").cache
        assert len(list(cache.learned())) == 3
        assert cache.evicted == 1
        requests = c.acm_requests()
        # node2 was the least recently used: asking for it again goes to the fabric.
        assert (await node1.resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))).status == 0
        assert c.acm_requests() == requests + 1
        # every node also bounds what it overhears
        assert all(len(list(c.endpoint(n).cache.learned())) <= 3 for n in c.nodes)


async def test_address_lifetime_expires_in_the_background(autojump_clock: object) -> None:
    async with cluster(3, options(addr_timeout=1)) as c:
        assert (
            await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        ).status == 0
        key = cache_key(AddrType.IP, ipv4(c.world, "node2").info)
        cache = c.endpoint("node1").cache
        assert cache.get(key) is not None
        await trio.sleep(61)
        assert cache.get(key) is None  # removed without anyone asking
        assert cache.expired >= 1
        assert (
            await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        ).status == 0
        assert c.acm_requests() == 2


async def test_route_lifetime_requeries_only_the_route(autojump_clock: object) -> None:
    async with cluster(3, options(route_timeout=1)) as c:
        assert (
            await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        ).status == 0
        queries = c.sa_path_queries()
        await trio.sleep(61)
        entry = c.endpoint("node1").cache.get(cache_key(AddrType.IP, ipv4(c.world, "node2").info))
        assert entry is not None and entry.state is EntryState.ADDR_RESOLVED
        assert (
            await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        ).status == 0
        assert c.acm_requests() == 1
        assert c.sa_path_queries() == queries + 1
        assert c["node1"].counters()[Counter.ADDR_CACHE] == 1


# -- peers that are not ibacmp ------------------------------------------------------------


async def _raw_qp(c: Cluster, node: str) -> UdQp:
    fabric = c.world.fabric(node)
    device = (await fabric.open())[0]
    return await device.port(1).open_ud(0, recv_depth=16)


async def test_a_c_style_request_is_answered_with_the_shared_group(
    autojump_clock: object,
) -> None:
    async with cluster(4, start=["node1", "node2", "node3"]) as c:
        qp = await _raw_qp(c, "node4")
        target = c.endpoint("node1")
        node1, node4 = c.world.node("node1"), c.world.node("node4")
        unknown_group = bytes.fromhex("ff154001ffff00070500000000000000")
        request = acm_request(
            0x1234,
            AddrType.IP,
            ipv4(c.world, "node1").info,
            AddrType.IP,
            ipv4(c.world, "node4").info,
            [target.group0.mgid, unknown_group],
        )
        av = AddressVector(dlid=node1.lids[0], dgid=node1.gids[0])
        await qp.send(request.encode(), av, target.qpn)
        with trio.fail_after(10):
            received = await qp.receive()
        response = AcmMad.decode(received.mad)
        assert received.mad[:8] == bytes.fromhex("012c018100000001")
        assert response.tid == 0x1234 and response.acm_status == 0
        assert response.gids == [target.group0.mgid]
        assert received.sgid == node1.gids[0] and received.src_qp == target.qpn
        # node1 learned node4 and its route (it asked the SA before answering, as C does).
        entry = target.cache.get(cache_key(AddrType.IP, ipv4(c.world, "node4").info))
        assert entry is not None and entry.path is not None
        assert entry.state is EntryState.READY and entry.path.dlid == node4.lids[0]
        assert entry.remote_qpn == qp.qpn


async def test_bad_mads_and_foreign_responses_are_counted_and_dropped(
    autojump_clock: object,
) -> None:
    async with cluster(4, start=["node1", "node2", "node3"]) as c:
        qp = await _raw_qp(c, "node4")
        target = c.endpoint("node1")
        node1 = c.world.node("node1")
        av = AddressVector(dlid=node1.lids[0], dgid=node1.gids[0])
        too_many_gids = bytearray(
            acm_request(1, AddrType.IP, bytes(4), AddrType.IP, bytes(4), []).encode()
        )
        too_many_gids[20] = 7  # gid_cnt 7: more MGIDs than fit (C defect 38)
        bad_version = bytearray(acm_response(2, target.group0.mgid).encode())
        bad_version[2] = 2
        for mad in (bytes(too_many_gids), bytes(bad_version), bytes(256)):
            await qp.send(mad, av, target.qpn)
        await qp.send(acm_response(0x777, target.group0.mgid).encode(), av, target.qpn)
        await trio.sleep(0.1)
        assert target.stats.bad_mads == 3
        assert target.stats.unmatched_responses == 1
        result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        assert result.status == AcmStatus.SUCCESS


async def test_a_response_from_another_gid_than_asked_is_ignored(autojump_clock: object) -> None:
    async with cluster(4, start=["node1", "node2", "node3"]) as c:
        qp = await _raw_qp(c, "node4")
        target = c.endpoint("node1")
        node1 = c.world.node("node1")
        results = []

        async def ask() -> None:
            dest = EpAddr.from_gid(c.world.node("node2").gids[0])
            results.append(await c["node1"].resolve(ipv4(c.world, "node1"), dest))

        async with trio.open_nursery() as nursery:
            c.world.faults.sa_down = True  # node2 cannot answer before its route is known
            nursery.start_soon(ask)
            await trio.sleep(0.5)
            (tid,) = target.outstanding
            forged = acm_response(tid, target.group0.mgid).encode()
            av = AddressVector(dlid=node1.lids[0], dgid=node1.gids[0])
            await qp.send(forged, av, target.qpn)
            await trio.sleep(0.1)
            assert target.stats.unmatched_responses == 1
            c.world.faults.sa_down = False
        assert results[0].status == AcmStatus.SUCCESS
        assert results[0].paths[0].dgid == c.world.node("node2").gids[0]


async def test_path_form_nodelay_is_answered_at_once(autojump_clock: object) -> None:
    from ibacm.wire.client import EpFlag

    async with cluster(3) as c:
        dlid = c.world.node("node3").lids[0]
        first = await c["node1"].resolve_path(PathRecord(dlid=dlid), flags=EpFlag.NODELAY)
        assert first.status == AcmStatus.ENODATA
        await trio.sleep(1)
        second = await c["node1"].resolve_path(PathRecord(dlid=dlid), flags=EpFlag.NODELAY)
        assert second.status == AcmStatus.SUCCESS


def same_form(world: SimWorld, node: str, dest: EpAddr) -> EpAddr:
    """``node``'s own address of the form of ``dest`` (the source of such a request)."""
    if dest.type == AddrType.NAME:
        return name(node)
    return ipv4(world, node) if dest.type == AddrType.IP else ipv6(world, node)


@pytest.mark.parametrize("route_prot", [RouteProt.SA, RouteProt.ACM])
async def test_a_remote_lid_change_reaches_every_cached_route_to_that_node(
    autojump_clock: object, route_prot: RouteProt
) -> None:
    """node2's LID changes; node1 has node2 cached under its IPv4, IPv6 and name. node2's next
    request (carrying its new LID) reaches node1 for one of those addresses only: every route
    to node2 must follow, not only that one (they used to keep the old LID until a flush)."""
    async with cluster(3, options(route_prot=route_prot)) as c:
        node1 = c["node1"]
        dests = (ipv4(c.world, "node2"), ipv6(c.world, "node2"), name("node2"))
        for dest in dests:
            assert (await node1.resolve(same_form(c.world, "node1", dest), dest)).status == 0
        c.world.set_lid("node2", "mlx5_0", 1, 200)
        await trio.sleep(0.001)
        await c.wait_ready()
        # node2 asks for node3 (from its IPv4): every node hears node2's new LID.
        c.endpoint("node2").cache.clear_learned()
        asked = await c["node2"].resolve(ipv4(c.world, "node2"), ipv4(c.world, "node3"))
        assert asked.status == 0
        for dest in dests:
            result = await node1.resolve(same_form(c.world, "node1", dest), dest)
            assert result.status == 0 and result.paths[0].dlid == 200, (dest, result)
        assert c.endpoint("node1").stats.peer_moves == 1


@pytest.mark.parametrize("route_prot", [RouteProt.SA, RouteProt.ACM])
async def test_a_node_whose_lid_changed_announces_itself(
    autojump_clock: object, route_prot: RouteProt
) -> None:
    """node2's LID changes and node2 resolves nothing afterwards: node1, which had node2
    cached under its IPv4, IPv6 and name, serves the new DLID at once (node2 multicast an
    ACM request for each of its addresses as its groups were joined again), without a flush;
    before, the old DLID was served until node2 happened to send a request of its own."""
    async with cluster(3, options(route_prot=route_prot)) as c:
        node1 = c["node1"]
        dests = (ipv4(c.world, "node2"), ipv6(c.world, "node2"), name("node2"))
        for dest in dests:
            assert (await node1.resolve(same_form(c.world, "node1", dest), dest)).status == 0
        requests = c.acm_requests()
        c.world.set_lid("node2", "mlx5_0", 1, 200)
        await trio.sleep(0.001)
        await c.wait_ready()
        await trio.sleep(0.1)  # the announcements go out once the groups are joined
        assert c.endpoint("node2").stats.announcements >= len(dests)
        for dest in dests:
            result = await node1.resolve(same_form(c.world, "node1", dest), dest)
            assert result.status == 0 and result.paths[0].dlid == 200, (dest, result)
        # Learned from the announcements: no ACM request of node1's was needed.
        assert c.acm_requests() == requests
        # Nobody answers an announcement (nobody else claims node2's addresses).
        assert c.endpoint("node2").stats.unmatched_responses == 0


async def test_client_reregister_announces_the_addresses_again(autojump_clock: object) -> None:
    async with cluster(3) as c:
        assert (
            await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        ).status == 0
        c.world.client_reregister("node2")
        await trio.sleep(0.001)
        await c.wait_ready()
        await trio.sleep(0.1)
        assert c.endpoint("node2").stats.announcements >= 3  # IPv4, IPv6, name
        assert c.endpoint("node3").stats.announcements == 0
        again = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        assert (
            again.status == AcmStatus.SUCCESS
            and again.paths[0].dlid == (c.world.node("node2").lids[0])
        )


async def test_a_resolution_before_group_0_is_joined_says_why_it_got_enodata(
    autojump_clock: object,
) -> None:
    """The ENODATA seen once at 40,000 nodes (tests.bench.scale, own processes): the SA
    answered a daemon's join BUSY under load, the join waited for its retry, and a client asked
    meanwhile. That is the documented answer of an endpoint without group 0 (as C); the
    failure now says so, in the log and in the admin snapshot."""
    async with cluster(3, faults={"sa_busy": 1.0}, ready=False) as c:
        await trio.sleep(0.5)  # the first joins were answered BUSY; their retries wait
        endpoint = c.endpoint("node1")
        assert not endpoint.ready
        result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        assert result.status == AcmStatus.ENODATA
        (failure,) = endpoint.describe()["recent_failures"]
        assert failure["dest"] == "10.0.0.2" and failure["status"] == AcmStatus.ENODATA
        assert "not joined its multicast group 0" in failure["reason"]
        c.world.faults.sa_busy = 0.0
        await c.wait_ready()
        result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        assert result.status == AcmStatus.SUCCESS


async def test_a_failed_resolution_keeps_its_cause(autojump_clock: object) -> None:
    async with cluster(3, start=["node1", "node2"]) as c:
        # node3 runs no daemon: nobody answers, the address phase spends its budget.
        result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node3"))
        assert result.status == AcmStatus.ETIMEDOUT
        (failure,) = c.endpoint("node1").describe()["recent_failures"]
        assert failure["dest"] == "10.0.0.3" and failure["status"] == AcmStatus.ETIMEDOUT
        assert failure["reason"].startswith("no answer to the ACM request within")

"""The route table ibacmp publishes for the client loop (``AcmpProvider.route_table``).

The client loop answers cache hits from it in its own thread, with no provider code on the
way: whatever changes the cache, the table must answer exactly what ``resolve`` would answer
at once. ``assert_table_agrees`` checks that after each way an entry enters or leaves READY
(or changes its route or lifetimes, or leaves the cache), on real providers over the
simulated fabric: the table holds exactly the READY entries while the endpoint is ready,
each with its packed route and expiry, and every destination it answers ``resolve`` answers
the same, and the other way round.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import trio

from ibacm.config.option_values import AddrPreload, RoutePreload, RouteProt
from ibacm.config.options import Options
from ibacm.fabric.api import ReceivedMad
from ibacm.provider.acmp.cache import DestCache
from ibacm.provider.acmp.endpoint import AcmpEndpoint
from ibacm.provider.acmp.entry import DestEntry, EntryState
from ibacm.provider.acmp.keys import (
    IP,
    NAME,
    cache_key,
    describe_key,
    key_address,
    key_type,
    table_key,
)
from ibacm.provider.api import Counter
from ibacm.provider.route_table import Hit, RouteTable
from ibacm.wire.acm_mad import acm_request
from ibacm.wire.client import AcmStatus, AddrType, EpAddr, EpFlag
from ibacm.wire.path_record import PathRecord
from tests.provider.acmp.harness import Cluster, Node, cluster, ipv4, ipv6, name

ROUTE = PathRecord(dlid=7, sl=1)
TABLE_TYPES = (AddrType.NAME, AddrType.IP, AddrType.IP6)
"""Destination types the table may answer (a GID or LID goes to ``resolve``)."""


def options(**changes: object) -> Options:
    opts = Options()
    for key, value in changes.items():
        setattr(opts, key, value)
    return opts


def table_of(node: Node) -> RouteTable:
    table = node.provider.route_table(node.source_ctx())
    assert isinstance(table, RouteTable)
    return table


def mismatches(endpoint: AcmpEndpoint) -> list[str]:
    """How the table differs from the cache's READY entries (none while not ready)."""
    cache = endpoint.cache
    expected: dict[bytes, tuple[bytes | None, float]] = {}
    if endpoint.ready:
        for entry in cache:
            if entry.state is EntryState.READY:
                expiry = math.inf if entry.loopback else min(entry.addr_expiry, entry.route_expiry)
                expected[entry.key] = (entry.packed_path(), expiry)
    routes = cache.table.routes
    actual = {key: (hit.packed, hit.expiry) for key, hit in routes.items()}
    problems = [
        f"{key!r}: table {actual.get(key)} cache {expected.get(key)}"
        for key in expected.keys() | actual.keys()
        if actual.get(key) != expected.get(key)
    ]
    for key, hit in routes.items():
        cached = cache.get(key)
        if cached is None or cached.hit is not hit:
            problems.append(f"{key!r}: the table's Hit is not its entry's")
    return problems


def dest_of(key: bytes) -> EpAddr:
    return EpAddr(0, AddrType(key_type(key)), key_address(key).ljust(64, b"\0"))


def shown(dest: EpAddr) -> str:
    return describe_key(cache_key(dest.type, dest.info))


def own_addresses(c: Cluster, node: str) -> set[str]:
    """What the loopback entries of ``node`` answer."""
    return {shown(ipv4(c.world, node)), shown(ipv6(c.world, node)), node}


async def assert_table_agrees(node: Node, *extra: EpAddr) -> set[str]:
    """The table equals the cache's READY entries, and for each destination it holds (and
    ``extra``) answers what ``resolve`` (NODELAY) answers at once. Returns the
    destinations it answered."""
    endpoint = node.endpoint_ctx
    assert mismatches(endpoint) == []
    table = table_of(node)
    source = node.first_port.addresses[0][0]
    source_addr = EpAddr(0, source.type, source.info)
    dests = [dest_of(key) for key in table.routes if key_type(key) in TABLE_TYPES]
    answered: set[str] = set()
    for dest in (*dests, *extra):
        hit = table.find(dest.type, dest.info, trio.current_time())
        result = await node.resolve(source_addr, dest, flags=EpFlag.NODELAY)
        if hit is not None:
            answered.add(shown(dest))
            assert result.status == AcmStatus.SUCCESS, (dest, result)
            assert result.paths[0].encode() == hit.packed, dest
        elif result.status == AcmStatus.SUCCESS and table_key(dest.type, dest.info):
            # Answered at once from an ADDR_RESOLVED entry (a route at hand): READY now,
            # and so in the table.
            again = table.find(dest.type, dest.info, trio.current_time())
            assert again is not None and again.packed == result.paths[0].encode(), dest
    assert mismatches(endpoint) == []
    return answered


async def resolve_ok(c: Cluster, src: str, dest: EpAddr) -> None:
    result = await c[src].resolve(ipv4(c.world, src), dest)
    assert result.status == AcmStatus.SUCCESS, result


# -- every transition -----------------------------------------------------------------


@pytest.mark.trio
async def test_resolutions_loopback_flush_sm_change_and_gid_out_keep_the_table_true(
    autojump_clock: object,
) -> None:
    async with cluster(4) as c:
        node1, world = c["node1"], c.world
        table = table_of(node1)
        assert table is c.endpoint("node1").cache.table  # one object for the endpoint
        own = ipv4(world, "node1")
        # Loopback entries: our own addresses, for good.
        own_hit = table.find(own.type, own.info, trio.current_time())
        assert own_hit is not None and own_hit.expiry == math.inf
        loopback = own_addresses(c, "node1")
        assert await assert_table_agrees(node1, own) == loopback
        # Resolutions done.
        learned = (ipv4(world, "node2"), ipv6(world, "node2"), name("node3"))
        for dest in learned:
            await resolve_ok(c, "node1", dest)
        assert await assert_table_agrees(node1) == loopback | {shown(d) for d in learned}
        # A GID or LID destination is never answered by the table (it may be our port's).
        gid2 = EpAddr.from_gid(world.node("node2").gids[0])
        await resolve_ok(c, "node1", gid2)
        assert table.find(gid2.type, gid2.info, trio.current_time()) is None
        assert table_key(AddrType.GID, gid2.info) is None
        assert table_key(AddrType.LID, gid2.info) is None
        assert table_key(0x33, b"x") is None  # not a cache key: ``resolve`` says why
        await assert_table_agrees(node1, gid2)
        # Flush one destination, then all.
        ep_ctx = node1.endpoint_ctx
        assert node1.provider.flush(ep_ctx, (AddrType.NAME, b"node3")) == 1
        assert table.find(AddrType.NAME, b"node3", trio.current_time()) is None
        await assert_table_agrees(node1, name("node3"))
        assert node1.provider.flush(ep_ctx) >= 3
        assert await assert_table_agrees(node1, ipv4(world, "node2")) == loopback
        # SM change: routes dropped, addresses kept.
        for dest in (ipv4(world, "node2"), ipv4(world, "node3")):
            await resolve_ok(c, "node1", dest)
        assert {describe_key(key) for key in table.routes} >= loopback | {"10.0.0.2", "10.0.0.3"}
        world.move_sm("node4")
        await trio.sleep(0.001)
        await c.wait_ready()
        assert await assert_table_agrees(node1) == loopback
        await resolve_ok(c, "node1", ipv4(world, "node2"))
        # Trap 65: what leads to node2's GID goes.
        await resolve_ok(c, "node1", ipv4(world, "node3"))
        assert ep_ctx.forget_gid(world.node("node2").gids[0]) >= 1
        answered = await assert_table_agrees(node1, ipv4(world, "node2"), ipv4(world, "node3"))
        assert answered == loopback | {shown(ipv4(world, "node3"))}


@pytest.mark.trio
async def test_the_endpoint_not_ready_or_closed_empties_the_table(autojump_clock: object) -> None:
    async with cluster(3) as c:
        node1, world = c["node1"], c.world
        await resolve_ok(c, "node1", ipv4(world, "node2"))
        table = table_of(node1)
        answered = own_addresses(c, "node1") | {shown(ipv4(world, "node2"))}
        assert await assert_table_agrees(node1) == answered
        # Client reregister: group 0 joined again; ENODATA meanwhile, from both sides.
        endpoint = node1.endpoint_ctx
        await endpoint.rejoin()
        assert not endpoint.ready and len(table.routes) == 0
        await assert_table_agrees(node1, ipv4(world, "node2"))
        await c.wait_ready()
        assert await assert_table_agrees(node1) == answered  # the cache was kept
        # A LID change closes and reopens the endpoint: routes start at the old LID.
        world.set_lid("node1", "mlx5_0", 1, 100)
        await trio.sleep(0.001)
        await c.wait_ready()
        assert table_of(node1) is table  # the cache, and its table, survive a reopening
        assert await assert_table_agrees(node1, ipv4(world, "node2")) == own_addresses(c, "node1")
        await resolve_ok(c, "node1", ipv4(world, "node2"))
        assert await assert_table_agrees(node1) == answered
        hit = table.find(AddrType.IP, ipv4(world, "node2").info, trio.current_time())
        assert hit is not None and PathRecord.decode(hit.packed).slid == 100
        # The port goes down: the endpoint closes.
        await node1.port_down(("mlx5_0", 1))
        assert not endpoint.ready and len(table.routes) == 0
        assert mismatches(endpoint) == []


@pytest.mark.trio
async def test_routes_learned_from_peers_and_peers_that_moved(autojump_clock: object) -> None:
    """route_prot acm: a peer's request makes the entry READY from the shared group (no
    resolution of ours); a request from a new QPN or LID sends it back to ADDR_RESOLVED
    and READY again, aimed at the new LID."""
    async with cluster(3, options(route_prot=RouteProt.ACM)) as c:
        world = c.world
        await resolve_ok(c, "node1", ipv4(world, "node2"))
        for node in ("node1", "node2", "node3"):
            await assert_table_agrees(c[node])
        node3 = c["node3"]
        overheard = table_of(node3).find(AddrType.IP, ipv4(world, "node1").info, 0.0)
        assert overheard is not None  # node3 only overheard node1's request
        # node2 moves to another LID and QP: its next request teaches node1 the new LID.
        endpoint1 = c.endpoint("node1")
        node2_ip = ipv4(world, "node2")
        request = acm_request(
            c["node2"].core.next_tid(),
            AddrType.IP,
            ipv4(world, "node3").info,
            AddrType.IP,
            node2_ip.info,
            list(endpoint1.joined),
        )
        received = ReceivedMad(request.encode(), world.node("node2").gids[0], bytes(16), 77, 4242)
        before = table_of(c["node1"]).find(AddrType.IP, node2_ip.info, trio.current_time())
        endpoint1.receive_mad(received, trio.current_time())
        after = table_of(c["node1"]).find(AddrType.IP, node2_ip.info, trio.current_time())
        assert before is not None and after is not None and after is not before
        assert PathRecord.decode(after.packed).dlid == 77
        await assert_table_agrees(c["node1"])


@pytest.mark.trio
async def test_preloads_and_a_restored_cache_are_in_the_table(
    autojump_clock: object, tmp_path: Path
) -> None:
    hosts, routes, saved = tmp_path / "hosts", tmp_path / "routes", tmp_path / "cache.json"
    async with cluster(4, start=[]) as c:
        world = c.world
        hosts.write_text(world.hosts_file())
        routes.write_text(world.route_dump())
        opts = options(
            addr_preload=AddrPreload.ACM_HOSTS,
            addr_data_file=str(hosts),
            route_preload=RoutePreload.OPENSM_FULL_V1,
            route_data_file=str(routes),
        )
        node1 = await c.add_node("node1", opts)
        for other in ("node2", "node3", "node4"):
            await c.add_node(other, Options())
        await c.wait_ready()
        preloaded = {shown(ipv4(world, n)) for n in ("node2", "node3", "node4")}
        assert await assert_table_agrees(node1) >= preloaded
        assert c.acm_requests() == 0 and c.sa_path_queries() == 0
        # A cache restored from the file (persistence).
        saving = options(cache_file=str(saved))
        await c["node2"].stop()
        del c.nodes["node2"]
        node2 = await c.add_node("node2", saving)
        await c.wait_ready()
        await resolve_ok(c, "node2", ipv4(world, "node3"))
        await node2.stop()
        del c.nodes["node2"]
        restarted = await c.add_node("node2", saving)
        await c.wait_ready()
        table = table_of(restarted)
        assert table.find(AddrType.IP, ipv4(world, "node3").info, trio.current_time())
        assert await assert_table_agrees(restarted) == own_addresses(c, "node2") | {
            shown(ipv4(world, "node3"))
        }


# -- lifetimes --------------------------------------------------------------------------


@pytest.mark.trio
async def test_the_table_stops_answering_at_the_route_and_address_deadlines(
    autojump_clock: object,
) -> None:
    async with cluster(3, options(route_timeout=1, addr_timeout=3)) as c:
        node1, world = c["node1"], c.world
        dest = ipv4(world, "node2")
        await resolve_ok(c, "node1", dest)
        ready_at = trio.current_time()
        table = table_of(node1)
        hit = table.find(dest.type, dest.info, ready_at)
        assert hit is not None and hit.expiry == pytest.approx(ready_at + 60)
        # Exactly at the deadline, before any sweep: no longer answered.
        assert table.find(dest.type, dest.info, hit.expiry - 1e-6) is hit
        assert table.find(dest.type, dest.info, hit.expiry) is None
        await trio.sleep_until(hit.expiry)
        assert table.find(dest.type, dest.info, trio.current_time()) is None
        await trio.sleep(1.5)  # the sweep (at most a second late) takes it out
        key = cache_key(AddrType.IP, dest.info)
        assert key not in table.routes
        entry = node1.endpoint_ctx.cache.get(key)
        assert entry is not None and entry.state is EntryState.ADDR_RESOLVED
        assert mismatches(node1.endpoint_ctx) == []
        # The route again: the Hit expires with the address now (3 minutes after learning).
        await resolve_ok(c, "node1", dest)
        hit = table.find(dest.type, dest.info, trio.current_time())
        assert hit is not None and hit.expiry == min(entry.addr_expiry, entry.route_expiry)
        await assert_table_agrees(node1)
        await trio.sleep_until(entry.addr_expiry + 1.5)
        assert key not in table.routes and node1.endpoint_ctx.cache.get(key) is None
        assert mismatches(node1.endpoint_ctx) == []


@pytest.mark.trio
async def test_an_address_lifetime_shorter_than_the_route_ends_the_hit_with_the_entry(
    autojump_clock: object,
) -> None:
    async with cluster(3, options(addr_timeout=1)) as c:
        node1, world = c["node1"], c.world
        dest = ipv4(world, "node2")
        await resolve_ok(c, "node1", dest)
        table = table_of(node1)
        hit = table.find(dest.type, dest.info, trio.current_time())
        assert hit is not None and hit.expiry < math.inf
        assert table.find(dest.type, dest.info, hit.expiry) is None
        await trio.sleep_until(hit.expiry + 1.5)
        key = cache_key(AddrType.IP, dest.info)
        assert node1.endpoint_ctx.cache.get(key) is None and key not in table.routes
        assert mismatches(node1.endpoint_ctx) == []


def test_expiry_on_use_and_a_local_address_take_the_hit_out() -> None:
    cache = DestCache()
    cache.set_serving(True)
    entry = cache.acquire(_ip(1))
    cache.make_ready(entry, 0.0, 60.0, math.inf, ROUTE)
    assert entry.hit is not None
    entry.hit.count += 2
    cache.check_lifetimes(entry, 59.0)
    assert _ip(1) in cache.table.routes
    cache.check_lifetimes(entry, 60.0)  # a lookup before the sweep: back to INIT
    assert entry.state is EntryState.INIT and _ip(1) not in cache.table.routes
    assert entry.hit is None and entry.total_hits == 2
    # A learned READY entry whose address becomes one of ours: the loopback entry answers.
    learned = cache.acquire(_ip(2))
    cache.make_ready(learned, 0.0, 60.0, math.inf, ROUTE)
    assert learned.hit is not None
    learned.hit.count += 1
    local = PathRecord(dlid=1)
    cache.put_loopback(DestEntry(_ip(2)), local, 1.0)
    hit = cache.table.routes[_ip(2)]
    assert hit.packed == local.encode() and hit.expiry == math.inf
    assert learned.hit is None and learned.hits == 1


def test_a_resolution_ending_on_a_removed_entry_publishes_nothing() -> None:
    cache = DestCache()
    cache.set_serving(True)
    entry = cache.acquire(_ip(1))
    entry.reply_tid = 9  # busy: a peer waits for the route
    assert cache.remove(_ip(1)) is entry  # e.g. the address became one of ours
    cache.make_ready(entry, 0.0, 60.0, math.inf, ROUTE)  # the SA's answer comes after
    assert len(cache.table.routes) == 0


# -- counters and admin hits --------------------------------------------------------------


@pytest.mark.trio
async def test_perf_query_per_endpoint_adds_the_hits_the_client_loop_answered(
    autojump_clock: object,
) -> None:
    async with cluster(2) as c:
        node1, world = c["node1"], c.world
        dest = ipv4(world, "node2")
        await resolve_ok(c, "node1", dest)
        before = node1.counters()
        table = table_of(node1)
        hit = table.find(dest.type, dest.info, trio.current_time())
        assert hit is not None
        # What the client loop writes when it answers 5 requests from the table.
        hit.count += 5
        table.hits += 5
        after = node1.counters()
        assert after[Counter.RESOLVE] == before[Counter.RESOLVE] + 5
        assert after[Counter.ROUTE_CACHE] == before[Counter.ROUTE_CACHE] + 5
        assert after[Counter.ADDR_QUERY] == before[Counter.ADDR_QUERY]
        described = node1.provider.describe_endpoint(node1.endpoint_ctx)
        assert described["counters"] == after
        # The global counters of those hits are the client loop's own tally, not ours.
        assert node1.core.counters.snapshot()[Counter.ROUTE_CACHE] == 0
        # The entry's admin hits: its own (one trio-side hit) and its Hit's.
        await resolve_ok(c, "node1", dest)
        (shown,) = [e for e in described_cache(node1) if e["dest"] == "10.0.0.2"]
        assert shown["hits"] == 6
        # A new route folds the old Hit's count into the entry.
        c.world.move_sm("node2")
        await trio.sleep(0.001)
        await c.wait_ready()
        await resolve_ok(c, "node1", dest)
        (shown,) = [e for e in described_cache(node1) if e["dest"] == "10.0.0.2"]
        assert shown["hits"] == 6


def described_cache(node: Node) -> list[dict[str, object]]:
    cache = node.provider.describe_endpoint(node.endpoint_ctx)["cache"]
    assert isinstance(cache, list)
    return cache


# -- the bound ----------------------------------------------------------------------------


def _ip(i: int) -> bytes:
    return cache_key(IP, bytes([10, 1, 0, i]))


def test_eviction_keeps_the_entries_the_table_hits() -> None:
    cache = DestCache(max_entries=4)
    cache.set_serving(True)
    entries = [cache.acquire(_ip(i)) for i in range(4)]
    for entry in entries:
        cache.make_ready(entry, 0.0, math.inf, math.inf, ROUTE)
    assert len(cache.table.routes) == 4
    # The client loop answers from entry 0's Hit (nobody looks it up on the trio side).
    hit = cache.table.find(IP, bytes([10, 1, 0, 0]), 1.0)
    assert isinstance(hit, Hit)
    hit.count += 1
    cache.acquire(_ip(4))  # over the bound: the oldest entry not used goes
    # (Checked without ``get``, which would count as a use.)
    assert {entry.key for entry in cache} == {_ip(0), _ip(2), _ip(3), _ip(4)}
    assert _ip(0) in cache.table.routes and _ip(1) not in cache.table.routes
    assert cache.evicted == 1
    # Used since the last pass means grown since then: entry 0's count is old news now.
    for i in (2, 3, 4):
        cache.get(_ip(i))
    cache.acquire(_ip(5))
    assert {entry.key for entry in cache} == {_ip(2), _ip(3), _ip(4), _ip(5)}
    # What stays in the map is exactly the READY entries left.
    assert set(cache.table.routes) == {_ip(2), _ip(3)}
    # The evicted entry's Hit count went into its own before it left.
    assert entries[0].hit is None and entries[0].hits == 1


def test_routes_are_replaced_never_changed_in_place() -> None:
    cache = DestCache()
    first = cache.table.routes
    cache.set_serving(True)
    entries = [cache.acquire(cache_key(NAME, f"n{i}".encode())) for i in range(3)]
    published = [cache.table.routes]
    for entry in entries:
        cache.make_ready(entry, 0.0, 60.0, math.inf, ROUTE)
        published.append(cache.table.routes)
    assert [len(routes) for routes in published] == [0, 1, 2, 3]
    assert len(first) == 0
    with cache.batch():
        for entry in entries:
            cache.set_state(entry, EntryState.ADDR_RESOLVED)
        assert len(cache.table.routes) == 3  # one replacement, when the batch ends
    assert len(cache.table.routes) == 0 and len(published[3]) == 3
    with pytest.raises(ValueError, match="make_ready"):
        cache.set_state(entries[0], EntryState.READY)
    # The packed route is made once, when the entry becomes READY: a new lifetime keeps it.
    cache.make_ready(entries[0], 0.0, 60.0, math.inf, ROUTE)
    packed = entries[0].hit.packed if entries[0].hit is not None else None
    assert entries[0].hit is not None
    entries[0].hit.count += 4  # the client loop's hits on the Hit being replaced
    cache.set_timeouts(entries[0], 30.0, 60.0, math.inf)
    assert entries[0].hit is not None and entries[0].hit.packed is packed
    assert entries[0].hit.expiry == 90.0 and entries[0].hit.count == 0
    assert entries[0].total_hits == 4 == entries[0].describe(31.0)["hits"]

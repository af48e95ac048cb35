"""Fabric events from the SM in ibacmp: subscription, and trap 65 dropping dead entries.

Each port subscribes to traps 64/65 when it comes up, again after an SM change or a client
reregister, and retries with a backoff while the SA refuses or does not answer. A Report for
a GID out of service is acknowledged and every entry that leads to that GID goes at once, so
the next request for it does not get the dead path from the cache.
"""

from __future__ import annotations

import ipaddress

import pytest
import trio

from ibacm.config.options import Options
from ibacm.provider.acmp.entry import EntryState
from ibacm.provider.acmp.events import BACKOFF_MAX
from ibacm.provider.acmp.keys import cache_key
from ibacm.wire.client import AcmStatus, AddrType
from ibacm.wire.mad import SaAttr
from ibacm.wire.notice import Notice, Trap, build_report
from tests.provider.acmp.harness import Cluster, cluster, ipv4

pytestmark = pytest.mark.trio

SET, INFORM_INFO, REPORT_RESP = 0x02, int(SaAttr.INFORM_INFO), 0x86


def subscriptions(c: Cluster) -> int:
    return c.world.count(0x03, SET, INFORM_INFO)


def subscribers(c: Cluster) -> set[int]:
    return {guid for guid, _info in c.world.sa.subscriptions}


def guid(c: Cluster, node: str) -> int:
    return c.world.port(node, "mlx5_0", 1).guid


def gid(c: Cluster, node: str) -> bytes:
    return c.world.port(node, "mlx5_0", 1).gid0


def sm_events(c: Cluster, node: str) -> dict[str, int | bool]:
    described = c[node].provider.describe_endpoint(c.endpoint(node))
    return dict(described["sm_events"])


async def settle(seconds: float = 1.0) -> None:
    await trio.sleep(seconds)


async def test_every_port_subscribes_to_traps_64_and_65(autojump_clock: object) -> None:
    async with cluster(3) as c:
        await settle()
        assert subscribers(c) == {guid(c, n) for n in ("node1", "node2", "node3")}
        assert {info.trap_num for info in c.world.sa.subscriptions.values()} == {64, 65}
        assert subscriptions(c) == 6
        assert sm_events(c, "node1")["subscribed"] is True


async def test_gid_out_of_service_drops_the_entries_that_lead_to_it(
    autojump_clock: object,
) -> None:
    async with cluster(4) as c:
        await settle()
        src, dead = ipv4(c.world, "node1"), ipv4(c.world, "node3")
        assert (await c["node1"].resolve(src, dead)).status == AcmStatus.SUCCESS
        assert (await c["node1"].resolve(src, ipv4(c.world, "node2"))).status == 0
        cache = c.endpoint("node1").cache
        dead_key = cache_key(AddrType.IP, dead.info)
        assert cache.get(dead_key) is not None
        acks_before = c.world.count(0x03, REPORT_RESP, int(SaAttr.NOTICE))
        c.world.set_port_state("node3", "mlx5_0", 1, False)
        await settle()
        # Gone without a flush; the entry of node2 stays.
        assert cache.get(dead_key) is None
        assert cache.get(cache_key(AddrType.IP, ipv4(c.world, "node2").info)) is not None
        events = sm_events(c, "node1")
        assert events["gid_out"] == 1 and events["dropped"] >= 1
        # Every subscriber acknowledged its Report: the SA sent none twice.
        assert c.world.count(0x03, REPORT_RESP, int(SaAttr.NOTICE)) - acks_before == 3
        assert c.world.stats["report_resent"] == 0 and not c.world.sa.unacked
        # The next request resolves afresh: node3 does not answer, a clear failure.
        result = await c["node1"].resolve(src, dead)
        assert result.status == AcmStatus.ETIMEDOUT
        assert ("acmp.sm_event", {"trap": 65, "gid": _text(gid(c, "node3")), "dropped": 1}) in (
            c["node1"].core.events
        )


async def test_a_configured_address_keeps_its_address_and_loses_its_route(
    autojump_clock: object,
) -> None:
    async with cluster(3) as c:
        await settle()
        src, dead = ipv4(c.world, "node1"), ipv4(c.world, "node3")
        assert (await c["node1"].resolve(src, dead)).status == 0
        endpoint = c.endpoint("node1")
        entry = endpoint.cache.get(cache_key(AddrType.IP, dead.info))
        assert entry is not None and entry.state is EntryState.READY
        # As a hosts-file preload leaves it: the address is known, the route comes from the SA.
        entry.query = entry.route_query()
        entry.learned_from = None
        c.world.set_port_state("node3", "mlx5_0", 1, False)
        await settle()
        kept = endpoint.cache.get(entry.key)  # the same entry, after the port went down
        assert kept is entry and kept.state is EntryState.ADDR_RESOLVED
        result = await c["node1"].resolve(src, dead)
        assert result.status == AcmStatus.ENODATA  # the SA has no path to a port that is down


async def test_resubscribed_after_sm_change_reregister_and_port_up(
    autojump_clock: object,
) -> None:
    async with cluster(4) as c:
        await settle()
        everyone = {guid(c, n) for n in ("node1", "node2", "node3", "node4")}
        first = subscriptions(c)
        c.world.move_sm("node2")  # SM_CHANGE then CLIENT_REREGISTER everywhere
        await settle()
        assert subscribers(c) == everyone
        assert subscriptions(c) > first
        c.world.sa.forget_subscriptions()
        c.world.client_reregister("node1")
        await settle()
        assert subscribers(c) == {guid(c, "node1")}
        await c.world.port_flap("node3", "mlx5_0", 1, 1.0, reregister=False)
        await settle()
        assert guid(c, "node3") in subscribers(c)
        # node1, subscribed again, heard about node3 and hears about node4 going away.
        c.world.set_port_state("node4", "mlx5_0", 1, False)
        await settle()
        events = sm_events(c, "node1")
        assert (events["gid_out"], events["gid_in"]) == (2, 1)
        assert c.world.stats["report_resent"] == 0


async def test_a_refused_subscription_is_retried_with_a_backoff(autojump_clock: object) -> None:
    async with cluster(2) as c:
        await settle()
        c.world.faults.sa_down = True
        c.world.sa.subscriptions.clear()  # a new SM that knows none
        c.world.client_reregister("node1")
        await trio.sleep(30)  # each attempt waits out the SA timeouts, then the backoff
        assert not c.world.sa.subscriptions
        assert sm_events(c, "node1")["refused"] >= 2
        c.world.faults.sa_down = False
        await trio.sleep(BACKOFF_MAX)
        assert guid(c, "node1") in subscribers(c)


async def test_the_joins_go_before_the_subscription(autojump_clock: object) -> None:
    # sa_depth 1: a subscription sent first would hold every port's group join back. While
    # the joins fail, no subscription is even tried.
    async with cluster(2, Options(), faults={"sa_down": True}, ready=False) as c:
        await trio.sleep(30)
        assert subscriptions(c) == 0 and "refused" not in sm_events(c, "node1")
        c.world.faults.sa_down = False
        await trio.sleep(BACKOFF_MAX)
        assert subscribers(c) == {guid(c, "node1"), guid(c, "node2")}


def _text(raw: bytes) -> str:
    return str(ipaddress.IPv6Address(raw))


async def test_a_garbled_report_is_counted_and_the_port_keeps_serving(
    autojump_clock: object,
) -> None:
    async with cluster(3) as c:
        await settle()
        runtime = c.world.port("node1", "mlx5_0", 1)
        notice = Notice.gid_trap(
            Trap.GID_OUT_OF_SERVICE, gid(c, "node3"), issuer_lid=1, issuer_gid=gid(c, "node2")
        )
        garbled = bytearray(build_report(77, notice))
        garbled[17] = 0x35  # a "Report" of a PathRecord
        for deliver in list(runtime.agents.values()):
            deliver(bytes(garbled))
        await settle()
        events = sm_events(c, "node1")
        assert events["bad_reports"] == 1 and events.get("gid_out", 0) == 0
        src, dst = ipv4(c.world, "node1"), ipv4(c.world, "node3")
        assert (await c["node1"].resolve(src, dst)).status == AcmStatus.SUCCESS
        # The same Report well formed is acted on, and once only when the SA sends it again.
        for _ in range(2):
            for deliver in list(runtime.agents.values()):
                deliver(build_report(78, notice))
            await settle()
        events = sm_events(c, "node1")
        assert (events["gid_out"], events["repeated"], events["acked"]) == (1, 1, 2)
        assert c.endpoint("node1").cache.get(cache_key(AddrType.IP, dst.info)) is None

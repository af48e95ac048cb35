"""``cache_max_entries`` bounds what a flood of new sources costs, not only the entry count
(issue: an evicted entry stayed in the cache's deadline lists for its 24-hour lifetime)."""

from __future__ import annotations

import gc
import ipaddress

import pytest
import trio

from ibacm.config.options import Options
from ibacm.fabric.api import AddressVector
from ibacm.provider.acmp.entry import DestEntry, EntryState
from ibacm.wire.acm_mad import acm_request
from ibacm.wire.client import AddrType
from tests.provider.acmp.harness import cluster, ipv4

pytestmark = pytest.mark.trio

BOUND = 10_000
SOURCES = 30_000
BATCH = 200


def _live_entries() -> int:
    gc.collect()
    return sum(1 for item in gc.get_objects() if isinstance(item, DestEntry))


async def test_spoofed_sources_beyond_the_bound_leave_nothing_behind(
    autojump_clock: object,
) -> None:
    opts = Options()
    opts.cache_max_entries = BOUND
    async with cluster(2, opts, start=["node1"]) as c:
        target = c.endpoint("node1")
        fabric = c.world.fabric("node2")
        device = (await fabric.open())[0]
        qp = await device.port(1).open_ud(0, recv_depth=16)
        node1 = c.world.node("node1")
        av = AddressVector(dlid=node1.lids[0], dgid=node1.gids[0])
        dest = ipv4(c.world, "node1").info
        base = int(ipaddress.IPv4Address("172.16.0.0"))
        live_at: dict[int, int] = {}
        before = _live_entries()
        for first in range(0, SOURCES, BATCH):
            for i in range(first, first + BATCH):
                source = (base + i).to_bytes(4, "big")
                mad = acm_request(
                    i + 1, AddrType.IP, dest, AddrType.IP, source, [target.group0.mgid]
                ).encode()
                await qp.send(mad, av, target.qpn)
            await trio.sleep(0.05)  # the receive loop takes the batch
            sent = first + BATCH
            if sent % BOUND == 0:
                live_at[sent] = _live_entries() - before
        cache = target.cache
        # Every source was heard (and answered: the requests were for node1's address).
        assert target.stats.requests_received == SOURCES
        assert cache.evicted >= SOURCES - BOUND
        assert len(cache) <= BOUND
        # Nothing keeps an evicted entry: the deadline lists hold only entries still cached,
        # and the live DestEntry objects stay at the bound however many sources came.
        assert cache.scheduled_entries() <= len(cache)
        assert all(entry.state is not EntryState.INIT for entry in cache.learned())
        assert live_at[10_000] <= BOUND + 10
        assert live_at[20_000] <= BOUND + 10, live_at
        assert live_at[30_000] <= BOUND + 10, live_at

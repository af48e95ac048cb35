"""The bulk route table (``acmp.bulk``): loaded from the simulated SA, read, cleared, aged."""

from __future__ import annotations

import pytest
import trio

from ibacm.config.options import Options
from ibacm.provider.acmp.bulk import BulkRoutes
from ibacm.wire.path_record import PathRecord
from tests.provider.acmp.harness import cluster

pytestmark = pytest.mark.trio

OWN = bytes.fromhex("fe800000000000000002c90300000001")
PEER = bytes.fromhex("fe800000000000000002c90300000002")


async def test_only_paths_from_us_are_kept_and_they_age_with_the_route_lifetime(
    autojump_clock: object,
) -> None:
    bulk = BulkRoutes("test", 0xFFFF, Options(route_timeout=1))  # one minute
    records = [
        PathRecord(sgid=OWN, dgid=PEER, dlid=5, sl=2),
        PathRecord(sgid=PEER, dgid=OWN, dlid=1),  # not from us
        PathRecord(sgid=OWN, dgid=b"X" * 16, dlid=0),  # no DLID: no route
    ]
    bulk.load(records, OWN)
    now = trio.current_time()
    assert list(bulk.by_gid) == [PEER] and list(bulk.by_lid) == [5]
    assert bulk.route(PEER, 0, now) is records[0]
    assert bulk.route(bytes(16), 5, now) is records[0]  # by LID when no GID is asked
    assert bulk.route(b"X" * 16, 0, now) is None and bulk.route(bytes(16), 0, now) is None
    assert bulk.route(PEER, 0, now + 60.0) is None  # older than the route lifetime
    bulk.forget_gid(PEER)  # out of service (SM trap 65)
    assert not bulk.by_gid and not bulk.by_lid


async def test_the_table_comes_from_the_sa_and_again_after_an_sm_change(
    autojump_clock: object,
) -> None:
    async with cluster(3) as c:
        await c.wait_ready()
        endpoint = c.endpoint("node1")
        bulk = BulkRoutes("node1", endpoint.pkey, Options())
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bulk.keep_loaded, endpoint.port.sa, lambda: endpoint.gid)
            with trio.fail_after(30):
                while not bulk.by_gid:
                    await trio.sleep(0.01)
            others = {bytes(c.world.node(name).gids[0]) for name in ("node2", "node3")}
            assert others <= set(bulk.by_gid)
            assert all(record.sgid == endpoint.gid for record in bulk.by_gid.values())
            loaded = bulk.loaded_at
            tables = c.world.count(0x03, 0x12, 0x35)
            await trio.sleep(3600)  # routes never expire by default: no new GetTable
            assert c.world.count(0x03, 0x12, 0x35) == tables
            bulk.clear()
            assert not bulk.by_gid
            with trio.fail_after(30):
                while not bulk.by_gid:
                    await trio.sleep(0.01)
            assert bulk.loaded_at > loaded and c.world.count(0x03, 0x12, 0x35) == tables + 1
            nursery.cancel_scope.cancel()

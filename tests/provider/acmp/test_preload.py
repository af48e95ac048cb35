"""The preloads themselves (ibacm.provider.acmp.preload) on a live endpoint of the in-test core:
what they never replace, and a route file without this port's section. The preloads at work on
the fabric are in tests/provider/acmp/test_fabric_preload.py."""

from __future__ import annotations

import ipaddress

import pytest
import structlog

from ibacm.config.hosts_file import HostEntry
from ibacm.config.route_file import parse_route_file
from ibacm.provider.acmp.entry import EntryState
from ibacm.provider.acmp.keys import cache_key, lid_key
from ibacm.provider.acmp.preload import preload_hosts, preload_routes
from ibacm.wire.client import AddrType
from tests.provider.acmp.harness import cluster, ipv4

pytestmark = pytest.mark.trio

FAR_GID = bytes.fromhex("fe800000000000000002c90300ffff01")  # no port of this fabric


async def test_hosts_lines_never_replace_our_own_address(autojump_clock: object) -> None:
    async with cluster(2) as c:
        endpoint = c.endpoint("node1")
        own = ipv4(c.world, "node1")
        own_key = cache_key(AddrType.IP, own.info)
        before = endpoint.cache.get(own_key)
        assert before is not None and before.loopback
        hosts = [
            HostEntry(
                str(ipaddress.IPv4Address(own.info[:4])), AddrType.IP, FAR_GID, 1
            ),  # a stale line for us
            HostEntry("10.9.9.9", AddrType.IP, FAR_GID, 2),
        ]
        assert preload_hosts(endpoint, hosts) == 1
        assert endpoint.cache.get(own_key) is before and before.loopback
        far = endpoint.cache.get(cache_key(AddrType.IP, bytes([10, 9, 9, 9])))
        assert far is not None and far.preloaded and far.state is EntryState.ADDR_RESOLVED
        assert far.remote_qpn == 0  # learned from the peer's first request (C stored 1)
        query = far.route_query()
        assert query is not None and query.dgid == FAR_GID


async def test_a_route_file_without_this_ports_section_preloads_nothing(
    autojump_clock: object,
) -> None:
    text = (
        'Channel Adapter 0x0002c90300ffff01, base LID 77, "elsewhere mlx5_0", port 1\n'
        "0x004D : 0 : 5 : 16\n\n"
    )
    dump, issues = parse_route_file(text)
    assert issues == []
    async with cluster(2) as c:
        endpoint = c.endpoint("node1")
        with structlog.testing.capture_logs() as logs:
            assert preload_routes(endpoint, dump) == 0
        assert endpoint.cache.get(lid_key(77)) is None
        assert [e["event"] for e in logs] == ["route preload: no section for this port"]

"""Preloads (options.md §7), the bulk route preload and cache persistence, on the simulated
fabric."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from ibacm.config.option_values import AddrPreload, RoutePreload
from ibacm.config.options import Options
from ibacm.provider.acmp.entry import EntryState
from ibacm.provider.acmp.keys import cache_key
from ibacm.provider.api import Counter
from ibacm.wire.client import AcmStatus, AddrType
from ibacm.wire.path_record import PathRecord
from tests.provider.acmp.harness import Node, cluster, ipv4, name

pytestmark = pytest.mark.trio


def options(**changes: object) -> Options:
    opts = Options()
    for key, value in changes.items():
        setattr(opts, key, value)
    return opts


async def test_route_preload_answers_path_requests_without_the_sa(
    autojump_clock: object, tmp_path: Path
) -> None:
    data = tmp_path / "ibacm_route.data"
    async with cluster(4, start=[]) as c:
        data.write_text(c.world.route_dump())
        opts = options(route_preload=RoutePreload.OPENSM_FULL_V1, route_data_file=str(data))
        node1 = await c.add_node("node1", opts)
        await c.wait_ready()
        node3 = c.world.node("node3")
        by_lid = await node1.resolve_path(PathRecord(dlid=node3.lids[0]))
        assert by_lid.status == AcmStatus.SUCCESS
        path = by_lid.paths[0]
        assert (path.dlid, path.dgid) == (node3.lids[0], node3.gids[0])
        assert path.slid == c.world.node("node1").lids[0]
        assert path.reversible and path.numb_path == 0
        assert (path.mtu_byte, path.rate_byte, path.sl) == (5, 16, 0)
        assert path.packetlifetime_byte == 18  # the port's subnet timeout
        by_gid = await node1.resolve_path(PathRecord(dgid=node3.gids[0]))
        assert by_gid.paths == by_lid.paths
        assert c.sa_path_queries() == 0
        assert node1.counters()[Counter.ROUTE_CACHE] == 2
        own = await node1.resolve_path(PathRecord(dlid=c.world.node("node1").lids[0]))
        assert own.paths[0].packetlifetime_byte == 0


async def test_hosts_preload_skips_the_multicast(autojump_clock: object, tmp_path: Path) -> None:
    hosts = tmp_path / "ibacm_hosts.data"
    async with cluster(4, start=[]) as c:
        hosts.write_text(c.world.hosts_file())
        opts = options(addr_preload=AddrPreload.ACM_HOSTS, addr_data_file=str(hosts))
        node1 = await c.add_node("node1", opts)
        for other in ("node2", "node3", "node4"):
            await c.add_node(other, Options())
        await c.wait_ready()
        result = await node1.resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        assert result.status == AcmStatus.SUCCESS
        assert result.paths[0].dlid == c.world.node("node2").lids[0]
        by_name = await node1.resolve(ipv4(c.world, "node1"), name("node3"))
        assert by_name.status == AcmStatus.SUCCESS
        assert c.acm_requests() == 0
        counters = node1.counters()
        assert counters[Counter.ADDR_CACHE] == 2 and counters[Counter.ROUTE_QUERY] == 2


async def test_hosts_and_route_preload_together_give_ready_entries(
    autojump_clock: object, tmp_path: Path
) -> None:
    hosts, routes = tmp_path / "hosts", tmp_path / "routes"
    async with cluster(3, start=[]) as c:
        hosts.write_text(c.world.hosts_file())
        routes.write_text(c.world.route_dump())
        opts = options(
            addr_preload=AddrPreload.ACM_HOSTS,
            addr_data_file=str(hosts),
            route_preload=RoutePreload.OPENSM_FULL_V1,
            route_data_file=str(routes),
        )
        node1 = await c.add_node("node1", opts)
        await c.wait_ready()
        result = await node1.resolve(ipv4(c.world, "node1"), ipv4(c.world, "node3"))
        assert result.status == AcmStatus.SUCCESS
        assert result.paths[0].dlid == c.world.node("node3").lids[0]
        assert c.acm_requests() == 0 and c.sa_path_queries() == 0


async def test_preloaded_entry_learns_the_peer_qpn_from_its_request(
    autojump_clock: object, tmp_path: Path
) -> None:
    """C kept QPN 1 for hosts-file entries and answered the peer's QP1: the peer timed out."""
    hosts = tmp_path / "hosts"
    async with cluster(3, start=[]) as c:
        hosts.write_text(c.world.hosts_file())
        opts = options(addr_preload=AddrPreload.ACM_HOSTS, addr_data_file=str(hosts))
        await c.add_node("node1", opts)
        node2 = await c.add_node("node2", Options())
        await c.wait_ready()
        result = await node2.resolve(ipv4(c.world, "node2"), ipv4(c.world, "node1"))
        assert result.status == AcmStatus.SUCCESS
        entry = c.endpoint("node1").cache.get(cache_key(AddrType.IP, ipv4(c.world, "node2").info))
        assert entry is not None and entry.remote_qpn == c.endpoint("node2").qpn


async def test_missing_preload_files_are_logged_not_fatal(
    autojump_clock: object, tmp_path: Path
) -> None:
    opts = options(
        addr_preload=AddrPreload.ACM_HOSTS,
        addr_data_file=str(tmp_path / "missing-hosts"),
        route_preload=RoutePreload.OPENSM_FULL_V1,
        route_data_file=str(tmp_path / "missing-routes"),
    )
    async with cluster(2, opts) as c:
        result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        assert result.status == AcmStatus.SUCCESS


async def test_bulk_route_preload_replaces_per_pair_path_queries(
    autojump_clock: object,
) -> None:
    async with cluster(5, options(route_bulk_preload=True)) as c:
        with trio.fail_after(30):
            while not all(c.endpoint(n).bulk.by_gid for n in c.nodes):
                await trio.sleep(0.01)
        assert c.world.count(0x03, 0x12, 0x35) == 5  # one GetTable per endpoint
        for dst in ("node2", "node3", "node4", "node5"):
            result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, dst))
            assert result.status == AcmStatus.SUCCESS
            assert result.paths[0].dlid == c.world.node(dst).lids[0]
            assert result.paths[0].dgid == c.world.node(dst).gids[0]
        assert c.acm_requests() == 4  # addresses still come from ACM
        assert c.sa_path_queries() == 0
        # The path form (by DLID, by DGID) takes its route from the table too.
        node5 = c.world.node("node5")
        by_lid = await c["node2"].resolve_path(PathRecord(dlid=node5.lids[0]))
        by_gid = await c["node3"].resolve_path(PathRecord(dgid=node5.gids[0]))
        assert by_lid.status == by_gid.status == AcmStatus.SUCCESS
        assert by_lid.paths[0].dlid == by_gid.paths[0].dlid == node5.lids[0]
        assert c.sa_path_queries() == 0


async def test_bulk_route_preload_is_off_by_default(autojump_clock: object) -> None:
    async with cluster(3) as c:
        await trio.sleep(1)
        assert c.world.count(0x03, 0x12) == 0


async def test_cache_survives_a_restart(autojump_clock: object, tmp_path: Path) -> None:
    cache_file = tmp_path / "acmp-cache.json"
    opts = options(cache_file=str(cache_file))
    async with cluster(4, start=["node2", "node3", "node4"]) as c:
        await c.add_node("node1", opts)
        await c.wait_ready()
        for dst in ("node2", "node3"):
            result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, dst))
            assert result.status == AcmStatus.SUCCESS
        await c["node1"].stop()
        saved = json.loads(cache_file.read_text())
        assert saved["format"] == "ibacm-acmp-cache"
        (entries,) = [e for e in saved["endpoints"].values() if len(e) >= 2]
        assert {e["address"] for e in entries} >= {"0a000002", "0a000003"}
        del c.nodes["node1"]
        restarted = await c.add_node("node1", opts)
        await c.wait_ready()
        requests, queries = c.acm_requests(), c.sa_path_queries()
        result = await restarted.resolve(ipv4(c.world, "node1"), ipv4(c.world, "node3"))
        assert result.status == AcmStatus.SUCCESS
        assert result.paths[0].dlid == c.world.node("node3").lids[0]
        assert (c.acm_requests(), c.sa_path_queries()) == (requests, queries)


async def test_restored_entries_are_checked_against_their_lifetimes(
    autojump_clock: object, tmp_path: Path
) -> None:
    cache_file = tmp_path / "acmp-cache.json"
    opts = options(cache_file=str(cache_file), addr_timeout=10)
    async with cluster(3, start=["node2", "node3"]) as c:
        await c.add_node("node1", opts)
        await c.wait_ready()
        assert (
            await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        ).status == 0
        await c["node1"].stop()
        del c.nodes["node1"]
        restarted = Node(c.world, "node1", opts)
        restarted.provider.wall_clock = lambda: time.time() + 11 * 60
        await restarted.start(c.nursery)
        c.nodes["node1"] = restarted
        await c.wait_ready()
        requests = c.acm_requests()
        assert (await restarted.resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))).status == 0
        assert c.acm_requests() == requests + 1  # expired while the daemon was down


async def test_cache_is_saved_periodically(autojump_clock: object, tmp_path: Path) -> None:
    cache_file = tmp_path / "acmp-cache.json"

    def saved_entries() -> int:
        try:
            saved = json.loads(cache_file.read_text())
        except (OSError, ValueError):
            return 0
        return sum(len(entries) for entries in saved["endpoints"].values())

    # One daemon writes the file: two savers' worker threads may finish in any order, and
    # while one runs the mock clock jumps on, so a stale empty save could land last.
    saving = options(cache_file=str(cache_file), cache_save_interval=60)
    async with cluster(2, saving, start=["node1"], ready=False) as c:
        await c.add_node("node2", options())
        await c.wait_ready()
        assert (
            await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        ).status == 0
        await trio.sleep(61)
        # The save runs in a worker thread: wait for it in real time with the mock clock
        # held, or it would run on to later saves and expiry meanwhile.
        clock = autojump_clock
        assert isinstance(clock, trio.testing.MockClock)
        clock.autojump_threshold = math.inf
        seen = 0
        for _ in range(1000):
            seen = saved_entries()
            if seen:
                break
            await trio.to_thread.run_sync(time.sleep, 0.01)
        clock.autojump_threshold = 0
        assert seen >= 1  # written while the daemon runs, not only at stop


async def test_a_corrupt_cache_file_is_ignored(autojump_clock: object, tmp_path: Path) -> None:
    cache_file = tmp_path / "acmp-cache.json"
    cache_file.write_text("{not json")
    async with cluster(2, options(cache_file=str(cache_file))) as c:
        assert (
            await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        ).status == 0
        entry = c.endpoint("node1").cache.get(cache_key(AddrType.IP, ipv4(c.world, "node2").info))
        assert entry is not None and entry.state is EntryState.READY


async def test_bulk_route_table_is_taken_again_after_an_sm_change(
    autojump_clock: object,
) -> None:
    opts = options(route_bulk_preload=True)
    async with cluster(3, opts, ready=False, faults={"sa_down": True}) as c:
        await trio.sleep(10)
        c.world.faults.sa_down = False  # joins and GetTables are retried with a backoff
        with trio.fail_after(60):
            while not c.endpoint("node1").bulk.by_gid:
                await trio.sleep(0.01)
        tables = c.world.count(0x03, 0x12, 0x35)
        c.world.move_sm("node2")
        with trio.fail_after(60):
            while c.world.count(0x03, 0x12, 0x35) < tables + 3:
                await trio.sleep(0.01)
        await c.wait_ready()
        result = await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node3"))
        assert result.status == AcmStatus.SUCCESS
        assert c.sa_path_queries() == 0


async def test_start_removes_what_an_interrupted_save_left(
    autojump_clock: object, tmp_path: Path
) -> None:
    cache_file = tmp_path / "acmp-cache.json"
    # What a save killed between writing and renaming leaves: a temporary as big as a save.
    left = tmp_path / ".acmp-cache.json.k3j9x1.tmp"
    left.write_text("{" + " " * 4096)
    other = tmp_path / ".other.json.abc.tmp"  # not ours: stays
    other.write_text("x")
    async with cluster(2, options(cache_file=str(cache_file))) as c:
        assert (
            await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        ).status == 0
        assert not left.exists()
        assert other.exists()


async def test_a_relative_cache_file_is_taken_from_the_state_directory(
    autojump_clock: object, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As systemd's StateDirectory= and ibacm-sim up (one directory per node) set it.
    monkeypatch.setenv("STATE_DIRECTORY", f"{tmp_path / 'state'}:{tmp_path / 'second'}")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "state").mkdir()
    async with cluster(2, options(cache_file="cache.json")) as c:
        assert (
            await c["node1"].resolve(ipv4(c.world, "node1"), ipv4(c.world, "node2"))
        ).status == 0
        await c["node1"].stop()
        del c.nodes["node1"]
    assert (tmp_path / "state" / "cache.json").is_file()
    assert not (tmp_path / "cache.json").exists()

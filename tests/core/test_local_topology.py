"""Ports, endpoints and addresses over time: port and IP events, reload, the address file."""

from __future__ import annotations

import ipaddress
import math
import weakref
from collections.abc import Callable
from pathlib import Path

import pytest
import structlog
import trio

from ibacm.core.model import EndpointState, find_address, iter_endpoints, make_address_key
from ibacm.fabric.api import PortEvent, PortEventType
from ibacm.fabric.sim.topo_file import generate
from ibacm.provider.route_table import Hit, RouteTable
from ibacm.wire.client import AddrType
from tests.core.support import Core, make_options, sim_core


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not condition():
            await trio.sleep(0.005)


def endpoints(core: Core) -> list[EndpointState]:
    return list(iter_endpoints(core.topology.devices))


def displays(core: Core) -> dict[str, list[str]]:
    return {ep.id: [s.core.display for s in ep.addresses()] for ep in endpoints(core)}


@pytest.mark.trio
async def test_endpoints_per_partition_with_system_ips_then_file_names(tmp_path: Path) -> None:
    topology = generate(2, pkeys=(0xFFFF, 0x7FFF, 0x8001, 0x0000))
    lines = [
        "node1 mlx5_0 1 default",
        "node1-b mlx5_0 1 0x0001",  # the membership bit does not matter
        "10.9.0.1 mlx5_0 1 0x8001",  # an IP line: ignored without support_ips_in_addr_cfg
        "NODE1 mlx5_0 1 0xffff",  # the same name in other case: one address
        "other mlx5_9 1 default",
    ]
    async with sim_core(tmp_path, topology=topology, addr_lines=lines) as core:
        # 0x7fff is the same partition as 0xffff; 0x0000 is not a partition.
        assert displays(core) == {
            "mlx5_0/1/0x8001": ["node1-b"],
            "mlx5_0/1/0xffff": ["10.0.0.1/16", "fd00::1/64", "node1"],
        }


@pytest.mark.trio
async def test_addr_file_ips_with_support_ips(tmp_path: Path) -> None:
    options = make_options(tmp_path, support_ips_in_addr_cfg=True)
    lines = ["10.9.0.1 mlx5_0 1 default", "10.0.0.1 mlx5_0 1 default", "fe80::9 mlx5_0 1 default"]
    async with sim_core(tmp_path, addr_lines=lines, options=options) as core:
        # The duplicate of a system IP is skipped; the rest of the file still counts.
        assert displays(core) == {
            "mlx5_0/1/0xffff": ["10.0.0.1/16", "fd00::1/64", "10.9.0.1", "fe80::9"]
        }


@pytest.mark.trio
async def test_port_down_cancels_exactly_its_own_work(tmp_path: Path) -> None:
    async with sim_core(tmp_path, topology=generate(2, ports_per_hca=2)) as core:
        provider = core.provider
        assert provider.port_tasks_running == 2
        core.world.set_port_state("node1", "mlx5_0", 2, False)
        await until(lambda: provider.port_tasks_running == 1)
        assert ("port_task_cancelled", "mlx5_0", 2) in provider.events
        assert ("port_task_cancelled", "mlx5_0", 1) not in provider.events
        assert [ep.id for ep in endpoints(core)] == ["mlx5_0/1/0xffff"]
        # The device stays open while port 1 uses it.
        assert ("close_device", "mlx5_0") not in provider.events
        core.world.set_port_state("node1", "mlx5_0", 2, True)
        await until(lambda: provider.port_tasks_running == 2)
        assert [ep.id for ep in endpoints(core)] == ["mlx5_0/1/0xffff", "mlx5_0/2/0xffff"]
        assert displays(core)["mlx5_0/2/0xffff"] == ["10.1.0.1/16", "fd00:0:0:1::1/64"]


@pytest.mark.trio
async def test_last_port_down_closes_the_device(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        core.world.set_port_state("node1", "mlx5_0", 1, False)
        await until(lambda: ("close_device", "mlx5_0") in core.provider.events)
        tail = core.provider.events[-6:]
        assert [event[0] for event in tail] == [
            "remove_address",
            "remove_address",
            "close_endpoint",
            "close_port",
            "close_device",
            "port_task_cancelled",
        ]


@pytest.mark.trio
async def test_lid_change_rebuilds_the_port(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        core.world.set_lid("node1", "mlx5_0", 1, 77)
        await until(lambda: core.topology.devices[0].ports[0].attrs.lid == 77)  # type: ignore[union-attr]
        await until(lambda: len(endpoints(core)) == 1)
        opened = [e for e in core.provider.events if e[0] == "open_port"]
        assert len(opened) == 2
        assert endpoints(core)[0].port.core.attrs.lid == 77  # type: ignore[union-attr]


@pytest.mark.trio
async def test_sm_change_moves_sa_traffic_and_reaches_the_provider(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        port = core.topology.devices[0].ports[0]
        assert port.sa is not None
        old_sm = port.sa.dest.sm_lid
        core.world.move_sm("node2", reregister=False)
        new_sm = core.world.sm_lid
        assert new_sm != old_sm
        await until(lambda: port.sa is not None and port.sa.dest.sm_lid == new_sm)
        assert ("event", 1, "sm_change", new_sm) in core.provider.events


@pytest.mark.trio
async def test_client_reregister_is_forwarded(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        core.world.client_reregister("node1")
        await until(
            lambda: any(e[:3] == ("event", 1, "client_reregister") for e in core.provider.events)
        )


@pytest.mark.trio
async def test_ip_events_v4_and_v6(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        core.world.add_address("node1", "ib0", "10.0.7.1/16")
        core.world.add_address("node1", "ib0", "fd00::71/64")
        wanted = ["10.0.0.1/16", "fd00::1/64", "10.0.7.1", "fd00::71"]
        await until(lambda: displays(core)["mlx5_0/1/0xffff"] == wanted)
        core.world.remove_address("node1", "10.0.0.1")
        await until(lambda: "10.0.0.1/16" not in displays(core)["mlx5_0/1/0xffff"])
        assert ("remove_address", "10.0.0.1/16") in core.provider.events
        # A freed slot is reused by the next address (C's slot order).
        core.world.add_address("node1", "ib0", "10.0.8.1/16")
        await until(lambda: displays(core)["mlx5_0/1/0xffff"][0] == "10.0.8.1")


@pytest.mark.trio
async def test_reload_adds_and_removes_file_addresses(tmp_path: Path) -> None:
    topology = generate(2, pkeys=(0xFFFF, 0x8002))
    lines = ["node1 mlx5_0 1 default", "old mlx5_0 1 default"]
    async with sim_core(tmp_path, topology=topology, addr_lines=lines) as core:
        assert displays(core) == {"mlx5_0/1/0xffff": ["10.0.0.1/16", "fd00::1/64", "node1", "old"]}
        (tmp_path / "ibacm_addr.cfg").write_text(
            "node1 mlx5_0 1 default\nnew mlx5_0 1 default\npart mlx5_0 1 0x8002\n"
        )
        await core.topology.reload_addresses()
        assert displays(core) == {
            "mlx5_0/1/0x8002": ["part"],
            "mlx5_0/1/0xffff": ["10.0.0.1/16", "fd00::1/64", "node1", "new"],
        }
        assert ("remove_address", "old") in core.provider.events
        (tmp_path / "ibacm_addr.cfg").write_text("node1 mlx5_0 1 default\n")
        await core.topology.reload_addresses()
        assert list(displays(core)) == ["mlx5_0/1/0xffff"]
        assert ("close_endpoint", 1, 0x8002) in core.provider.events


@pytest.mark.trio
async def test_missing_address_file_is_generated_at_the_configured_path(tmp_path: Path) -> None:
    """C ran `ib_acme -A`, which always wrote the default path (defect 20)."""
    topology = generate(2, ports_per_hca=2)
    topology.host("node1").hcas[0].ports[0].lid = 0  # port 1 has no link: host name on port 2
    async with sim_core(tmp_path, topology=topology, addr_lines=None) as core:
        path = tmp_path / "ibacm_addr.cfg"
        lines = [line for line in path.read_text().splitlines() if not line.startswith("#")]
        assert lines == [
            "node1-1 mlx5_0 1 default",
            "node1 mlx5_0 2 default",
            "node1-2 mlx5_0 2 default",
        ]
        assert displays(core) == {
            "mlx5_0/2/0xffff": ["10.1.0.1/16", "fd00:0:0:1::1/64", "node1", "node1-2"]
        }


@pytest.mark.trio
async def test_unwritable_address_file_still_gives_generated_names(tmp_path: Path) -> None:
    options = make_options(tmp_path)
    async with sim_core(tmp_path / "missing-dir", addr_lines=None, options=options) as core:
        assert displays(core) == {
            "mlx5_0/1/0xffff": ["10.0.0.1/16", "fd00::1/64", "node1", "node1-1"]
        }


@pytest.mark.trio
async def test_reregister_while_down_is_delivered_when_the_port_comes_back(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        device = core.topology.devices[0]
        core.world.set_port_state("node1", "mlx5_0", 1, False)
        await until(lambda: not device.ports[0].up)
        async with core.topology.lock:
            await core.topology.handle_port_event(
                device, PortEvent(1, PortEventType.CLIENT_REREGISTER)
            )
        assert not any(e[:3] == ("event", 1, "client_reregister") for e in core.provider.events)
        core.world.set_port_state("node1", "mlx5_0", 1, True)
        await until(
            lambda: any(e[:3] == ("event", 1, "client_reregister") for e in core.provider.events)
        )
        assert device.ports[0].reregister_pending is False


def lookups(core: Core, addresses: list[str]) -> dict[str, str | None]:
    """Which endpoint each address is found on by the source lookup of every RESOLVE (the
    device list's index), checked against a walk of the same lists."""
    found: dict[str, str | None] = {}
    for text in addresses:
        try:
            packed = ipaddress.ip_address(text).packed
            addr_type = AddrType.IP if len(packed) == 4 else AddrType.IP6
        except ValueError:
            packed, addr_type = text.encode(), AddrType.NAME
        slot = find_address(core.topology.devices, addr_type, packed)
        walked = find_address(list(core.topology.devices), addr_type, packed)
        assert slot is walked, (text, slot, walked)
        found[text] = None if slot is None else slot.owner.id
    return found


@pytest.mark.trio
async def test_source_lookup_follows_every_change(tmp_path: Path) -> None:
    topology = generate(2, ports_per_hca=2, pkeys=(0xFFFF, 0x8002))
    lines = ["node1 mlx5_0 1 default", "old mlx5_0 1 default", "both mlx5_0 2 default"]
    async with sim_core(tmp_path, topology=topology, addr_lines=lines) as core:
        probe = ["10.0.0.1", "10.0.7.1", "node1", "old", "new", "part", "both"]
        assert lookups(core, probe) == {
            "10.0.0.1": "mlx5_0/1/0xffff",
            "10.0.7.1": None,
            "node1": "mlx5_0/1/0xffff",
            "old": "mlx5_0/1/0xffff",
            "new": None,
            "part": None,
            "both": "mlx5_0/2/0xffff",
        }
        core.world.add_address("node1", "ib0", "10.0.7.1/16")
        await until(lambda: "10.0.7.1" in displays(core)["mlx5_0/1/0xffff"])
        assert lookups(core, ["10.0.7.1"]) == {"10.0.7.1": "mlx5_0/1/0xffff"}
        core.world.remove_address("node1", "10.0.0.1")
        await until(lambda: "10.0.0.1/16" not in displays(core)["mlx5_0/1/0xffff"])
        assert lookups(core, ["10.0.0.1"]) == {"10.0.0.1": None}
        (tmp_path / "ibacm_addr.cfg").write_text(
            "node1 mlx5_0 1 default\nnew mlx5_0 1 default\npart mlx5_0 1 0x8002\n"
            "both mlx5_0 1 default\nboth mlx5_0 2 default\n"
        )
        await core.topology.reload_addresses()
        found = lookups(core, probe)
        assert (found["old"], found["new"], found["part"]) == (
            None,
            "mlx5_0/1/0xffff",
            "mlx5_0/1/0x8002",
        )
        # On two ports: the first in port order is the source, then the other once it goes.
        assert found["both"] == "mlx5_0/1/0xffff"
        core.world.set_port_state("node1", "mlx5_0", 1, False)
        await until(lambda: [ep.id for ep in endpoints(core)] == ["mlx5_0/2/0xffff"])
        assert lookups(core, ["node1", "both", "part"]) == {
            "node1": None,
            "both": "mlx5_0/2/0xffff",
            "part": None,
        }
        core.world.set_port_state("node1", "mlx5_0", 1, True)
        await until(lambda: len(endpoints(core)) == 3)
        assert lookups(core, ["node1", "both"]) == {
            "node1": "mlx5_0/1/0xffff",
            "both": "mlx5_0/1/0xffff",
        }


@pytest.mark.trio
async def test_route_tables_follow_the_index_and_a_failing_one_costs_the_fast_path_only(
    tmp_path: Path,
) -> None:
    async with sim_core(tmp_path, addr_lines=["node1 mlx5_0 1 default"]) as core:
        devices = core.topology.devices
        asked: list[object] = []
        held: dict[int, weakref.ref[Callable[[int, bytes], bytes]]] = {}

        def table_for(addr_ctx: object) -> RouteTable:
            asked.append(addr_ctx)

            def key(dest_type: int, dest: bytes) -> bytes:
                return dest

            # What the table keeps alive (a provider's endpoint, its cache) goes with it.
            held[id(addr_ctx)] = weakref.ref(key)
            return RouteTable(key, {b"x": Hit(bytes(64), math.inf)})

        def tables(addr_type: int, info: bytes) -> RouteTable | None:
            return devices.route_tables.get(make_address_key(addr_type, info))

        core.provider.route_table = table_for  # type: ignore[method-assign]
        published = devices.route_tables
        devices.changed()
        assert devices.route_tables is not published  # replaced whole, never changed in place
        ip = ipaddress.ip_address("10.0.0.1").packed
        found = tables(AddrType.IP, ip)
        slot = find_address(devices, AddrType.IP, ip)
        assert found is not None and slot is not None
        hit = found.find(AddrType.NAME, b"x", 0.0)
        assert hit is not None and hit.packed == bytes(64)
        assert slot.ctx in asked
        del found, hit
        asked.clear()
        # Asked once per change of the lists, not per request; an unknown source has none.
        assert tables(AddrType.NAME, b"node1") is not None
        assert tables(AddrType.NAME, b"nobody") is None
        assert asked == []
        removed = held[id(slot.ctx)]
        core.world.remove_address("node1", "10.0.0.1")
        await until(lambda: "10.0.0.1/16" not in displays(core)["mlx5_0/1/0xffff"])
        assert removed() is None  # let go at the change, not at the next request
        assert tables(AddrType.IP, ip) is None
        assert asked  # the index was rebuilt and asked again

        def broken(addr_ctx: object) -> RouteTable:
            raise RuntimeError("provider bug")

        core.provider.route_table = broken  # type: ignore[method-assign]
        with structlog.testing.capture_logs() as logs:
            devices.changed()
        assert tables(AddrType.NAME, b"node1") is None
        assert any(entry["event"] == "provider route_table failed" for entry in logs)
        # The address itself is still found: its requests take the provider's resolve.
        assert find_address(devices, AddrType.NAME, b"node1") is not None

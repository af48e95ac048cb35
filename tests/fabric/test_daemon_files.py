"""Files the daemon reads, generated from the simulated fabric: route dump and hosts file."""

from __future__ import annotations

from ibacm.config.hosts_file import parse_hosts_file
from ibacm.config.route_file import parse_route_file
from ibacm.fabric.api import PortState
from ibacm.fabric.sim.daemon_files import hosts_file, route_dump
from ibacm.fabric.sim.directory import Directory
from ibacm.fabric.sim.routing import Router
from ibacm.fabric.sim.topo_file import Topology, generate, parse_ibnetdiscover
from tests.fabric.helpers import net_example


def directory_of(topology: Topology) -> Directory:
    return Directory(topology, Router(topology))


def test_route_dump_is_an_opensm_full_dump_of_every_port() -> None:
    directory = directory_of(parse_ibnetdiscover(net_example("net.2sw2path4hca")))
    dump, issues = parse_route_file(route_dump(directory))
    assert issues == []
    # Two switches and four connected HCA ports, each with a path to all six LIDs.
    assert len(dump.sections) == 6
    assert sorted(dump.lid_to_guid) == [1, 2, 3, 4, 5, 6]
    hca3 = directory.node("Hca3").ports[0]
    section = dump.section_for(hca3.guid, hca3.lid)
    assert section is not None and section.node_type == "Channel Adapter"
    assert section.description == "Hca3" and section.port == 1
    assert {(p.dlid, p.sl, p.mtu, p.rate) for p in section.paths} == {
        (lid, 0, 4, 3) for lid in range(1, 7)
    }
    switch = dump.section_for(0x200000, 1)
    assert switch is not None and switch.node_type == "Switch" and switch.port == 0


def test_hosts_file_maps_names_and_addresses_to_port_gids() -> None:
    directory = directory_of(generate(3))
    entries, issues = parse_hosts_file(hosts_file(directory))
    assert issues == []
    node2 = directory.node("node2")
    mapped = {(e.address, e.gid) for e in entries}
    for address in ("node2", "10.0.0.2", "fd00::2"):
        assert (address, node2.gids[0]) in mapped, address
    assert len(entries) == 9
    assert (node2.lids, node2.ipv4, node2.ipv6, node2.devices) == (
        [3],
        ["10.0.0.2/16"],
        ["fd00::2/64"],
        ("mlx5_0",),
    )


def test_a_port_that_went_down_leaves_the_route_dump() -> None:
    directory = directory_of(generate(3))
    directory.set_state(directory.port("node3", "mlx5_0", 1), PortState.DOWN)
    dump, issues = parse_route_file(route_dump(directory))
    assert issues == []
    assert sorted(dump.lid_to_guid) == [1, 2, 3]  # the switch, node1 and node2

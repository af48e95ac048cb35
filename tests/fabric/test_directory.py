"""The directory of a running simulated fabric: records by name, LID and GUID as they change."""

from __future__ import annotations

import pytest

from ibacm.fabric.api import FabricError, IpEvent, PortState
from ibacm.fabric.sim.directory import Directory
from ibacm.fabric.sim.routing import Router
from ibacm.fabric.sim.runtime import PortRuntime, SwitchEndpoint
from ibacm.fabric.sim.topo_file import Topology, generate


def directory_of(topology: Topology) -> Directory:
    return Directory(topology, Router(topology))


def test_lookups_by_name_lid_and_guid_and_the_sm() -> None:
    topology = generate(3)
    directory = directory_of(topology)
    assert directory.node_names == ["node1", "node2", "node3"]
    port = directory.port("node2", "mlx5_0", 1)
    spec = topology.host("node2").hcas[0].ports[0]
    assert (port.guid, port.lid, port.state) == (spec.guid, spec.lid, PortState.ACTIVE)
    assert directory.endpoint_by_lid(port.lid) is port
    assert directory.endpoint_by_guid(port.guid) is port
    switch = directory.endpoint_by_lid(1)
    assert isinstance(switch, SwitchEndpoint) and directory.switch_named("switch1") is switch
    assert [e.lid for e in directory.endpoints()] == [1, 2, 3, 4]  # the switch, then HCAs
    # The SM runs behind node1's port: its LID is what every port is told.
    assert directory.sm_lid == directory.port("node1", "mlx5_0", 1).lid
    assert directory.port_attributes(port).sm_lid == directory.sm_lid
    with pytest.raises(FabricError, match="no node named 'node9'"):
        directory.host("node9")
    with pytest.raises(FabricError, match="no port 2"):
        directory.port("node1", "mlx5_0", 2)


def test_a_down_port_leaves_the_subnet_but_keeps_its_lid() -> None:
    directory = directory_of(generate(3))
    port = directory.port("node3", "mlx5_0", 1)
    directory.set_state(port, PortState.DOWN)
    # The SA no longer sees it; the LID still routes to it (the fabric drops what it gets).
    assert directory.endpoint_by_lid(port.lid) is None
    assert directory.endpoint_by_guid(port.guid) is None
    assert port not in directory.endpoints()
    assert directory.lid_owner(port.lid) is port and directory.guid_owner(port.guid) is port
    attrs = directory.port_attributes(port)
    assert (attrs.state, attrs.sm_lid) == (PortState.DOWN, 0)
    directory.set_state(port, PortState.ACTIVE)
    assert directory.endpoints()[-1] is port


def test_a_new_lid_is_checked_and_reindexed() -> None:
    directory = directory_of(generate(3))
    port = directory.port("node2", "mlx5_0", 1)
    old = port.lid
    directory.move_lid(port, 40)
    assert (port.lid, directory.lid_owner(40), directory.lid_owner(old)) == (40, port, None)
    with pytest.raises(FabricError, match="already used by node3/mlx5_0/1"):
        directory.move_lid(port, directory.port("node3", "mlx5_0", 1).lid)
    with pytest.raises(FabricError, match="not a unicast LID"):
        directory.move_lid(port, 0xC000)
    assert port.lid == 40  # a refused move changes nothing


class IpEvents:
    def __init__(self) -> None:
        self.events: list[IpEvent] = []

    def deliver_ip(self, event: IpEvent) -> None:
        self.events.append(event)


def test_addresses_are_told_to_the_hosts_listeners_and_unique() -> None:
    directory = directory_of(generate(2))
    host = directory.host("node1")
    sink = IpEvents()
    host.subscribe_ip(sink)
    added = directory.add_address("node1", "ib0", "10.9.0.1/24")
    port: PortRuntime = host.interfaces["ib0"]
    assert (added.gid, added.prefixlen) == (port.gid0, 24)
    assert directory.node("node1").ipv4 == ["10.0.0.1/16", "10.9.0.1/24"]
    with pytest.raises(FabricError, match="already configured on node1"):
        directory.add_address("node2", "ib0", "10.9.0.1/16")
    with pytest.raises(FabricError, match="bad address"):
        directory.add_address("node1", "ib0", "10.9.0.300/24")
    directory.remove_address("node1", "10.9.0.1")
    assert [(e.added, str(e.address.address)) for e in sink.events] == [
        (True, "10.9.0.1"),
        (False, "10.9.0.1"),
    ]
    host.unsubscribe_ip(sink)
    directory.add_address("node1", "ib0", "10.9.0.2/24")
    assert len(sink.events) == 2
    with pytest.raises(FabricError, match=r"no address 10\.9\.0\.7"):
        directory.remove_address("node1", "10.9.0.7")

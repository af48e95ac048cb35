"""The simulated SM's part in fabric changes: the events each change sends and what it forgets."""

from __future__ import annotations

import pytest

from ibacm.fabric.api import FabricError, PortEvent, PortEventType
from ibacm.fabric.sim.directory import Directory
from ibacm.fabric.sim.runtime import DeviceRuntime, PortRuntime
from ibacm.fabric.sim.sm import SubnetManager
from ibacm.fabric.sim.topo_file import generate, parse_ibnetdiscover
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.mad import build_mc_join
from ibacm.wire.notice import InformInfo, build_inform_info_set
from tests.fabric.helpers import acm_join_record, net_example

E = PortEventType


class Events:
    """A device's port events as they are sent."""

    def __init__(self, device: DeviceRuntime) -> None:
        self.got: list[tuple[int, PortEventType]] = []
        device.subscribe(self)

    def deliver_event(self, event: PortEvent) -> None:
        self.got.append((event.port_num, event.type))


def parts(nodes: int = 3) -> tuple[SubnetManager, Directory, SimWorld]:
    world = SimWorld(generate(nodes))
    return world.sm, world.directory, world


def port_of(directory: Directory, node: str) -> PortRuntime:
    return directory.port(node, "mlx5_0", 1)


def test_a_port_going_down_leaves_its_groups_and_subscriptions_and_comes_back_active() -> None:
    sm, directory, world = parts()
    port = port_of(directory, "node2")
    events = Events(port.device)
    world.sa.handle(port, build_mc_join(1, acm_join_record(port.gid0)))
    world.sa.handle(port, build_inform_info_set(2, InformInfo(trap_num=64)))
    group = next(g for g in world.sa.groups.by_mgid.values() if port.guid in g.members)
    sm.set_port_state("node2", "mlx5_0", 1, False)
    assert events.got == [(1, E.PORT_ERR)]
    assert directory.endpoint_by_guid(port.guid) is None
    assert group.mgid not in world.sa.groups.by_mgid  # it was the group's only member
    assert not world.sa.subscriptions
    sm.set_port_state("node2", "mlx5_0", 1, False)  # already down: nothing
    sm.set_port_state("node2", "mlx5_0", 1, True)
    assert events.got == [(1, E.PORT_ERR), (1, E.PORT_ACTIVE)]
    assert world.stats["event_port_err"] == world.stats["event_port_active"] == 1


def test_a_port_without_a_cable_cannot_change_state() -> None:
    world = SimWorld(parse_ibnetdiscover(net_example("net.2sw2path4hca")))
    with pytest.raises(FabricError, match="no link"):
        world.sm.set_port_state("Hca1", "mlx5_0", 2, True)


def test_lid_changes_and_the_sm_moving_tell_the_ports() -> None:
    sm, directory, world = parts()
    watched = {name: Events(port_of(directory, name).device) for name in directory.node_names}
    sm.set_lid("node3", "mlx5_0", 1, 50)
    assert watched["node3"].got == [(1, E.LID_CHANGE)] and not watched["node1"].got
    # The SM's own port gets a new LID: every port hears of the SM, then re-registers.
    sm.set_lid("node1", "mlx5_0", 1, 60)
    assert directory.sm_lid == 60
    assert watched["node2"].got == [(1, E.SM_CHANGE), (1, E.CLIENT_REREGISTER)]
    world.sa.handle(
        port_of(directory, "node2"),
        build_mc_join(1, acm_join_record(port_of(directory, "node2").gid0)),
    )
    sm.move_sm("node3", reregister=False)
    assert directory.sm_guid == port_of(directory, "node3").guid and directory.sm_lid == 50
    assert watched["node1"].got[-1] == (1, E.SM_CHANGE)
    # A new SM knows only the IPoIB broadcast groups, with no members.
    assert all(g.well_known and not g.members for g in world.sa.groups.by_mgid.values())
    sm.move_sm("switch1")
    assert directory.sm_lid == 1
    sm.client_reregister("node2")
    assert watched["node2"].got[-2:] == [(1, E.CLIENT_REREGISTER)] * 2
    with pytest.raises(FabricError, match="no node named 'nowhere'"):
        sm.move_sm("nowhere")

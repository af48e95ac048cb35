"""The whole simulated fabric in one process, put together from the objects that do each job.

``SimWorld(topology)`` builds and wires:

* ``directory`` (``directory.py``): the runtime records of hosts, devices, ports and switches,
  found by name, LID or GUID; IPoIB addresses; which port the SM runs behind;
* ``sa`` (``sa.py``): the Subnet Administrator, request MADs in, response MADs out;
* ``delivery`` (``delivery.py``): UD QPs, unicast and multicast, latency, faults, counters;
* ``sa_transport`` (``sa_transport.py``): umad agents, the SA's queue, answers and Reports;
* ``sm`` (``sm.py``): port state and LID changes, the SM moving, and the events they cause.

What happens to MADs is in ``world.stats`` (shared by all of them), what was sent in
``world.counters``, what goes wrong in ``world.faults``. All timing uses trio's clock;
``await nursery.start(world.run)`` starts the delivery and SA tasks. ``world.fabric(node)``
gives the in-process ``Fabric`` of one node; ``hub.py`` serves the same world to daemons in
other processes. The methods below are the operator's controls (the sim tool, the tests).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence

import trio

from ibacm.fabric.api import InterfaceAddress
from ibacm.fabric.sim import daemon_files
from ibacm.fabric.sim.delivery import Delivery
from ibacm.fabric.sim.directory import Directory, NodeInfo, PortInfo
from ibacm.fabric.sim.fabric import SimFabric
from ibacm.fabric.sim.faults import FaultInjector, Faults
from ibacm.fabric.sim.routing import Router
from ibacm.fabric.sim.runtime import Endpoint, HostRuntime, PortRuntime
from ibacm.fabric.sim.sa import SubnetAdministrator
from ibacm.fabric.sim.sa_transport import SaTransport
from ibacm.fabric.sim.sm import SubnetManager
from ibacm.fabric.sim.topo_file.model import Topology


class SimWorld:
    """See the module docstring."""

    def __init__(
        self,
        topology: Topology,
        *,
        sa_service_time: float = 0.0002,
        link_latency: float = 1e-6,
        seed: int = 0,
    ) -> None:
        topology.validate()
        self.topology = topology
        self.router = Router(topology)
        self.faults = Faults(sa_service_time=sa_service_time)
        inject = FaultInjector(self.faults, random.Random(seed))
        self.stats: Counter[str] = Counter()
        self.directory = Directory(topology, self.router)
        self.sa = SubnetAdministrator(self.directory)
        self.sa.create_ipoib_groups(p for _h, _d, port in topology.hca_ports() for p in port.pkeys)
        self.delivery = Delivery(
            self.directory,
            self.sa.groups,
            self.faults,
            inject,
            self.stats,
            link_latency=link_latency,
        )
        self.sa_transport = SaTransport(self.delivery, self.sa)
        self.sm = SubnetManager(self.sa_transport)

    # -- lifecycle ------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run delivery and the SA until cancelled: ``await nursery.start(world.run)``."""
        if self.delivery.running:
            raise RuntimeError("this SimWorld is already running")
        async with trio.open_nursery() as nursery:
            await nursery.start(self.delivery.run)
            nursery.start_soon(self.sa_transport.serve)
            task_status.started()

    def fabric(self, node_name: str) -> SimFabric:
        """The in-process Fabric of one node."""
        return SimFabric(
            self.directory.host(node_name), self.directory, self.delivery, self.sa_transport
        )

    # -- what the fabric looks like -------------------------------------------------------

    @property
    def node_names(self) -> list[str]:
        return self.directory.node_names

    def host(self, name: str) -> HostRuntime:
        return self.directory.host(name)

    def port(self, node: str, device: str, port: int) -> PortRuntime:
        return self.directory.port(node, device, port)

    def node(self, name: str) -> NodeInfo:
        return self.directory.node(name)

    def endpoints(self) -> Sequence[Endpoint]:
        """Every active LID-addressable port (HCA ports and switch port 0) in LID order."""
        return self.directory.endpoints()

    @property
    def sm_lid(self) -> int:
        return self.directory.sm_lid

    @property
    def counters(self) -> Counter[tuple[int, int, int]]:
        """MADs put on the wire, by (management class, method, attribute ID)."""
        return self.delivery.counters

    def count(
        self, mgmt_class: int | None = None, method: int | None = None, attr: int | None = None
    ) -> int:
        """MADs sent on the fabric matching every given criterion (None = any)."""
        return self.delivery.count(mgmt_class, method, attr)

    @property
    def sa_queue_length(self) -> int:
        return self.sa_transport.queue_length

    def route_dump(self) -> str:
        """An OpenSM ``dump_pr`` "full" file of the fabric (``route_preload opensm_full_v1``)."""
        return daemon_files.route_dump(self.directory)

    def hosts_file(self) -> str:
        """An ``ibacm_hosts.data`` (acm_hosts) file: every node name and address -> port GID."""
        return daemon_files.hosts_file(self.directory)

    # -- the operator's controls ----------------------------------------------------------

    def set_port_state(self, node: str, device: str, port: int, active: bool) -> None:
        """Take a port down (PORT_ERR; the SM forgets its memberships) or up (PORT_ACTIVE)."""
        self.sm.set_port_state(node, device, port, active)

    async def port_flap(
        self, node: str, device: str, port: int, down_for: float, *, reregister: bool = True
    ) -> None:
        """Port down for ``down_for`` seconds, then up; OpenSM then asks it to re-register."""
        await self.sm.port_flap(node, device, port, down_for, reregister=reregister)

    def set_lid(self, node: str, device: str, port: int, lid: int) -> None:
        """Give a port a new LID (LID_CHANGE); moving the SM's LID also tells everyone."""
        self.sm.set_lid(node, device, port, lid)

    def move_sm(self, node: str, *, reregister: bool = True) -> None:
        """The master SM moves behind ``node`` (a host's first active port, or a switch)."""
        self.sm.move_sm(node, reregister=reregister)

    def client_reregister(self, node: str | None = None) -> None:
        """CLIENT_REREGISTER on every active port of ``node`` (default: every node)."""
        self.sm.client_reregister(node)

    def add_address(self, node: str, ifname: str, address: str) -> InterfaceAddress:
        """Configure ``address`` (``10.1.2.3/16``) on an IPoIB interface; sends an IpEvent."""
        return self.directory.add_address(node, ifname, address)

    def remove_address(self, node: str, address: str) -> InterfaceAddress:
        return self.directory.remove_address(node, address)


__all__ = ["NodeInfo", "PortInfo", "SimWorld"]

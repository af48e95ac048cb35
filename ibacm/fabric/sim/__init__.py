"""The simulated InfiniBand fabric: the same MAD bytes as hardware, on trio's clock.

* ``SimWorld(topology)`` — the whole fabric in one process (SM/SA, multicast, delivery,
  faults, counters), wired from the objects that do each job (``world.py`` names them);
  ``world.fabric(node)`` is a node's ``ibacm.fabric.api.Fabric``.
* ``generate`` / ``parse_ibnetdiscover`` — topologies (``topo_file/``).
* ``serve_hub`` / ``HubFabric`` — one world shared by daemons in separate processes.
"""

from ibacm.fabric.sim.fabric import SimFabric
from ibacm.fabric.sim.faults import Faults, FaultSettingError
from ibacm.fabric.sim.hub import HubFabric, hub_call, serve_hub
from ibacm.fabric.sim.topo_file import Topology, TopologyError, generate, parse_ibnetdiscover
from ibacm.fabric.sim.world import NodeInfo, PortInfo, SimWorld

__all__ = [
    "FaultSettingError",
    "Faults",
    "HubFabric",
    "NodeInfo",
    "PortInfo",
    "SimFabric",
    "SimWorld",
    "Topology",
    "TopologyError",
    "generate",
    "hub_call",
    "parse_ibnetdiscover",
    "serve_hub",
]

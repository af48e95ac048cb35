"""Topologies of the simulated fabric: the model, generated clusters, ibnetdiscover/ibsim files.

``model.py`` is the plain data (``Topology``) with its checks and JSON form; ``generate.py``
builds a cluster ``node1..nodeN`` with deterministic LIDs, GUIDs and addresses;
``ibnetdiscover.py`` reads ``ibnetdiscover`` output and ibsim's net-example format so an
operator can rehearse their own fabric.
"""

from ibacm.fabric.sim.topo_file.generate import generate
from ibacm.fabric.sim.topo_file.ibnetdiscover import parse_ibnetdiscover
from ibacm.fabric.sim.topo_file.model import (
    MTU_CODES,
    SPEED_CODES,
    UNICAST_LID_MAX,
    WIDTH_1X,
    WIDTH_2X,
    WIDTH_4X,
    WIDTH_8X,
    WIDTH_12X,
    WIDTH_CODES,
    Hca,
    HcaPort,
    Host,
    Link,
    LinkEnd,
    Switch,
    Topology,
    TopologyError,
    gid_of,
)

__all__ = [
    "MTU_CODES",
    "SPEED_CODES",
    "UNICAST_LID_MAX",
    "WIDTH_1X",
    "WIDTH_2X",
    "WIDTH_4X",
    "WIDTH_8X",
    "WIDTH_12X",
    "WIDTH_CODES",
    "Hca",
    "HcaPort",
    "Host",
    "Link",
    "LinkEnd",
    "Switch",
    "Topology",
    "TopologyError",
    "generate",
    "gid_of",
    "parse_ibnetdiscover",
]

"""Topologies of the simulated fabric: the model, generated clusters, ibnetdiscover/ibsim files.

``model.py`` is the plain data (``Topology``) with its checks and JSON form; ``generate.py``
builds a cluster ``node1..nodeN`` with deterministic LIDs, GUIDs and addresses;
``ibnetdiscover.py`` reads ``ibnetdiscover`` output and ibsim's net-example format so an
operator can rehearse their own fabric.
"""

from ibacm.fabric.sim.topo_file.generate import generate
from ibacm.fabric.sim.topo_file.ibnetdiscover import parse_ibnetdiscover
from ibacm.fabric.sim.topo_file.model import (
    SPEED_CODES,
    HcaPort,
    Host,
    Link,
    Topology,
    TopologyError,
    gid_of,
)

# What users of a topology take from the package; the rest stays in model.py.
__all__ = [
    "SPEED_CODES",
    "HcaPort",
    "Host",
    "Link",
    "Topology",
    "TopologyError",
    "generate",
    "gid_of",
    "parse_ibnetdiscover",
]

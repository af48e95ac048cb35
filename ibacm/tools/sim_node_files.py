"""The files ``ibacm-sim up`` writes for each node: its option file (where its sockets, lock
and log go inside its directory, plus the lines of ``--opts``) and its address file (what
``ib_acme -A`` would write on that node)."""

from __future__ import annotations

import argparse

from ibacm.config.option_file import parse_options
from ibacm.fabric.sim.topo_file import Topology
from ibacm.tools import sim_kinds
from ibacm.tools.sim_kinds import NodeKind
from ibacm.tools.sim_layout import (
    ADDR_FILE,
    ADMIN_SOCKET,
    LOCK_FILE,
    LOG_FILE,
    OPTS_FILE,
    Layout,
)


def opts_text(
    layout: Layout, node: str, args: argparse.Namespace, extra: str, *, metrics_port: int = 0
) -> str:
    """A node's options; ``metrics_port``, when set, overrides the one of ``extra`` (each
    node of one machine needs a port of its own)."""
    node_dir = layout.node_dir(node)
    lines = [
        "# ibacm options written by ibacm-sim up",
        f"run_dir {node_dir}",
        f"lock_file {node_dir / LOCK_FILE}",
        f"log_file {node_dir / LOG_FILE}",
        f"admin_socket {node_dir / ADMIN_SOCKET}",
        f"log_level {args.log_level}",
        # In server_mode loop/open each node takes a port of its own (written to its
        # ibacm-tcp.port); unix mode does not use it.
        "server_port 0",
    ]
    if args.route_prot:
        lines.append(f"route_prot {args.route_prot}")
    text = "\n".join(lines) + "\n"
    if extra:
        text += "# extra options from --opts\n" + extra.rstrip("\n") + "\n"
    if metrics_port:
        text += "# this node's own metrics port (--opts gives the first node's)\n"
        text += f"metrics_port {metrics_port}\n"
    return text


def addr_text(topology: Topology, node: str) -> str:
    """The address file ``ib_acme -A`` would write on that node (ib_acme.md §7.1)."""
    host = topology.host(node)
    lines = ["# ibacm address file written by ibacm-sim up", "# address  device  port  pkey"]
    named = False
    n = 0
    for hca in host.hcas:
        for port in hca.ports:
            if not named and port.lid:
                lines.append(f"{node} {hca.name} {port.num} default")
                named = True
            n += 1
            lines.append(f"{node}-{n} {hca.name} {port.num} default")
    return "\n".join(lines) + "\n"


def write_node_files(
    layout: Layout,
    topology: Topology,
    node: str,
    kind: NodeKind,
    args: argparse.Namespace,
    extra: str,
) -> None:
    node_dir = layout.node_dir(node)
    base = parse_options(extra, "--opts")[0].metrics_port if extra else 0
    port = base + topology.host_names.index(node) if base else 0
    if kind is NodeKind.C:
        opts = sim_kinds.c_opts_text(
            node_dir, log_level=args.log_level, route_prot=args.route_prot, extra=extra
        )
    elif kind is NodeKind.HW:
        opts = opts_text(layout, node, args, extra, metrics_port=port)
        opts += "support_ips_in_addr_cfg 1\n"
    else:
        opts = opts_text(layout, node, args, extra, metrics_port=port)
    (node_dir / OPTS_FILE).write_text(opts)
    if kind.emulated:
        (node_dir / ADDR_FILE).write_text(sim_kinds.addr_text_with_ips(topology, node))
    else:
        (node_dir / ADDR_FILE).write_text(addr_text(topology, node))

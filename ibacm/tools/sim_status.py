"""``ibacm-sim status``: each node's addresses, sockets, daemon and state, as a table or
JSON; the exit status says whether the hub and every node run."""

from __future__ import annotations

import argparse
import ipaddress
import json
import shlex
from functools import partial
from pathlib import Path
from typing import Any

from ibacm.fabric.sim.topo_file import Topology, TopologyError
from ibacm.tools import sim_kinds, sim_procs
from ibacm.tools.sim_kinds import NodeKind
from ibacm.tools.sim_layout import (
    LOG_FILE,
    Layout,
    SimToolError,
    read_pids,
    read_topology,
)
from ibacm.tools.sim_nodes import (
    HUB_MARKER,
    connectable,
    find_daemons,
    listening,
    process_state,
    serving,
    start_command,
)


def status_report(layout: Layout) -> dict[str, Any]:
    """The hub and every node of the cluster: addresses, sockets, daemon, state."""
    try:
        topology = read_topology(layout)
    except TopologyError as exc:
        raise SimToolError(f"{layout.topology}: {exc}") from exc
    pids = read_pids(layout)
    hub_pid = pids.get("hub")
    report: dict[str, Any] = {
        "dir": str(layout.root),
        "hub": {
            "pid": hub_pid,
            "socket": str(layout.hub_socket),
            "state": process_state(hub_pid, HUB_MARKER, partial(connectable, layout.hub_socket)),
        },
        "nodes": [],
    }
    node_pids = pids.get("nodes", {})
    kinds = sim_kinds.kinds_of(pids)
    daemons = find_daemons(layout, pids, topology.host_names)
    for host in topology.hosts:
        ports = [(hca, p) for hca in host.hcas for p in hca.ports if p.lid]
        first = ports[0][1] if ports else None
        daemon = daemons.get(host.name)
        node_dir = layout.node_dir(host.name)
        if daemon is not None:
            pid: int | None = daemon.pid
            state = "running" if serving(node_dir) else "starting"
            command = sim_procs.cmdline(daemon.pid)
        else:
            pid = node_pids.get(host.name)
            state = "stopped" if pid else "down"
            command = start_command(layout, pids, host.name)
        report["nodes"].append(
            {
                "name": host.name,
                "lid": first.lid if first else 0,
                "gid": _gid_text(topology, first.guid) if first else "",
                "ipv4": [str(a.ip) for _h, p in ports for a in p.ipv4],
                "ipv6": [str(a.ip) for _h, p in ports for a in p.ipv6],
                "devices": [hca.name for hca in host.hcas],
                "socket": str(layout.client_socket(host.name)),
                "admin_socket": str(layout.admin_socket(host.name)),
                "log": str(node_dir / LOG_FILE),
                "kind": kinds.get(host.name, NodeKind.SIM.value),
                "pid": pid,
                "state": state,
                # False: not the daemon up/start started (one restarted by hand).
                "started_by_sim": daemon.recorded if daemon is not None else None,
                # The running daemon's command line, or the one start would run.
                "command": command,
                "listening": listening(node_dir),
            }
        )
    return report


def _gid_text(topology: Topology, guid: int) -> str:
    return str(ipaddress.IPv6Address(topology.subnet_prefix << 64 | guid))


def _print_status(report: dict[str, Any]) -> None:
    hub = report["hub"]
    print(f"hub  pid {hub['pid'] or '-'}  {hub['state']}  {hub['socket']}")
    header = ("NODE", "KIND", "LID", "GID", "IPV4", "IPV6", "PID", "STATE", "LISTENING", "ADMIN")
    rows = [header]
    for node in report["nodes"]:
        rows.append(
            (
                node["name"],
                node.get("kind", "sim"),
                str(node["lid"]),
                node["gid"],
                ",".join(node["ipv4"]) or "-",
                ",".join(node["ipv6"]) or "-",
                str(node["pid"] or "-"),
                node["state"],
                ",".join(node.get("listening", [])) or "-",
                node["admin_socket"],
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]))
    # Commands are long: one line each, below the table.
    width = max((len(node["name"]) for node in report["nodes"]), default=0)
    for node in report["nodes"]:
        running = node["state"] in ("running", "starting")
        label = "runs" if running else "starts with"
        if not node["started_by_sim"] and running:
            label = "runs (started by hand)"
        command = shlex.join(node["command"]) if node["command"] is not None else "-"
        print(f"{node['name'].ljust(width)}  {label}: {command}")


def status(args: argparse.Namespace) -> int:
    """Print the report; 0 only when the hub and every node run."""
    report = status_report(Layout(Path(args.dir).resolve()))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print_status(report)
    healthy = report["hub"]["state"] == "running" and all(
        n["state"] == "running" for n in report["nodes"]
    )
    return 0 if healthy else 1

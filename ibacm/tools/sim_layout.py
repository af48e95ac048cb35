"""The state directory of an ``ibacm-sim`` cluster (``--dir DIR``): what is where in it.

``DIR/hub.sock`` (the fabric), ``DIR/hub.pid``, ``DIR/hub.log``, ``DIR/topology.json``,
``DIR/pids.json`` (every process ``up`` or ``start`` started, the daemon command and each
node's kind) and per node ``DIR/<node>/`` with ``ibacm_opts.cfg``, ``ibacm_addr.cfg``,
``ibacm.log``, the lock file ``ibacm.pid``, the client socket ``ibacm-unix.sock`` and the
admin socket ``ibacm-admin.sock``. ``down`` removes every socket and pid file, keeping logs
and configuration.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ibacm.fabric.sim.topo_file import Topology, TopologyError
from ibacm.tools import sim_kinds

CLIENT_SOCKET = "ibacm-unix.sock"
ADMIN_SOCKET = "ibacm-admin.sock"
LOCK_FILE = "ibacm.pid"
LOG_FILE = "ibacm.log"
DAEMON_OUTPUT = "ibacm.out"
"""A node daemon's standard output and error, in its directory."""
OPTS_FILE = "ibacm_opts.cfg"
ADDR_FILE = "ibacm_addr.cfg"
TCP_PORT_FILE = "ibacm-tcp.port"
_REMOVABLE = (CLIENT_SOCKET, ADMIN_SOCKET, LOCK_FILE, "ibacm.sock", TCP_PORT_FILE, "ibacm.port")
_SUN_PATH_MAX = 107


class SimToolError(Exception):
    """A user-facing failure of ``ibacm-sim``; the message is printed and the exit status
    is 1."""


@dataclass(frozen=True)
class Layout:
    root: Path

    @property
    def hub_socket(self) -> Path:
        return self.root / "hub.sock"

    @property
    def hub_pid(self) -> Path:
        return self.root / "hub.pid"

    @property
    def hub_log(self) -> Path:
        return self.root / "hub.log"

    @property
    def topology(self) -> Path:
        return self.root / "topology.json"

    @property
    def pids(self) -> Path:
        return self.root / "pids.json"

    def node_dir(self, node: str) -> Path:
        return self.root / node

    def client_socket(self, node: str) -> Path:
        return self.node_dir(node) / CLIENT_SOCKET

    def admin_socket(self, node: str) -> Path:
        return self.node_dir(node) / ADMIN_SOCKET


def read_pids(layout: Layout) -> dict[str, Any]:
    raw: dict[str, Any] = {"hub": None, "nodes": {}}
    try:
        loaded = json.loads(layout.pids.read_text())
    except FileNotFoundError:
        loaded = {}
    except (OSError, json.JSONDecodeError) as exc:
        raise SimToolError(f"{layout.pids}: unreadable ({exc})") from exc
    if not isinstance(loaded, dict):
        raise SimToolError(f"{layout.pids}: not a JSON object")
    raw.update(loaded)
    if raw.get("hub") is None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            raw["hub"] = int(layout.hub_pid.read_text().split()[0])
    return raw


def write_pids(layout: Layout, pids: dict[str, Any]) -> None:
    tmp = layout.pids.with_suffix(".tmp")
    tmp.write_text(json.dumps(pids, indent=1))
    tmp.replace(layout.pids)


def read_topology(layout: Layout) -> Topology:
    """The cluster's topology; a directory without one is no cluster (a topology that does
    not parse is a ``TopologyError``)."""
    try:
        return Topology.from_json(layout.topology.read_text())
    except FileNotFoundError as exc:
        raise SimToolError(f"{layout.root} holds no simulated cluster (no topology.json)") from exc


def node_names(layout: Layout, pids: dict[str, Any]) -> list[str]:
    """Every node this cluster has: in pids.json or in its topology."""
    names = dict.fromkeys(pids.get("nodes", {}))
    with contextlib.suppress(FileNotFoundError, TopologyError):
        names.update(dict.fromkeys(Topology.from_json(layout.topology.read_text()).host_names))
    return list(names)


def check_socket_paths(layout: Layout, nodes: Sequence[str]) -> None:
    """Every socket of the cluster fits in a unix socket address."""
    longest = max(
        [layout.hub_socket, *(layout.admin_socket(n) for n in nodes)], key=lambda p: len(str(p))
    )
    if len(os.fsencode(longest)) > _SUN_PATH_MAX:
        raise SimToolError(
            f"{longest} is longer than a unix socket path may be ({_SUN_PATH_MAX} bytes); "
            "use a shorter --dir"
        )


def remove_node_files(layout: Layout, name: str, *, device_too: bool) -> None:
    """Remove a stopped node's sockets and pid files (the emulated HCA's socket only once
    its device process is gone too)."""
    node_dir = layout.node_dir(name)
    for filename in _REMOVABLE:
        (node_dir / filename).unlink(missing_ok=True)
    if node_dir.is_dir():
        for leftover in node_dir.glob("*.sock"):
            if device_too or leftover.name != sim_kinds.EMU_SOCKET:
                leftover.unlink(missing_ok=True)

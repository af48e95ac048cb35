"""``ibacm-sim``: run a simulated InfiniBand cluster of real ``ibacm`` daemons on this machine.

    ibacm-sim up --nodes N --dir DIR [--topology FILE] [--opts FILE] [--route-prot sa|acm] ...
    ibacm-sim status --dir DIR [--json]
    ibacm-sim down --dir DIR [--grace S]
    ibacm-sim stop|start|restart --dir DIR NODE   one node's daemon
    ibacm-sim hosts|routes --dir DIR [--json]     print ibacm_hosts.data / ibacm_route.data
    ibacm-sim fault --dir DIR [--json] [NAME VALUE]   show or change faults (loss 0.1, ...)
    ibacm-sim flap|port-down|port-up|set-lid|move-sm|reregister|stats --dir DIR ...

The DIR contract: ``DIR/hub.sock`` (the fabric), ``DIR/hub.pid``, ``DIR/topology.json``,
``DIR/pids.json`` (every process ``up`` or ``start`` started) and per node ``DIR/<node>/``
with ``ibacm_opts.cfg``, ``ibacm_addr.cfg``, ``ibacm.log``, the lock file ``ibacm.pid``, the
client socket ``ibacm-unix.sock`` and the admin socket ``ibacm-admin.sock``. ``up`` starts the
hub and one daemon per node (``--daemon-cmd``, default ``ibacm``) and returns when every one
of them has sent sd_notify ``READY=1``; ``down`` stops them (``sim_procs``: SIGTERM, SIGKILL
only for what does not stop) and removes every socket and pid file, keeping logs and
configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import ipaddress
import json
import os
import shlex
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from ibacm import __version__
from ibacm.config.errors import ConfigIssue
from ibacm.config.hosts_file import parse_hosts_file
from ibacm.config.option_file import parse_options
from ibacm.config.option_values import ServerMode
from ibacm.config.paths import STATE_DIR_ENV
from ibacm.config.route_file import parse_route_file
from ibacm.fabric.api import FabricError
from ibacm.fabric.sim.faults import Faults, FaultSettingError
from ibacm.fabric.sim.hub import hub_call
from ibacm.fabric.sim.topo_file import Topology, TopologyError, generate, parse_ibnetdiscover
from ibacm.fabric.sim.world import SimWorld
from ibacm.tools import sim_exec, sim_kinds, sim_procs
from ibacm.tools.sim_kinds import KindError, NodeKind
from ibacm.tools.sim_ns import NamespaceError
from ibacm.tools.sim_ready import Progress, ReadyError, ReadyListener, ReadyWaiter
from ibacm.tools.spawn import module_command
from ibacm.wire.client import AddrType
from ibacm.wire.path_record import gid_to_text

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
_LOG_TAIL_LINES = 15


class SimToolError(Exception):
    """A user-facing failure; the message is printed and the exit status is 1."""


# -- DIR layout ---------------------------------------------------------------------------


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


def _read_pids(layout: Layout) -> dict[str, Any]:
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


def _write_pids(layout: Layout, pids: dict[str, Any]) -> None:
    tmp = layout.pids.with_suffix(".tmp")
    tmp.write_text(json.dumps(pids, indent=1))
    tmp.replace(layout.pids)


# -- processes ----------------------------------------------------------------------------


def _node_marker(node: str) -> str:
    # Every argument is followed by a space in the joined command line: node1 != node10.
    return f"--sim-node {node} "


_HUB_MARKER = "ibacm.fabric.sim.hub"


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"    ({path} unreadable or missing)"
    tail = text.splitlines()[-lines:]
    if not tail:
        return f"    ({path} is empty)"
    return "\n".join(f"    {line}" for line in tail)


# -- up -----------------------------------------------------------------------------------


def _load_topology(args: argparse.Namespace) -> Topology:
    if args.topology:
        try:
            text = Path(args.topology).read_text()
        except OSError as exc:
            raise SimToolError(f"cannot read topology {args.topology}: {exc}") from exc
        return parse_ibnetdiscover(text, mtu=args.mtu or 4, sm=args.sm)
    if args.nodes is None:
        raise SimToolError("up needs --nodes N or --topology FILE")
    return generate(
        args.nodes,
        hcas_per_node=args.hcas_per_node,
        ports_per_hca=args.ports_per_hca,
        mtu=args.mtu or 5,
        seed=args.seed,
    )


def _initial_faults(args: argparse.Namespace) -> dict[str, str]:
    faults: dict[str, str] = {}
    for name in ("loss", "duplicate", "corrupt", "delay", "sa_busy"):
        value = getattr(args, name)
        if value is not None:
            faults[name] = str(value)
    checker = Faults()
    for name, value in faults.items():
        checker.set(name, value)  # fail before anything starts
    return faults


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


def _write_node_files(
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


def _node_command(
    layout: Layout, node: str, kind: NodeKind, daemon_cmd: list[str]
) -> tuple[list[str], str]:
    """The command that starts ``node``'s daemon, and what its command line shows (marker)."""
    node_dir = layout.node_dir(node)
    opts, addr = node_dir / OPTS_FILE, node_dir / ADDR_FILE
    if kind is NodeKind.SIM:
        command = [*daemon_cmd, "-P", "--fabric", "sim", "--sim-hub", str(layout.hub_socket)]
        command += ["--sim-node", node, "-O", str(opts), "-A", str(addr)]
        return command, _node_marker(node)
    marker = sim_kinds.daemon_marker(node_dir, OPTS_FILE)
    if kind is NodeKind.HW:
        return [*daemon_cmd, "-P", "--fabric", "hw", "-O", str(opts), "-A", str(addr)], marker
    return sim_kinds.c_command(node_dir, opts, addr), marker


def _check_paths(layout: Layout, nodes: Sequence[str]) -> None:
    longest = max(
        [layout.hub_socket, *(layout.admin_socket(n) for n in nodes)], key=lambda p: len(str(p))
    )
    if len(os.fsencode(longest)) > _SUN_PATH_MAX:
        raise SimToolError(
            f"{longest} is longer than a unix socket path may be ({_SUN_PATH_MAX} bytes); "
            "use a shorter --dir"
        )


def _spawn(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        try:
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
        except OSError as exc:
            raise SimToolError(f"cannot start {shlex.join(command)}: {exc}") from exc


def _waiter(
    listener: ReadyListener, what: str, serving: Callable[[str], bool] | None = None
) -> ReadyWaiter:
    """A waiter for READY=1 that shows its progress on a terminal."""
    return ReadyWaiter(listener, serving=serving, progress=Progress(sys.stderr, what))


async def _await_ready(waiter: ReadyWaiter, logs: dict[str, list[Path]], timeout: float) -> None:
    """Wait for READY=1 from every process; fail naming one that died or is really stuck."""
    try:
        await waiter.wait(timeout)
    except ReadyError as exc:
        raise SimToolError(f"{exc}:\n" + "\n".join(_tail(path) for path in logs[exc.name])) from exc


def _node_serving(layout: Layout, kind: NodeKind, node: str) -> bool:
    """The node answers clients, and (ours) its admin socket, which opens just before READY."""
    node_dir = layout.node_dir(node)
    if not _serving(node_dir):
        return False
    return kind is NodeKind.C or _connectable(layout.admin_socket(node))


def _warn_c_server_mode(kinds: dict[str, NodeKind], extra: str) -> None:
    """The C daemon runs with --systemd, which forces unix mode whatever its options say."""
    c_nodes = [node for node, kind in kinds.items() if kind is NodeKind.C]
    if not c_nodes or not extra:
        return
    mode = parse_options(extra, "--opts")[0].server_mode
    if mode is not ServerMode.UNIX:
        print(
            f"ibacm-sim: warning: server_mode {mode.name.lower()} (--opts) does not reach the "
            f"--c-ibacm node(s) {','.join(c_nodes)}: rdma-core's ibacm runs with --systemd, "
            "which forces server_mode unix",
            file=sys.stderr,
        )


async def _up(args: argparse.Namespace) -> int:
    layout = Layout(Path(args.dir).resolve())
    if layout.root.exists() and sim_procs.alive(_read_pids(layout).get("hub"), _HUB_MARKER):
        raise SimToolError(f"{layout.root} is already up; run: ibacm-sim down --dir {args.dir}")
    topology = _load_topology(args)
    faults = _initial_faults(args)
    extra = ""
    if args.opts:
        try:
            extra = Path(args.opts).read_text()
        except OSError as exc:
            raise SimToolError(f"cannot read --opts {args.opts}: {exc}") from exc
    daemon_cmd = shlex.split(args.daemon_cmd)
    if not daemon_cmd:
        raise SimToolError("--daemon-cmd is empty")
    nodes = topology.host_names
    try:
        kinds = sim_kinds.parse_kinds(nodes, args.c_ibacm, args.hw)
        library = sim_kinds.check_support(kinds)
    except KindError as exc:
        raise SimToolError(str(exc)) from exc
    _warn_c_server_mode(kinds, extra)
    layout.root.mkdir(parents=True, exist_ok=True)
    _check_paths(layout, nodes)
    layout.topology.write_text(topology.to_json())
    for node in nodes:
        node_dir = layout.node_dir(node)
        node_dir.mkdir(exist_ok=True)
        _write_node_files(layout, topology, node, kinds[node], args, extra)
    listener = ReadyListener()
    listener.bind()
    env = dict(os.environ, NOTIFY_SOCKET=listener.name, PYTHONUNBUFFERED="1")
    pids: dict[str, Any] = {
        "hub": None,
        "nodes": {},
        "daemon_cmd": daemon_cmd,
        "kinds": {node: kind.value for node, kind in kinds.items()},
        "markers": {},
        "devices": {},
    }
    timeout = args.timeout if args.timeout is not None else 60 + 0.5 * len(nodes)
    try:
        hub_cmd = [
            *module_command("ibacm.fabric.sim.hub"),
            "--dir",
            str(layout.root),
            "--topology-json",
            str(layout.topology),
            "--seed",
            str(args.seed),
            "--link-latency",
            str(args.link_latency),
            "--sa-service-time",
            str(args.sa_service_time),
        ]
        hub_cmd += [f"--fault={name}={value}" for name, value in faults.items()]
        hub = _spawn(hub_cmd, layout.hub_log, env)
        pids["hub"] = hub.pid
        _write_pids(layout, pids)
        hub_waiter = _waiter(listener, "hub")
        hub_waiter.add("hub", hub)
        await _await_ready(hub_waiter, {"hub": [layout.hub_log]}, timeout)
        emulated = [node for node in nodes if kinds[node].emulated]
        if emulated:
            devices = _waiter(listener, "devices")
            for node in emulated:
                node_dir = layout.node_dir(node)
                command = sim_kinds.device_command(layout.hub_socket, node, node_dir)
                device = _spawn(command, node_dir / sim_kinds.EMU_LOG, env)
                devices.add(node, device)
                pids["devices"][node] = device.pid
            _write_pids(layout, pids)
            device_logs = {n: [layout.node_dir(n) / sim_kinds.EMU_LOG] for n in emulated}
            await _await_ready(devices, device_logs, timeout)
        daemons = _waiter(
            listener, "nodes", serving=lambda node: _node_serving(layout, kinds[node], node)
        )
        logs: dict[str, list[Path]] = {}
        for node in nodes:
            node_dir = layout.node_dir(node)
            command, marker = _node_command(layout, node, kinds[node], daemon_cmd)
            node_env = _daemon_env(env, node_dir, library if kinds[node].emulated else None)
            daemon = _spawn(command, node_dir / DAEMON_OUTPUT, node_env)
            daemons.add(node, daemon)  # also hears the nodes started before it
            logs[node] = _daemon_logs(node_dir)
            pids["nodes"][node] = daemon.pid
            pids["markers"][node] = marker
        _write_pids(layout, pids)
        await _await_ready(daemons, logs, timeout)
    except BaseException:
        with trio.CancelScope(shield=True):
            await _down(layout, grace=2.0, quiet=True)
        raise
    finally:
        listener.close()
    print(f"ibacm-sim: {len(nodes)} node(s) up in {layout.root} (hub pid {pids['hub']})")
    return 0


# -- status / down ------------------------------------------------------------------------


def _connectable(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError:
        return False
    finally:
        probe.close()
    return True


def _tcp_port(node_dir: Path) -> int | None:
    """The TCP port a node serves on (server_mode loop/open), from its port file."""
    try:
        return int((node_dir / TCP_PORT_FILE).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _tcp_connectable(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _listening(node_dir: Path) -> list[str]:
    """The client sockets and ports of a node that exist now."""
    names = (CLIENT_SOCKET, "ibacm.sock")
    found = [str(node_dir / name) for name in names if (node_dir / name).exists()]
    port = _tcp_port(node_dir)
    if port is not None:
        found.append(f"127.0.0.1:{port}")
    return found


def _serving(node_dir: Path) -> bool:
    if _connectable(node_dir / CLIENT_SOCKET):
        return True
    port = _tcp_port(node_dir)
    return port is not None and _tcp_connectable(port)


def _state(pid: int | None, marker: str, serving: Callable[[], bool]) -> str:
    if not pid:
        return "down"
    if not sim_procs.alive(pid, marker):
        return "stopped"
    return "running" if serving() else "starting"


@dataclass(frozen=True)
class NodeDaemon:
    """A node's running daemon; ``recorded`` if it is the one ``up``/``start`` started."""

    pid: int
    marker: str
    recorded: bool


_DAEMON_WORDS = ("ibacm.core.cli", "/usr/sbin/ibacm")
_DEVICE_WORDS = ("ibacm.fabric.emu.device",)


def _matcher(
    layout: Layout, names: Sequence[str], *, devices: bool = False
) -> Callable[[list[str]], str | None]:
    """Which node of this cluster a command line is a daemon (or a device process) of: a
    daemon's gives the node's option file after ``-O``; either names its program and the
    node's directory."""
    dirs = {sim_procs.dir_marker(layout.node_dir(name)): name for name in names}
    words = _DEVICE_WORDS if devices else _DAEMON_WORDS

    def match(argv: list[str]) -> str | None:
        if not devices:
            for name in names:
                if sim_procs.names_option_file(argv, layout.node_dir(name) / OPTS_FILE):
                    return name
        joined = " ".join(argv) + " "
        if any(word in joined for word in words):
            return next((name for marker, name in dirs.items() if marker in joined), None)
        return None

    return match


def _node_names(layout: Layout, pids: dict[str, Any]) -> list[str]:
    """Every node this cluster has: in pids.json or in its topology."""
    names = dict.fromkeys(pids.get("nodes", {}))
    with contextlib.suppress(FileNotFoundError, TopologyError):
        names.update(dict.fromkeys(Topology.from_json(layout.topology.read_text()).host_names))
    return list(names)


def _find_daemons(
    layout: Layout, pids: dict[str, Any], names: Sequence[str]
) -> dict[str, NodeDaemon]:
    """Each node's running daemon: the recorded one, else its lock file's holder, else one
    whose command line says it is that node's (an operator restarted it by hand)."""
    recorded = pids.get("nodes", {})
    markers = pids.get("markers", {})
    found: dict[str, NodeDaemon] = {}
    for name in names:
        pid, marker = recorded.get(name), markers.get(name, _node_marker(name))
        node_dir = layout.node_dir(name)
        if pid and sim_procs.alive(pid, marker):
            found[name] = NodeDaemon(int(pid), marker, recorded=True)
        elif (holder := sim_procs.lock_holder(node_dir / LOCK_FILE)) and (
            argv := sim_procs.cmdline(holder)
        ):
            # Its whole command line is the marker: it need not name the node's directory.
            found[name] = NodeDaemon(holder, sim_procs.joined(argv), recorded=False)
    missing = [name for name in names if name not in found]
    if missing:
        for pid, name in sorted(sim_procs.scan(_matcher(layout, missing)).items()):
            marker = sim_procs.dir_marker(layout.node_dir(name))
            found.setdefault(name, NodeDaemon(pid, marker, recorded=False))
    return found


def _daemon_env(env: Mapping[str, str], node_dir: Path, library: Path | None) -> dict[str, str]:
    """A node daemon's environment: its own state directory (a relative cache_file is one
    file per node) and, on an emulated HCA (``library``), the emulation's preload."""
    node_env = {**env, STATE_DIR_ENV: str(node_dir)}
    if library is not None:
        node_env = sim_kinds.emulated_env(node_env, library, node_dir)
    return node_env


def _daemon_logs(node_dir: Path) -> list[Path]:
    return [node_dir / LOG_FILE, node_dir / DAEMON_OUTPUT]


def _recorded_command(
    layout: Layout, pids: dict[str, Any], node: str
) -> tuple[NodeKind, list[str], str]:
    """The kind of ``node`` and the command (and marker) ``up`` gave its daemon."""
    kind = NodeKind(sim_kinds.kinds_of(pids).get(node, NodeKind.SIM.value))
    daemon_cmd = pids.get("daemon_cmd") or shlex.split(default_daemon_cmd())
    command, marker = _node_command(layout, node, kind, [str(arg) for arg in daemon_cmd])
    return kind, command, marker


def _start_command(layout: Layout, pids: dict[str, Any], node: str) -> list[str] | None:
    """The command ``start`` runs for ``node``; None where it cannot be built here."""
    try:
        return _recorded_command(layout, pids, node)[1]
    except NamespaceError:
        return None


def status_report(layout: Layout) -> dict[str, Any]:
    try:
        topology = Topology.from_json(layout.topology.read_text())
    except FileNotFoundError as exc:
        raise SimToolError(f"{layout.root} holds no simulated cluster (no topology.json)") from exc
    except TopologyError as exc:
        raise SimToolError(f"{layout.topology}: {exc}") from exc
    pids = _read_pids(layout)
    hub_pid = pids.get("hub")
    report: dict[str, Any] = {
        "dir": str(layout.root),
        "hub": {
            "pid": hub_pid,
            "socket": str(layout.hub_socket),
            "state": _state(hub_pid, _HUB_MARKER, partial(_connectable, layout.hub_socket)),
        },
        "nodes": [],
    }
    node_pids = pids.get("nodes", {})
    kinds = sim_kinds.kinds_of(pids)
    daemons = _find_daemons(layout, pids, topology.host_names)
    for host in topology.hosts:
        ports = [(hca, p) for hca in host.hcas for p in hca.ports if p.lid]
        first = ports[0][1] if ports else None
        daemon = daemons.get(host.name)
        node_dir = layout.node_dir(host.name)
        if daemon is not None:
            pid: int | None = daemon.pid
            state = "running" if _serving(node_dir) else "starting"
            command = sim_procs.cmdline(daemon.pid)
        else:
            pid = node_pids.get(host.name)
            state = "stopped" if pid else "down"
            command = _start_command(layout, pids, host.name)
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
                "listening": _listening(node_dir),
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


def _status(args: argparse.Namespace) -> int:
    report = status_report(Layout(Path(args.dir).resolve()))
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        _print_status(report)
    healthy = report["hub"]["state"] == "running" and all(
        n["state"] == "running" for n in report["nodes"]
    )
    return 0 if healthy else 1


def _remove_node_files(layout: Layout, name: str, *, device_too: bool) -> None:
    """Remove a stopped node's sockets and pid files (the emulated HCA's socket only once
    its device process is gone too)."""
    node_dir = layout.node_dir(name)
    for filename in _REMOVABLE:
        (node_dir / filename).unlink(missing_ok=True)
    if node_dir.is_dir():
        for leftover in node_dir.glob("*.sock"):
            if device_too or leftover.name != sim_kinds.EMU_SOCKET:
                leftover.unlink(missing_ok=True)


def _killed_note(killed: Sequence[str], grace: float) -> str:
    if not killed:
        return ""
    return f"; killed {len(killed)} still running {grace:g}+ s after SIGTERM: " + ", ".join(killed)


async def _down(layout: Layout, *, grace: float, quiet: bool = False) -> int:
    pids = _read_pids(layout)
    names = _node_names(layout, pids)
    daemons: dict[int, tuple[str, str]] = {
        d.pid: (name, d.marker) for name, d in _find_daemons(layout, pids, names).items()
    }
    for pid, name in sim_procs.scan(_matcher(layout, names)).items():  # duplicates too
        daemons.setdefault(pid, (name, sim_procs.dir_marker(layout.node_dir(name))))
    progress = None if quiet else Progress(sys.stderr, "nodes", verb="stopped")
    killed_pids = await sim_procs.stop(
        {pid: marker for pid, (_name, marker) in daemons.items()}, grace=grace, progress=progress
    )
    killed = [daemons[pid][0] for pid in killed_pids]
    # Devices only once their daemons are gone: a daemon closing its QPs still needs them.
    devices = {
        int(pid): sim_kinds.device_marker(name)
        for name, pid in pids.get("devices", {}).items()
        if pid
    }
    device_names = {pid: f"{name} (device)" for name, pid in pids.get("devices", {}).items()}
    for pid, name in sim_procs.scan(_matcher(layout, names, devices=True)).items():
        devices.setdefault(pid, sim_procs.dir_marker(layout.node_dir(name)))
        device_names.setdefault(pid, f"{name} (device)")
    killed += [device_names[pid] for pid in await sim_procs.stop(devices, grace=grace)]
    hub_pid = pids.get("hub")
    if hub_pid and await sim_procs.stop({int(hub_pid): _HUB_MARKER}, grace=grace):
        killed.append("the hub")
    for name in names:
        _remove_node_files(layout, name, device_too=True)
    for path in (layout.hub_socket, layout.hub_pid, layout.pids):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if not quiet:
        print(
            f"ibacm-sim: stopped {len(daemons)} node(s) and the hub in {layout.root}"
            + _killed_note(killed, grace)
        )
    return 0


# -- one node -----------------------------------------------------------------------------


def _check_node(layout: Layout, node: str) -> None:
    """A node of the cluster in ``layout`` (an error names what is missing)."""
    try:
        topology = Topology.from_json(layout.topology.read_text())
    except FileNotFoundError as exc:
        raise SimToolError(f"{layout.root} holds no simulated cluster (no topology.json)") from exc
    topology.host(node)  # TopologyError names an unknown node


async def _stop_node(layout: Layout, node: str, *, grace: float) -> None:
    _check_node(layout, node)
    daemon = _find_daemons(layout, _read_pids(layout), [node]).get(node)
    if daemon is None:
        print(f"ibacm-sim: {node} was not running")
        return
    killed = await sim_procs.stop({daemon.pid: daemon.marker}, grace=grace)
    _remove_node_files(layout, node, device_too=False)
    note = _killed_note([node], grace) if killed else ""
    print(f"ibacm-sim: stopped {node} (pid {daemon.pid}){note}")


async def _start_node(layout: Layout, node: str, *, timeout: float) -> None:
    _check_node(layout, node)
    pids = _read_pids(layout)
    if not sim_procs.alive(pids.get("hub"), _HUB_MARKER):
        raise SimToolError(f"{layout.root} is not up (its hub is not running); use: ibacm-sim up")
    running = _find_daemons(layout, pids, [node]).get(node)
    if running is not None:
        raise SimToolError(f"{node} is already running (pid {running.pid})")
    node_dir = layout.node_dir(node)
    listener = ReadyListener()
    listener.bind()
    base_env = dict(os.environ, NOTIFY_SOCKET=listener.name, PYTHONUNBUFFERED="1")
    try:
        kind, command, marker = _recorded_command(layout, pids, node)
        library = None
        if kind.emulated:
            device = pids.get("devices", {}).get(node)
            if not sim_procs.alive(device, sim_kinds.device_marker(node)):
                raise SimToolError(
                    f"{node}'s emulated HCA (its device process) is not running; "
                    "restart the cluster (down, up)"
                )
            library = sim_kinds.check_emulation_library()
        env = _daemon_env(base_env, node_dir, library)  # as up gave it
    except (KindError, NamespaceError) as exc:
        listener.close()
        raise SimToolError(str(exc)) from exc
    _remove_node_files(layout, node, device_too=False)  # what a killed daemon left behind
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = _spawn(command, node_dir / DAEMON_OUTPUT, env)
        pids = _read_pids(layout)  # as fresh as can be: another node may have started
        pids.setdefault("nodes", {})[node] = proc.pid
        pids.setdefault("markers", {})[node] = marker
        _write_pids(layout, pids)
        waiter = _waiter(listener, node, serving=lambda n: _node_serving(layout, kind, n))
        waiter.add(node, proc)
        await _await_ready(waiter, {node: _daemon_logs(node_dir)}, timeout)
    except BaseException:
        if proc is not None:
            with trio.CancelScope(shield=True):
                await sim_procs.stop({proc.pid: marker}, grace=2.0)
        raise
    finally:
        listener.close()
    print(f"ibacm-sim: started {node} (pid {proc.pid})")


async def _node_command_run(args: argparse.Namespace) -> int:
    layout = Layout(Path(args.dir).resolve())
    if args.command in ("stop", "restart"):
        await _stop_node(layout, args.node, grace=args.grace)
    if args.command in ("start", "restart"):
        await _start_node(layout, args.node, timeout=args.timeout)
    return 0


# -- control commands ---------------------------------------------------------------------


def _hub(args: argparse.Namespace, request: dict[str, Any]) -> Any:
    layout = Layout(Path(args.dir).resolve())
    try:
        return trio.run(hub_call, layout.hub_socket, request)
    except FabricError as exc:
        raise SimToolError(str(exc)) from exc


def _offline_world(args: argparse.Namespace) -> SimWorld:
    layout = Layout(Path(args.dir).resolve())
    try:
        return SimWorld(Topology.from_json(layout.topology.read_text()))
    except FileNotFoundError as exc:
        raise SimToolError(f"{layout.root} holds no simulated cluster (no topology.json)") from exc


def _hub_is_up(args: argparse.Namespace) -> bool:
    layout = Layout(Path(args.dir).resolve())
    return sim_procs.alive(_read_pids(layout).get("hub"), _HUB_MARKER)


def _text_command(args: argparse.Namespace, op: str) -> int:
    if _hub_is_up(args):
        text = str(_hub(args, {"op": op}))
    else:
        world = _offline_world(args)
        text = world.hosts_file() if op == "hosts" else world.route_dump()
    if not args.json:
        sys.stdout.write(text)
    elif op == "hosts":
        _print_json(_hosts_json(text))
    else:
        _print_json(_routes_json(text))
    return 0


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=1))


def _parsed(issues: Sequence[ConfigIssue], what: str) -> None:
    # The text comes from the fabric itself: an issue is a bug, not something to skip quietly.
    if issues:
        raise SimToolError(f"the fabric's {what} does not parse: {issues[0]}")


def _hosts_json(text: str) -> list[dict[str, Any]]:
    """``ibacm_hosts.data`` as the daemon reads it: address, its type, GID."""
    entries, issues = parse_hosts_file(text, "hosts")
    _parsed(issues, "hosts file")
    return [
        {"address": e.address, "type": AddrType(e.type).name, "gid": gid_to_text(e.gid)}
        for e in entries
    ]


def _routes_json(text: str) -> list[dict[str, Any]]:
    """The path record dump as the daemon reads it: one entry per source port."""
    dump, issues = parse_route_file(text, "routes")
    _parsed(issues, "route dump")
    return [
        {
            "node_type": section.node_type,
            "guid": f"0x{section.guid:016x}",
            "lid": section.lid,
            "description": section.description,
            "port": section.port,
            "paths": [dataclasses.asdict(path) for path in section.paths],
            "unreachable": list(section.unreachable),
        }
        for section in dump.sections
    ]


def _fault(args: argparse.Namespace) -> int:
    request: dict[str, Any] = {"op": "faults"}
    if args.name is not None:
        if args.value is None:
            raise SimToolError(f"fault {args.name} needs a value")
        request["set"] = {args.name: args.value}
    faults = _hub(args, request)
    if args.json:
        _print_json(faults)
        return 0
    for name, value in faults.items():
        print(f"{name} {value}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    report = _hub(args, {"op": "stats"})
    # The hub answers [class, method, attribute, count] lists; people and scripts get names.
    counters = [
        {"class": c, "method": m, "attribute": a, "count": n} for c, m, a, n in report["counters"]
    ]
    if args.json:
        _print_json({**report, "counters": counters})
        return 0
    print(
        f"SM LID {report['sm_lid']}, SA queue {report['sa_queue']}, "
        f"connected {len(report['connected'])}"
    )
    for counter in counters:
        print(
            f"class 0x{counter['class']:02x} method 0x{counter['method']:02x} "
            f"attr 0x{counter['attribute']:04x}  {counter['count']}"
        )
    for name, count in sorted(report["stats"].items()):
        print(f"{name} {count}")
    return 0


def _exec(args: argparse.Namespace) -> int:
    layout = Layout(Path(args.dir).resolve())
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        raise SimToolError("exec needs a command: ibacm-sim exec --dir DIR NODE -- CMD ...")
    try:
        topology = Topology.from_json(layout.topology.read_text())
        host = topology.host(args.node)
    except FileNotFoundError as exc:
        raise SimToolError(f"{layout.root} holds no simulated cluster (no topology.json)") from exc
    kind = sim_kinds.kinds_of(_read_pids(layout)).get(args.node, NodeKind.SIM.value)
    try:
        argv, env = sim_exec.exec_command(
            layout.node_dir(args.node), kind, host.hcas[0].node_guid, command, dict(os.environ)
        )
    except (KindError, NamespaceError) as exc:
        raise SimToolError(str(exc)) from exc
    sys.stdout.flush()
    return sim_exec.run_exec(argv, env)


def _port_target(args: argparse.Namespace) -> dict[str, Any]:
    return {"node": args.node, "device": args.device, "port": args.port}


# -- command line -------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ibacm-sim",
        description="Rehearse an InfiniBand cluster: a simulated fabric with one ibacm per node.",
    )
    parser.add_argument("--version", action="version", version=f"ibacm-sim {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start the fabric and one ibacm per node")
    up.add_argument("--dir", required=True, help="state directory (created)")
    up.add_argument("--nodes", type=int, help="generate node1..nodeN")
    up.add_argument(
        "--topology", metavar="FILE", help="ibnetdiscover output or ibsim net file instead"
    )
    up.add_argument("--sm", help="host or switch running the SM (with --topology)")
    up.add_argument("--hcas-per-node", type=int, default=1)
    up.add_argument("--ports-per-hca", type=int, default=1)
    up.add_argument("--mtu", type=int, choices=range(1, 6), help="port MTU enum (5 = 4096)")
    up.add_argument(
        "--opts",
        metavar="FILE",
        help="a file of extra ibacm_opts.cfg lines appended to every node's file "
        "(a metrics_port in it is node1's; each next node gets the next port)",
    )
    up.add_argument("--route-prot", choices=("sa", "acm"))
    up.add_argument("--log-level", type=int, default=1)
    up.add_argument(
        "--daemon-cmd",
        default=default_daemon_cmd(),
        help="daemon command (default: this installation's ibacm, never another one on PATH "
        "such as rdma-core's C daemon); ibacm-sim appends the node flags",
    )
    up.add_argument(
        "--c-ibacm",
        metavar="LIST",
        help="comma-separated nodes that run rdma-core's unmodified C ibacm on an emulated HCA; "
        "it runs with --systemd, which forces server_mode unix (a server_mode in --opts does "
        "not reach these nodes)",
    )
    up.add_argument(
        "--hw",
        metavar="LIST",
        help="comma-separated nodes that run this ibacm with --fabric hw (the real pyverbs) "
        "on an emulated HCA",
    )
    up.add_argument("--timeout", type=float, help="seconds to wait for READY=1 (default 60+N/2)")
    up.add_argument("--seed", type=int, default=0)
    up.add_argument("--link-latency", type=float, default=1e-6, help="seconds per hop")
    up.add_argument("--sa-service-time", type=float, default=0.0002, help="seconds per SA MAD")
    for name in ("loss", "duplicate", "corrupt", "sa-busy"):
        up.add_argument(
            f"--{name}", type=float, dest=name.replace("-", "_"), help=f"initial {name} probability"
        )
    up.add_argument("--delay", type=float, help="extra seconds on every MAD")

    status = sub.add_parser("status", help="list nodes, addresses, sockets, pids and states")
    status.add_argument("--dir", required=True)
    status.add_argument("--json", action="store_true")

    grace_help = (
        "SIGKILL what still runs once none has stopped for this many seconds, and at least "
        f"this plus {sim_procs.PER_PROCESS_WAIT:g} s per process after SIGTERM (default 10)"
    )
    down = sub.add_parser("down", help="stop everything and remove sockets and pid files")
    down.add_argument("--dir", required=True)
    down.add_argument("--grace", type=float, default=10.0, help=grace_help)

    for name, text in (
        ("stop", "stop one node's daemon (SIGTERM, then SIGKILL)"),
        ("start", "start one node's daemon again, as up started it"),
        ("restart", "stop one node's daemon and start it again"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("--dir", required=True)
        command.add_argument("node")
        if name != "start":
            command.add_argument("--grace", type=float, default=10.0, help=grace_help)
        if name != "stop":
            command.add_argument(
                "--timeout", type=float, default=60.0, help="seconds to wait for READY=1"
            )

    for name, text in (
        ("hosts", "print ibacm_hosts.data for the fabric"),
        ("routes", "print an OpenSM full path-record dump (ibacm_route.data)"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("--dir", required=True)
        command.add_argument("--json", action="store_true")

    fault = sub.add_parser(
        "fault",
        help="show or set a fault: loss, duplicate, corrupt, "
        "delay, sa_busy, sa_down, sa_service_time, sa_queue_limit",
    )
    fault.add_argument("--dir", required=True)
    fault.add_argument("--json", action="store_true")
    fault.add_argument("name", nargs="?")
    fault.add_argument("value", nargs="?")

    stats = sub.add_parser("stats", help="MAD counters and fault statistics of the hub")
    stats.add_argument("--dir", required=True)
    stats.add_argument("--json", action="store_true")

    for name, text in (
        ("flap", "take a port down for --down-for seconds"),
        ("port-down", "take a port down"),
        ("port-up", "bring a port up"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("--dir", required=True)
        command.add_argument("node")
        command.add_argument("--device", default="mlx5_0")
        command.add_argument("--port", type=int, default=1)
        if name == "flap":
            command.add_argument("--down-for", type=float, default=1.0)

    set_lid = sub.add_parser("set-lid", help="give a port a new LID")
    set_lid.add_argument("--dir", required=True)
    set_lid.add_argument("node")
    set_lid.add_argument("lid", type=int)
    set_lid.add_argument("--device", default="mlx5_0")
    set_lid.add_argument("--port", type=int, default=1)

    move_sm = sub.add_parser("move-sm", help="move the master SM to a node or switch")
    move_sm.add_argument("--dir", required=True)
    move_sm.add_argument("node")
    move_sm.add_argument("--no-reregister", action="store_true")

    rereg = sub.add_parser("reregister", help="send CLIENT_REREGISTER (to one node or all)")
    rereg.add_argument("--dir", required=True)
    rereg.add_argument("node", nargs="?")

    run = sub.add_parser(
        "exec",
        help="run a command as if on a node: /run is the node's run directory (needs root)",
    )
    run.add_argument("--dir", required=True)
    run.add_argument("node")
    run.add_argument("argv", nargs=argparse.REMAINDER, help="-- CMD [ARG ...]")
    return parser


def _dispatch(args: argparse.Namespace) -> int:
    command = args.command
    if command == "up":
        return trio.run(_up, args)
    if command == "status":
        return _status(args)
    if command == "down":
        return trio.run(partial(_down, Layout(Path(args.dir).resolve()), grace=args.grace))
    if command in ("stop", "start", "restart"):
        return trio.run(_node_command_run, args)
    if command in ("hosts", "routes"):
        return _text_command(args, command)
    if command == "fault":
        return _fault(args)
    if command == "stats":
        return _stats(args)
    if command == "exec":
        return _exec(args)
    if command == "flap":
        _hub(args, {"op": "port", **_port_target(args), "down_for": args.down_for})
    elif command in ("port-down", "port-up"):
        _hub(args, {"op": "port", **_port_target(args), "up": command == "port-up"})
    elif command == "set-lid":
        _hub(args, {"op": "set_lid", **_port_target(args), "lid": args.lid})
    elif command == "move-sm":
        _hub(args, {"op": "move_sm", "node": args.node, "reregister": not args.no_reregister})
    elif command == "reregister":
        _hub(args, {"op": "reregister", "node": args.node})
    return 0


def default_daemon_cmd() -> str:
    """This installation's daemon: the same interpreter running ``ibacm.core.cli``.

    Looking ``ibacm`` up on PATH could find rdma-core's C daemon (``/usr/sbin/ibacm``),
    which knows nothing of ``--fabric sim``.
    """
    return shlex.join(module_command("ibacm.core.cli"))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        try:
            return _run(argv)
        finally:
            # What is still buffered goes now, so a reader gone fails here, not while the
            # interpreter exits ("Exception ignored ... BrokenPipeError").
            sys.stdout.flush()
    except BrokenPipeError:
        # Our reader went away (ibacm-sim stats --json | head): end quietly, with nothing
        # left for the interpreter to fail flushing at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _run(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _dispatch(args)
    except (SimToolError, TopologyError, FaultSettingError) as exc:
        print(f"ibacm-sim: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())

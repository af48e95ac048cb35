"""``ibacm-sim``: run a simulated InfiniBand cluster of real ``ibacm`` daemons on this machine.

    ibacm-sim up --nodes N --dir DIR [--topology FILE] [--opts FILE] [--route-prot sa|acm] ...
    ibacm-sim status --dir DIR [--json]
    ibacm-sim down --dir DIR
    ibacm-sim hosts|routes --dir DIR          print ibacm_hosts.data / ibacm_route.data
    ibacm-sim fault --dir DIR [NAME VALUE]    show or change faults (loss 0.1, sa_down on, ...)
    ibacm-sim flap|port-down|port-up|set-lid|move-sm|reregister|stats --dir DIR ...

The DIR contract: ``DIR/hub.sock`` (the fabric), ``DIR/hub.pid``, ``DIR/topology.json``,
``DIR/pids.json`` (every process ``up`` started) and per node ``DIR/<node>/`` with
``ibacm_opts.cfg``, ``ibacm_addr.cfg``, ``ibacm.log``, the lock file ``ibacm.pid``, the client
socket ``ibacm-unix.sock`` and the admin socket ``ibacm-admin.sock``. ``up`` starts the hub
and one daemon per node (``--daemon-cmd``, default ``ibacm``) and returns when every one of
them has sent sd_notify ``READY=1``; ``down`` stops them (SIGTERM, then SIGKILL after a
deadline) and removes every socket and pid file, keeping logs and configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from ibacm.config.options import parse_options
from ibacm.config.paths import STATE_DIR_ENV
from ibacm.fabric.api import FabricError
from ibacm.fabric.sim.faults import Faults, FaultSettingError
from ibacm.fabric.sim.hub import hub_call
from ibacm.fabric.sim.topology import Topology, TopologyError, generate, parse_ibnetdiscover
from ibacm.fabric.sim.world import SimWorld
from ibacm.tools import sim_exec, sim_kinds
from ibacm.tools.sim_kinds import KindError, NodeKind
from ibacm.tools.sim_ns import NamespaceError
from ibacm.tools.sim_ready import Progress, ReadyError, ReadyListener, ReadyWaiter
from ibacm.tools.spawn import module_command

CLIENT_SOCKET = "ibacm-unix.sock"
ADMIN_SOCKET = "ibacm-admin.sock"
LOCK_FILE = "ibacm.pid"
LOG_FILE = "ibacm.log"
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


def _alive(pid: int | None, marker: str | None = None) -> bool:
    """``pid`` runs (not a zombie) and, if ``marker`` is given, has it in its command line."""
    if not pid:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError, PermissionError, UnicodeDecodeError):
        return False
    state = stat.rsplit(")", 1)[-1].split()[0]
    if state in ("Z", "X"):
        return False
    return marker is None or marker in cmdline


def _node_marker(node: str) -> str:
    # Every argument is followed by a space in the joined command line: node1 != node10.
    return f"--sim-node {node} "


_HUB_MARKER = "ibacm.fabric.sim.hub"


def _signal_all(pids: dict[int, str], sig: signal.Signals) -> None:
    for pid, marker in pids.items():
        if _alive(pid, marker):
            # Each process was started in its own session: signal its whole group, so a
            # --daemon-cmd wrapper takes the real daemon with it.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, sig)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)


def _stop(pids: dict[int, str], deadline: float) -> list[int]:
    """SIGTERM, wait until ``deadline`` (monotonic), SIGKILL the rest; returns those killed."""
    _signal_all(pids, signal.SIGTERM)
    while time.monotonic() < deadline:
        if not any(_alive(pid, marker) for pid, marker in pids.items()):
            return []
        time.sleep(0.02)
    stragglers = [pid for pid, marker in pids.items() if _alive(pid, marker)]
    _signal_all({pid: pids[pid] for pid in stragglers}, signal.SIGKILL)
    end = time.monotonic() + 5
    while time.monotonic() < end and any(_alive(pid, pids[pid]) for pid in stragglers):
        time.sleep(0.02)
    return stragglers


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


async def _up(args: argparse.Namespace) -> int:
    layout = Layout(Path(args.dir).resolve())
    if layout.root.exists() and _alive(_read_pids(layout).get("hub"), _HUB_MARKER):
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
            # Its own state directory: a relative cache_file is one file per node.
            node_env = {**env, STATE_DIR_ENV: str(node_dir)}
            if kinds[node].emulated:
                assert library is not None
                node_env = sim_kinds.emulated_env(node_env, library, node_dir)
            daemon = _spawn(command, node_dir / "ibacm.out", node_env)
            daemons.add(node, daemon)  # also hears the nodes started before it
            logs[node] = [node_dir / LOG_FILE, node_dir / "ibacm.out"]
            pids["nodes"][node] = daemon.pid
            pids["markers"][node] = marker
        _write_pids(layout, pids)
        await _await_ready(daemons, logs, timeout)
    except BaseException:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(partial(_down, layout, grace=2.0, quiet=True))
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
    if not _alive(pid, marker):
        return "stopped"
    return "running" if serving() else "starting"


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
    markers = pids.get("markers", {})
    for host in topology.hosts:
        ports = [(hca, p) for hca in host.hcas for p in hca.ports if p.lid]
        first = ports[0][1] if ports else None
        pid = node_pids.get(host.name)
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
                "log": str(layout.node_dir(host.name) / LOG_FILE),
                "kind": kinds.get(host.name, NodeKind.SIM.value),
                "pid": pid,
                "state": _state(
                    pid,
                    markers.get(host.name, _node_marker(host.name)),
                    partial(_serving, layout.node_dir(host.name)),
                ),
                "listening": _listening(layout.node_dir(host.name)),
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


_DAEMON_WORDS = ("ibacm.core.cli", "/usr/sbin/ibacm")
_DEVICE_WORDS = ("ibacm.fabric.emu.device",)


def _daemons_by_run_dir(
    layout: Layout, names: Sequence[str], words: Sequence[str] = _DAEMON_WORDS
) -> dict[int, str]:
    """Daemons (or, with ``_DEVICE_WORDS``, device processes) of this cluster that
    ``pids.json`` does not know, e.g. one an operator restarted by hand: found by a node
    directory in their command line."""
    found: dict[int, str] = {}
    node_dirs = [f"{layout.node_dir(name)}/" for name in names]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (os.getpid(), os.getppid()):
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if not any(word in cmdline for word in words):
            continue
        marker = next((d for d in node_dirs if d in cmdline), None)
        if marker is not None:
            found[int(entry.name)] = marker
    return found


def _down(layout: Layout, *, grace: float, quiet: bool = False) -> int:
    pids = _read_pids(layout)
    markers = pids.get("markers", {})
    nodes = {
        int(pid): markers.get(name, _node_marker(name))
        for name, pid in pids.get("nodes", {}).items()
        if pid
    }
    known = set(pids.get("nodes", {}))
    with contextlib.suppress(FileNotFoundError, TopologyError):
        known |= set(Topology.from_json(layout.topology.read_text()).host_names)
    for pid, marker in _daemons_by_run_dir(layout, sorted(known)).items():
        nodes.setdefault(pid, marker)
    killed = _stop(nodes, time.monotonic() + grace)
    # Devices only once their daemons are gone: a daemon closing its QPs still needs them.
    devices = {
        int(pid): sim_kinds.device_marker(name)
        for name, pid in pids.get("devices", {}).items()
        if pid
    }
    for pid, marker in _daemons_by_run_dir(layout, sorted(known), _DEVICE_WORDS).items():
        devices.setdefault(pid, marker)
    killed += _stop(devices, time.monotonic() + grace)
    hub_pid = pids.get("hub")
    if hub_pid:
        killed += _stop({int(hub_pid): _HUB_MARKER}, time.monotonic() + grace)
    removed = 0
    names = set(pids.get("nodes", {}))
    with contextlib.suppress(FileNotFoundError, TopologyError):
        names |= set(Topology.from_json(layout.topology.read_text()).host_names)
    for name in names:
        node_dir = layout.node_dir(name)
        for filename in _REMOVABLE:
            with contextlib.suppress(FileNotFoundError):
                (node_dir / filename).unlink()
                removed += 1
        if node_dir.is_dir():
            for leftover in node_dir.glob("*.sock"):
                leftover.unlink(missing_ok=True)
                removed += 1
    for path in (layout.hub_socket, layout.hub_pid, layout.pids):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed += 1
    if not quiet:
        note = f", SIGKILLed {len(killed)}" if killed else ""
        print(f"ibacm-sim: stopped {len(nodes)} node(s) and the hub in {layout.root}{note}")
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
    return _alive(_read_pids(layout).get("hub"), _HUB_MARKER)


def _text_command(args: argparse.Namespace, op: str) -> int:
    if _hub_is_up(args):
        text = _hub(args, {"op": op})
    else:
        world = _offline_world(args)
        text = world.hosts_file() if op == "hosts" else world.route_dump()
    sys.stdout.write(str(text))
    return 0


def _fault(args: argparse.Namespace) -> int:
    request: dict[str, Any] = {"op": "faults"}
    if args.name is not None:
        if args.value is None:
            raise SimToolError(f"fault {args.name} needs a value")
        request["set"] = {args.name: args.value}
    for name, value in _hub(args, request).items():
        print(f"{name} {value}")
    return 0


def _stats(args: argparse.Namespace) -> int:
    report = _hub(args, {"op": "stats"})
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(
        f"SM LID {report['sm_lid']}, SA queue {report['sa_queue']}, "
        f"connected {len(report['connected'])}"
    )
    for mgmt_class, method, attr, count in report["counters"]:
        print(f"class 0x{mgmt_class:02x} method 0x{method:02x} attr 0x{attr:04x}  {count}")
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
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="start the fabric and one ibacm per node")
    up.add_argument("--dir", required=True, help="state directory (created)")
    up.add_argument("--nodes", type=int, help="generate node1..nodeN")
    up.add_argument("--topology", help="ibnetdiscover output or ibsim net file instead")
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
        help="comma-separated nodes that run rdma-core's unmodified C ibacm on an emulated HCA",
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

    down = sub.add_parser("down", help="stop everything and remove sockets and pid files")
    down.add_argument("--dir", required=True)
    down.add_argument("--grace", type=float, default=10.0, help="seconds before SIGKILL")

    for name, text in (
        ("hosts", "print ibacm_hosts.data for the fabric"),
        ("routes", "print an OpenSM full path-record dump (ibacm_route.data)"),
    ):
        command = sub.add_parser(name, help=text)
        command.add_argument("--dir", required=True)

    fault = sub.add_parser(
        "fault",
        help="show or set a fault: loss, duplicate, corrupt, "
        "delay, sa_busy, sa_down, sa_service_time, sa_queue_limit",
    )
    fault.add_argument("--dir", required=True)
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
        return _down(Layout(Path(args.dir).resolve()), grace=args.grace)
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

"""A node's daemon as a process: the command that starts it (as ``up`` recorded it), its
environment and logs, waiting for its sd_notify ``READY=1``, whether it serves clients, and
finding it running (the recorded pid, its lock file's holder, or a command line naming the
node: one an operator restarted by hand)."""

from __future__ import annotations

import shlex
import socket
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ibacm.config.paths import STATE_DIR_ENV
from ibacm.tools import sim_kinds, sim_procs
from ibacm.tools.sim_kinds import NodeKind
from ibacm.tools.sim_layout import (
    ADDR_FILE,
    CLIENT_SOCKET,
    DAEMON_OUTPUT,
    LOCK_FILE,
    LOG_FILE,
    OPTS_FILE,
    TCP_PORT_FILE,
    Layout,
    SimToolError,
)
from ibacm.tools.sim_ns import NamespaceError
from ibacm.tools.sim_ready import Progress, ReadyError, ReadyListener, ReadyWaiter
from ibacm.tools.spawn import module_command

HUB_MARKER = "ibacm.fabric.sim.hub"
"""What the hub's command line shows (its pid file may name a reused pid)."""
_LOG_TAIL_LINES = 15


def node_marker(node: str) -> str:
    # Every argument is followed by a space in the joined command line: node1 != node10.
    return f"--sim-node {node} "


def default_daemon_cmd() -> str:
    """This installation's daemon: the same interpreter running ``ibacm.core.cli``.

    Looking ``ibacm`` up on PATH could find rdma-core's C daemon (``/usr/sbin/ibacm``),
    which knows nothing of ``--fabric sim``.
    """
    return shlex.join(module_command("ibacm.core.cli"))


def node_command(
    layout: Layout, node: str, kind: NodeKind, daemon_cmd: list[str]
) -> tuple[list[str], str]:
    """The command that starts ``node``'s daemon, and what its command line shows (marker)."""
    node_dir = layout.node_dir(node)
    opts, addr = node_dir / OPTS_FILE, node_dir / ADDR_FILE
    if kind is NodeKind.SIM:
        command = [*daemon_cmd, "-P", "--fabric", "sim", "--sim-hub", str(layout.hub_socket)]
        command += ["--sim-node", node, "-O", str(opts), "-A", str(addr)]
        return command, node_marker(node)
    marker = sim_kinds.daemon_marker(node_dir, OPTS_FILE)
    if kind is NodeKind.HW:
        return [*daemon_cmd, "-P", "--fabric", "hw", "-O", str(opts), "-A", str(addr)], marker
    return sim_kinds.c_command(node_dir, opts, addr), marker


def daemon_env(env: Mapping[str, str], node_dir: Path, library: Path | None) -> dict[str, str]:
    """A node daemon's environment: its own state directory (a relative cache_file is one
    file per node) and, on an emulated HCA (``library``), the emulation's preload."""
    node_env = {**env, STATE_DIR_ENV: str(node_dir)}
    if library is not None:
        node_env = sim_kinds.emulated_env(node_env, library, node_dir)
    return node_env


def daemon_logs(node_dir: Path) -> list[Path]:
    return [node_dir / LOG_FILE, node_dir / DAEMON_OUTPUT]


def recorded_command(
    layout: Layout, pids: dict[str, Any], node: str
) -> tuple[NodeKind, list[str], str]:
    """The kind of ``node`` and the command (and marker) ``up`` gave its daemon."""
    kind = NodeKind(sim_kinds.kinds_of(pids).get(node, NodeKind.SIM.value))
    daemon_cmd = pids.get("daemon_cmd") or shlex.split(default_daemon_cmd())
    command, marker = node_command(layout, node, kind, [str(arg) for arg in daemon_cmd])
    return kind, command, marker


def start_command(layout: Layout, pids: dict[str, Any], node: str) -> list[str] | None:
    """The command ``start`` runs for ``node``; None where it cannot be built here."""
    try:
        return recorded_command(layout, pids, node)[1]
    except NamespaceError:
        return None


def spawn(command: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
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


def ready_waiter(
    listener: ReadyListener, what: str, serving: Callable[[str], bool] | None = None
) -> ReadyWaiter:
    """A waiter for READY=1 that shows its progress on a terminal."""
    return ReadyWaiter(listener, serving=serving, progress=Progress(sys.stderr, what))


def _tail(path: Path, lines: int = _LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"    ({path} unreadable or missing)"
    tail = text.splitlines()[-lines:]
    if not tail:
        return f"    ({path} is empty)"
    return "\n".join(f"    {line}" for line in tail)


async def await_ready(waiter: ReadyWaiter, logs: dict[str, list[Path]], timeout: float) -> None:
    """Wait for READY=1 from every process; fail naming one that died or is really stuck."""
    try:
        await waiter.wait(timeout)
    except ReadyError as exc:
        raise SimToolError(f"{exc}:\n" + "\n".join(_tail(path) for path in logs[exc.name])) from exc


def connectable(path: Path) -> bool:
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


def listening(node_dir: Path) -> list[str]:
    """The client sockets and ports of a node that exist now."""
    names = (CLIENT_SOCKET, "ibacm.sock")
    found = [str(node_dir / name) for name in names if (node_dir / name).exists()]
    port = _tcp_port(node_dir)
    if port is not None:
        found.append(f"127.0.0.1:{port}")
    return found


def serving(node_dir: Path) -> bool:
    if connectable(node_dir / CLIENT_SOCKET):
        return True
    port = _tcp_port(node_dir)
    return port is not None and _tcp_connectable(port)


def node_serving(layout: Layout, kind: NodeKind, node: str) -> bool:
    """The node answers clients, and (ours) its admin socket, which opens just before READY."""
    node_dir = layout.node_dir(node)
    if not serving(node_dir):
        return False
    return kind is NodeKind.C or connectable(layout.admin_socket(node))


def process_state(pid: int | None, marker: str, serving: Callable[[], bool]) -> str:
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


def matcher(
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


def find_daemons(
    layout: Layout, pids: dict[str, Any], names: Sequence[str]
) -> dict[str, NodeDaemon]:
    """Each node's running daemon: the recorded one, else its lock file's holder, else one
    whose command line says it is that node's (an operator restarted it by hand)."""
    recorded = pids.get("nodes", {})
    markers = pids.get("markers", {})
    found: dict[str, NodeDaemon] = {}
    for name in names:
        pid, marker = recorded.get(name), markers.get(name, node_marker(name))
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
        for pid, name in sorted(sim_procs.scan(matcher(layout, missing)).items()):
            marker = sim_procs.dir_marker(layout.node_dir(name))
            found.setdefault(name, NodeDaemon(pid, marker, recorded=False))
    return found

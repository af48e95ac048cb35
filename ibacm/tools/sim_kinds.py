"""Node kinds of ``ibacm-sim up``: our daemon on the simulated fabric, or on an emulated HCA.

* ``sim``: our daemon with ``--fabric sim`` (the default kind).
* ``hw``: our daemon with ``--fabric hw``, the real pyverbs and libibumad, on the node's
  emulated HCA (``ibacm.fabric.emu``: ``libibacm_emu.so`` preloaded, one device process per node).
* ``c``: rdma-core's unmodified C daemon (Debian's ``/usr/sbin/ibacm`` and its
  ``libibacmp.so``) on the emulated HCA, in a private mount namespace where ``/run`` is the node
  directory (its socket, pid and port file paths are compiled in under ``/run``).

Every kind keeps its client socket at ``DIR/<node>/ibacm-unix.sock``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from pathlib import Path

from ibacm.fabric.emu.build import EmuBuildError, ensure_library
from ibacm.fabric.emu.protocol import SOCKET_ENV
from ibacm.fabric.sim.topo_file import Topology
from ibacm.tools.sim_ns import NamespaceError, private_run_argv
from ibacm.tools.spawn import module_command

C_DAEMON = Path("/usr/sbin/ibacm")
C_PROVIDER_DIR = Path("/usr/lib/x86_64-linux-gnu/ibacm")
EMU_SOCKET = "emu.sock"
EMU_LOG = "emu.log"


class NodeKind(enum.Enum):
    SIM = "sim"
    HW = "hw"
    C = "c"

    @property
    def emulated(self) -> bool:
        """Runs on an emulated HCA (needs a device process and the preload library)."""
        return self is not NodeKind.SIM


class KindError(Exception):
    """A node kind cannot be used as asked; the message says why, in one line."""


def parse_kinds(
    nodes: Sequence[str], c_list: str | None, hw_list: str | None
) -> dict[str, NodeKind]:
    """Every node's kind from the comma-separated ``--c-ibacm`` and ``--hw`` lists."""
    kinds = dict.fromkeys(nodes, NodeKind.SIM)
    for text, kind, flag in ((c_list, NodeKind.C, "--c-ibacm"), (hw_list, NodeKind.HW, "--hw")):
        for name in filter(None, (part.strip() for part in (text or "").split(","))):
            if name not in kinds:
                raise KindError(f"{flag}: no node {name!r} in this cluster")
            if kinds[name] is not NodeKind.SIM:
                raise KindError(f"{flag}: node {name} is already of kind {kinds[name].value}")
            kinds[name] = kind
    return kinds


def check_support(kinds: dict[str, NodeKind]) -> Path | None:
    """Fails with one line when a kind cannot run here; the preload library when one is needed."""
    wanted = set(kinds.values())
    if NodeKind.C in wanted:
        if not C_DAEMON.exists() or not (C_PROVIDER_DIR / "libibacmp.so").exists():
            raise KindError(
                f"--c-ibacm needs rdma-core's C daemon ({C_DAEMON} and "
                f"{C_PROVIDER_DIR}/libibacmp.so): install the Debian package ibacm"
            )
        try:
            private_run_argv(Path("/"), ["true"])
        except NamespaceError as exc:
            raise KindError(f"--c-ibacm: {exc}") from exc
    if not any(kind.emulated for kind in wanted):
        return None
    try:
        return ensure_library()
    except EmuBuildError as exc:
        raise KindError(str(exc).splitlines()[0]) from exc


def check_emulation_library() -> Path:
    """The emulated HCA's preload library, built if needed; KindError when it cannot be."""
    try:
        return ensure_library()
    except EmuBuildError as exc:
        raise KindError(str(exc).splitlines()[0]) from exc


def addr_text_with_ips(topology: Topology, node: str) -> str:
    """An address file that also names the node's IP addresses (``support_ips_in_addr_cfg``).

    Emulated nodes have no IPoIB interface on this machine for netlink to report, so their
    addresses come from the file, as on a cluster whose ibacm_addr.cfg lists them.
    """
    host = topology.host(node)
    lines = ["# ibacm address file written by ibacm-sim up", "# address  device  port  pkey"]
    named = False
    for hca in host.hcas:
        for port in hca.ports:
            if not port.lid:
                continue
            if not named:
                lines.append(f"{node} {hca.name} {port.num} default")
                named = True
            lines += [f"{a.ip} {hca.name} {port.num} default" for a in port.ipv4]
            lines += [f"{a.ip} {hca.name} {port.num} default" for a in port.ipv6]
    return "\n".join(lines) + "\n"


def c_opts_text(node_dir: Path, *, log_level: int, route_prot: str | None, extra: str) -> str:
    lines = [
        "# rdma-core ibacm options written by ibacm-sim up (paths under /run are the node dir)",
        f"log_file {node_dir / 'ibacm.log'}",
        f"log_level {min(max(log_level, 0), 2)}",
        "lock_file /run/ibacm.pid",
        "server_mode unix",
        "support_ips_in_addr_cfg 1",
    ]
    if route_prot:
        lines.append(f"route_prot {route_prot}")
    text = "\n".join(lines) + "\n"
    if extra:
        text += "# extra options from --opts\n" + extra.rstrip("\n") + "\n"
    return text


def device_command(hub_socket: Path, node: str, node_dir: Path) -> list[str]:
    return [
        *module_command("ibacm.fabric.emu.device"),
        "--hub",
        str(hub_socket),
        "--node",
        node,
        "--socket",
        str(node_dir / EMU_SOCKET),
    ]


def device_marker(node: str) -> str:
    return f"--node {node} "


def daemon_marker(node_dir: Path, opts_file: str) -> str:
    """What the command line of an emulated node's daemon holds, whatever its kind."""
    return f"-O {node_dir / opts_file} "


def c_command(node_dir: Path, opts: Path, addr: Path) -> list[str]:
    # --systemd: sd_notify READY=1 once it listens (no socket is passed, so it makes its own).
    daemon = [str(C_DAEMON), "-P", "--systemd", "-A", str(addr), "-O", str(opts)]
    # As its systemd unit runs it: without IgnoreSIGPIPE=yes (systemd's default) the C
    # daemon dies when a client closes before reading its answer (send without MSG_NOSIGNAL).
    return private_run_argv(node_dir, daemon, ignore_sigpipe=True)


def emulated_env(base: dict[str, str], library: Path, node_dir: Path) -> dict[str, str]:
    env = dict(base)
    preload = env.get("LD_PRELOAD", "")
    env["LD_PRELOAD"] = f"{library} {preload}".strip()
    env[SOCKET_ENV] = str(node_dir / EMU_SOCKET)
    return env


def kinds_of(pids: dict[str, object]) -> dict[str, str]:
    raw = pids.get("kinds", {})
    return {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}

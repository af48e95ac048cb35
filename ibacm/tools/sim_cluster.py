"""``ibacm-sim up``, ``down``, and ``stop``/``start``/``restart`` of one node's daemon.

``up`` writes the layout (``sim_layout``), starts the hub, the emulated HCAs' device
processes and one daemon per node, and returns when every one of them has sent sd_notify
``READY=1``; a failure stops what it started. ``down`` stops the daemons, then the devices,
then the hub (``sim_procs``: SIGTERM, SIGKILL only for what does not stop) and removes every
socket and pid file."""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from ibacm.config.option_file import parse_options
from ibacm.config.option_values import ServerMode
from ibacm.fabric.sim.faults import Faults
from ibacm.fabric.sim.topo_file import Topology, generate, parse_ibnetdiscover
from ibacm.tools import sim_kinds, sim_procs
from ibacm.tools.sim_kinds import KindError, NodeKind
from ibacm.tools.sim_layout import (
    DAEMON_OUTPUT,
    Layout,
    SimToolError,
    check_socket_paths,
    node_names,
    read_pids,
    read_topology,
    remove_node_files,
    write_pids,
)
from ibacm.tools.sim_node_files import write_node_files
from ibacm.tools.sim_nodes import (
    HUB_MARKER,
    await_ready,
    daemon_env,
    daemon_logs,
    find_daemons,
    matcher,
    node_command,
    node_serving,
    ready_waiter,
    recorded_command,
    spawn,
)
from ibacm.tools.sim_ns import NamespaceError
from ibacm.tools.sim_ready import Progress, ReadyListener
from ibacm.tools.spawn import module_command


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


async def up(args: argparse.Namespace) -> int:
    """Start the hub, the emulated HCAs' devices and one daemon per node; return once each
    has sent READY=1. A failure stops what was started."""
    layout = Layout(Path(args.dir).resolve())
    if layout.root.exists() and sim_procs.alive(read_pids(layout).get("hub"), HUB_MARKER):
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
    check_socket_paths(layout, nodes)
    layout.topology.write_text(topology.to_json())
    for node in nodes:
        node_dir = layout.node_dir(node)
        node_dir.mkdir(exist_ok=True)
        write_node_files(layout, topology, node, kinds[node], args, extra)
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
        hub = spawn(hub_cmd, layout.hub_log, env)
        pids["hub"] = hub.pid
        write_pids(layout, pids)
        hub_waiter = ready_waiter(listener, "hub")
        hub_waiter.add("hub", hub)
        await await_ready(hub_waiter, {"hub": [layout.hub_log]}, timeout)
        emulated = [node for node in nodes if kinds[node].emulated]
        if emulated:
            devices = ready_waiter(listener, "devices")
            for node in emulated:
                node_dir = layout.node_dir(node)
                command = sim_kinds.device_command(layout.hub_socket, node, node_dir)
                device = spawn(command, node_dir / sim_kinds.EMU_LOG, env)
                devices.add(node, device)
                pids["devices"][node] = device.pid
            write_pids(layout, pids)
            device_logs = {n: [layout.node_dir(n) / sim_kinds.EMU_LOG] for n in emulated}
            await await_ready(devices, device_logs, timeout)
        daemons = ready_waiter(
            listener, "nodes", serving=lambda node: node_serving(layout, kinds[node], node)
        )
        logs: dict[str, list[Path]] = {}
        for node in nodes:
            node_dir = layout.node_dir(node)
            command, marker = node_command(layout, node, kinds[node], daemon_cmd)
            node_env = daemon_env(env, node_dir, library if kinds[node].emulated else None)
            daemon = spawn(command, node_dir / DAEMON_OUTPUT, node_env)
            daemons.add(node, daemon)  # also hears the nodes started before it
            logs[node] = daemon_logs(node_dir)
            pids["nodes"][node] = daemon.pid
            pids["markers"][node] = marker
        write_pids(layout, pids)
        await await_ready(daemons, logs, timeout)
    except BaseException:
        with trio.CancelScope(shield=True):
            await down(layout, grace=2.0, quiet=True)
        raise
    finally:
        listener.close()
    print(f"ibacm-sim: {len(nodes)} node(s) up in {layout.root} (hub pid {pids['hub']})")
    return 0


def _killed_note(killed: Sequence[str], grace: float) -> str:
    if not killed:
        return ""
    return f"; killed {len(killed)} still running {grace:g}+ s after SIGTERM: " + ", ".join(killed)


async def down(layout: Layout, *, grace: float, quiet: bool = False) -> int:
    """Stop every daemon of the cluster (those recorded and those found), then the devices,
    then the hub; remove the sockets and pid files."""
    pids = read_pids(layout)
    names = node_names(layout, pids)
    daemons: dict[int, tuple[str, str]] = {
        d.pid: (name, d.marker) for name, d in find_daemons(layout, pids, names).items()
    }
    for pid, name in sim_procs.scan(matcher(layout, names)).items():  # duplicates too
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
    for pid, name in sim_procs.scan(matcher(layout, names, devices=True)).items():
        devices.setdefault(pid, sim_procs.dir_marker(layout.node_dir(name)))
        device_names.setdefault(pid, f"{name} (device)")
    killed += [device_names[pid] for pid in await sim_procs.stop(devices, grace=grace)]
    hub_pid = pids.get("hub")
    if hub_pid and await sim_procs.stop({int(hub_pid): HUB_MARKER}, grace=grace):
        killed.append("the hub")
    for name in names:
        remove_node_files(layout, name, device_too=True)
    for path in (layout.hub_socket, layout.hub_pid, layout.pids):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    if not quiet:
        print(
            f"ibacm-sim: stopped {len(daemons)} node(s) and the hub in {layout.root}"
            + _killed_note(killed, grace)
        )
    return 0


def _check_node(layout: Layout, node: str) -> None:
    """A node of the cluster in ``layout`` (an error names what is missing)."""
    read_topology(layout).host(node)  # TopologyError names an unknown node


async def _stop_node(layout: Layout, node: str, *, grace: float) -> None:
    _check_node(layout, node)
    daemon = find_daemons(layout, read_pids(layout), [node]).get(node)
    if daemon is None:
        print(f"ibacm-sim: {node} was not running")
        return
    killed = await sim_procs.stop({daemon.pid: daemon.marker}, grace=grace)
    remove_node_files(layout, node, device_too=False)
    note = _killed_note([node], grace) if killed else ""
    print(f"ibacm-sim: stopped {node} (pid {daemon.pid}){note}")


async def _start_node(layout: Layout, node: str, *, timeout: float) -> None:
    _check_node(layout, node)
    pids = read_pids(layout)
    if not sim_procs.alive(pids.get("hub"), HUB_MARKER):
        raise SimToolError(f"{layout.root} is not up (its hub is not running); use: ibacm-sim up")
    running = find_daemons(layout, pids, [node]).get(node)
    if running is not None:
        raise SimToolError(f"{node} is already running (pid {running.pid})")
    node_dir = layout.node_dir(node)
    listener = ReadyListener()
    listener.bind()
    base_env = dict(os.environ, NOTIFY_SOCKET=listener.name, PYTHONUNBUFFERED="1")
    try:
        kind, command, marker = recorded_command(layout, pids, node)
        library = None
        if kind.emulated:
            device = pids.get("devices", {}).get(node)
            if not sim_procs.alive(device, sim_kinds.device_marker(node)):
                raise SimToolError(
                    f"{node}'s emulated HCA (its device process) is not running; "
                    "restart the cluster (down, up)"
                )
            library = sim_kinds.check_emulation_library()
        env = daemon_env(base_env, node_dir, library)  # as up gave it
    except (KindError, NamespaceError) as exc:
        listener.close()
        raise SimToolError(str(exc)) from exc
    remove_node_files(layout, node, device_too=False)  # what a killed daemon left behind
    proc: subprocess.Popen[bytes] | None = None
    try:
        proc = spawn(command, node_dir / DAEMON_OUTPUT, env)
        pids = read_pids(layout)  # as fresh as can be: another node may have started
        pids.setdefault("nodes", {})[node] = proc.pid
        pids.setdefault("markers", {})[node] = marker
        write_pids(layout, pids)
        waiter = ready_waiter(listener, node, serving=lambda n: node_serving(layout, kind, n))
        waiter.add(node, proc)
        await await_ready(waiter, {node: daemon_logs(node_dir)}, timeout)
    except BaseException:
        if proc is not None:
            with trio.CancelScope(shield=True):
                await sim_procs.stop({proc.pid: marker}, grace=2.0)
        raise
    finally:
        listener.close()
    print(f"ibacm-sim: started {node} (pid {proc.pid})")


async def run_node_command(args: argparse.Namespace) -> int:
    """``stop``, ``start`` or ``restart`` one node's daemon."""
    layout = Layout(Path(args.dir).resolve())
    if args.command in ("stop", "restart"):
        await _stop_node(layout, args.node, grace=args.grace)
    if args.command in ("start", "restart"):
        await _start_node(layout, args.node, timeout=args.timeout)
    return 0

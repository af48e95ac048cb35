"""The ``ibacm-sim`` commands that ask the running hub (the fabric): ``hosts``, ``routes``
(from the topology when the hub is down), ``fault``, ``stats``, and the fabric events
``flap``, ``port-down``, ``port-up``, ``set-lid``, ``move-sm`` and ``reregister``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio

from ibacm.config.errors import ConfigIssue
from ibacm.config.hosts_file import parse_hosts_file
from ibacm.config.route_file import parse_route_file
from ibacm.fabric.api import FabricError
from ibacm.fabric.sim.hub import hub_call
from ibacm.fabric.sim.world import SimWorld
from ibacm.tools import sim_procs
from ibacm.tools.sim_layout import (
    Layout,
    SimToolError,
    read_pids,
    read_topology,
)
from ibacm.tools.sim_nodes import (
    HUB_MARKER,
)
from ibacm.wire.client import AddrType
from ibacm.wire.path_record import gid_to_text


def hub_request(args: argparse.Namespace, request: dict[str, Any]) -> Any:
    """The running hub's answer to one control request."""
    layout = Layout(Path(args.dir).resolve())
    try:
        return trio.run(hub_call, layout.hub_socket, request)
    except FabricError as exc:
        raise SimToolError(str(exc)) from exc


def _offline_world(args: argparse.Namespace) -> SimWorld:
    return SimWorld(read_topology(Layout(Path(args.dir).resolve())))


def _hub_is_up(args: argparse.Namespace) -> bool:
    layout = Layout(Path(args.dir).resolve())
    return sim_procs.alive(read_pids(layout).get("hub"), HUB_MARKER)


def text_command(args: argparse.Namespace, op: str) -> int:
    """``hosts`` or ``routes``: the file the daemon would read, or it parsed as JSON."""
    if _hub_is_up(args):
        text = str(hub_request(args, {"op": op}))
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


def fault(args: argparse.Namespace) -> int:
    """Show the faults, or set one (``NAME VALUE``)."""
    request: dict[str, Any] = {"op": "faults"}
    if args.name is not None:
        if args.value is None:
            raise SimToolError(f"fault {args.name} needs a value")
        request["set"] = {args.name: args.value}
    faults = hub_request(args, request)
    if args.json:
        _print_json(faults)
        return 0
    for name, value in faults.items():
        print(f"{name} {value}")
    return 0


def stats(args: argparse.Namespace) -> int:
    """The hub's MAD counters and fault statistics."""
    report = hub_request(args, {"op": "stats"})
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


def _port_target(args: argparse.Namespace) -> dict[str, Any]:
    return {"node": args.node, "device": args.device, "port": args.port}


def fabric_event(args: argparse.Namespace) -> int:
    """A change of the fabric: a port flapped, down or up, a new LID, the SM moved, a
    CLIENT_REREGISTER."""
    command = args.command
    if command == "flap":
        hub_request(args, {"op": "port", **_port_target(args), "down_for": args.down_for})
    elif command in ("port-down", "port-up"):
        hub_request(args, {"op": "port", **_port_target(args), "up": command == "port-up"})
    elif command == "set-lid":
        hub_request(args, {"op": "set_lid", **_port_target(args), "lid": args.lid})
    elif command == "move-sm":
        hub_request(
            args, {"op": "move_sm", "node": args.node, "reregister": not args.no_reregister}
        )
    elif command == "reregister":
        hub_request(args, {"op": "reregister", "node": args.node})
    return 0

"""``ibacm-sim``: run a simulated InfiniBand cluster of real ``ibacm`` daemons on this machine.

    ibacm-sim up --nodes N --dir DIR [--topology FILE] [--opts FILE] [--route-prot sa|acm] ...
    ibacm-sim status --dir DIR [--json]
    ibacm-sim down --dir DIR [--grace S]
    ibacm-sim stop|start|restart --dir DIR NODE   one node's daemon
    ibacm-sim hosts|routes --dir DIR [--json]     print ibacm_hosts.data / ibacm_route.data
    ibacm-sim fault --dir DIR [--json] [NAME VALUE]   show or change faults (loss 0.1, ...)
    ibacm-sim flap|port-down|port-up|set-lid|move-sm|reregister|stats --dir DIR ...
    ibacm-sim exec --dir DIR NODE -- CMD ...      a program as if on NODE

This module is the command line: its arguments, and which module carries out each command
(``sim_cluster``: up, down, one node's daemon; ``sim_status``; ``sim_hub_commands``: what
asks the hub; ``sim_exec``). What DIR holds is ``sim_layout``'s contract.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from functools import partial
from pathlib import Path

import trio

from ibacm import __version__
from ibacm.fabric.sim.faults import FaultSettingError
from ibacm.fabric.sim.topo_file import TopologyError
from ibacm.tools import sim_cluster, sim_exec, sim_hub_commands, sim_procs, sim_status
from ibacm.tools.sim_layout import Layout, SimToolError
from ibacm.tools.sim_nodes import default_daemon_cmd


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
        return trio.run(sim_cluster.up, args)
    if command == "status":
        return sim_status.status(args)
    if command == "down":
        layout = Layout(Path(args.dir).resolve())
        return trio.run(partial(sim_cluster.down, layout, grace=args.grace))
    if command in ("stop", "start", "restart"):
        return trio.run(sim_cluster.run_node_command, args)
    if command in ("hosts", "routes"):
        return sim_hub_commands.text_command(args, command)
    if command == "fault":
        return sim_hub_commands.fault(args)
    if command == "stats":
        return sim_hub_commands.stats(args)
    if command == "exec":
        return sim_exec.exec_on_node(Layout(Path(args.dir).resolve()), args.node, args.argv)
    return sim_hub_commands.fabric_event(args)


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

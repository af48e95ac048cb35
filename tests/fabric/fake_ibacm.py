"""A stand-in for the ibacm daemon, for testing ``ibacm-sim up/status/down`` only.

It takes the daemon's command line (``-P --fabric sim --sim-hub PATH --sim-node NODE -O FILE
-A FILE``), reads ``run_dir``/``lock_file``/``log_file``/``admin_socket`` from the option file,
joins the fabric through the hub (querying every port, as the daemon's port-up does), listens
on ``<run_dir>/ibacm-unix.sock`` and the admin socket, writes its pid, sends sd_notify
``READY=1`` and serves until SIGTERM, then removes its sockets and lock file.
``FAKE_IBACM_FAIL=<node>`` makes that node exit with an error before it is ready,
``FAKE_IBACM_HANG=<node>`` makes it hang before it serves, ``FAKE_IBACM_SILENT=<node>`` makes it
serve without sending READY=1 (as a daemon whose message was dropped).
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from pathlib import Path

import trio

from ibacm.fabric.sim.hub import HubFabric
from ibacm.sd_notify import Notifier


def read_options(path: str) -> dict[str, str]:
    options = {}
    for line in Path(path).read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and not line.startswith("#"):
            options[parts[0].lower()] = parts[1]
    return options


async def serve(args: argparse.Namespace) -> None:
    options = read_options(args.O)
    run_dir = Path(options["run_dir"])
    log = open(options["log_file"], "a")  # noqa: SIM115 - lives as long as the process
    print(f"fake ibacm for {args.sim_node}, pid {os.getpid()}", file=log, flush=True)
    if os.environ.get("FAKE_IBACM_FAIL") == args.sim_node:
        print("failing on purpose (FAKE_IBACM_FAIL)", file=log, flush=True)
        sys.exit(3)
    if os.environ.get("FAKE_IBACM_HANG") == args.sim_node:
        print("hanging on purpose (FAKE_IBACM_HANG)", file=log, flush=True)
        await trio.sleep_forever()
    fabric = HubFabric(args.sim_hub, args.sim_node)
    devices = await fabric.open()
    for device in devices:
        for num in range(1, device.phys_port_cnt + 1):
            attrs = await device.port(num).query()
            print(
                f"{device.name} port {num} {attrs.state.name} lid {attrs.lid}", file=log, flush=True
            )
    Path(options["lock_file"]).write_text(f"{os.getpid()}\n")
    paths = [run_dir / "ibacm-unix.sock", Path(options["admin_socket"])]
    listeners = []
    for path in paths:
        sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await sock.bind(str(path))
        sock.listen(16)
        listeners.append(trio.SocketListener(sock))

    async def hang_up(stream: trio.SocketStream) -> None:
        await stream.aclose()

    try:
        with trio.open_signal_receiver(signal.SIGTERM) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(trio.serve_listeners, hang_up, listeners)
                if os.environ.get("FAKE_IBACM_SILENT") != args.sim_node:
                    await Notifier.from_environment().ready("serving (fake)")
                async for _ in signals:
                    print("SIGTERM, exiting", file=log, flush=True)
                    nursery.cancel_scope.cancel()
    finally:
        for path in [*paths, Path(options["lock_file"])]:
            path.unlink(missing_ok=True)
        await fabric.aclose()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-P", action="store_true")
    parser.add_argument("--fabric", required=True)
    parser.add_argument("--sim-hub", required=True)
    parser.add_argument("--sim-node", required=True)
    parser.add_argument("-O", required=True)
    parser.add_argument("-A", required=True)
    trio.run(serve, parser.parse_args())


if __name__ == "__main__":
    main()

"""A background resolution workload against one daemon of a simulated cluster.

Used by the README demo (and handy for operators rehearsing a cluster): it keeps resolving
the other nodes of an ``ibacm-sim`` directory by name through the client socket of one node,
so the dashboard's counters, cache and sparklines move. Rate-limited with trio's clock.

    python -m ibacm.tools.workload --dir DIR --node node1 --rate 50 [--count N]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import trio

from ibacm.wire.client import (
    MSG_MAX,
    AcmHdr,
    AcmMessage,
    AcmOp,
    EpAddr,
    EpFlag,
    request_length,
)


def cluster_nodes(sim_dir: Path) -> list[str]:
    """Node names of an ``ibacm-sim`` directory (one sub-directory per node)."""
    return sorted(
        (p.name for p in sim_dir.iterdir() if (p / "ibacm_opts.cfg").exists()),
        key=lambda name: (len(name), name),
    )


def resolve_request(source: str, dest: str, *, nodelay: bool) -> bytes:
    flags = EpFlag.DEST | (EpFlag.NODELAY if nodelay else 0)
    message = AcmMessage(
        hdr=AcmHdr(opcode=AcmOp.RESOLVE),
        entries=[EpAddr.from_name(source, EpFlag.SOURCE), EpAddr.from_name(dest, flags)],
    )
    return message.encode()


async def receive_reply(stream: trio.SocketStream) -> bytes:
    """One whole reply: the 8-byte prefix tells its length (RESOLVE replies: host order)."""
    data = b""
    while len(data) < 8:
        chunk = await stream.receive_some(MSG_MAX)
        if not chunk:
            raise EOFError("the daemon closed the connection")
        data += chunk
    length = request_length(data[:8]) if data[1] == AcmOp.RESOLVE else AcmHdr.decode(data).length
    while len(data) < length:
        chunk = await stream.receive_some(MSG_MAX)
        if not chunk:
            raise EOFError("the daemon closed the connection")
        data += chunk
    return data[:length]


async def run(sim_dir: Path, node: str, rate: float, count: int | None, seed: int) -> int:
    nodes = [name for name in cluster_nodes(sim_dir) if name != node]
    if not nodes:
        print(f"workload: no other nodes in {sim_dir}", file=sys.stderr)
        return 1
    rng = random.Random(seed)
    socket_path = sim_dir / node / "ibacm-unix.sock"
    stream = await trio.open_unix_socket(str(socket_path))
    statuses: dict[int, int] = {}
    sent = 0
    async with stream:
        while count is None or sent < count:
            dest = rng.choice(nodes)
            await stream.send_all(resolve_request(node, dest, nodelay=rng.random() < 0.1))
            reply = AcmHdr.decode(await receive_reply(stream))
            statuses[reply.status] = statuses.get(reply.status, 0) + 1
            sent += 1
            await trio.sleep(1.0 / rate)
    print(f"workload: {sent} resolutions, statuses {statuses}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ibacm-workload", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path, help="ibacm-sim directory")
    parser.add_argument("--node", default="node1", help="node whose daemon is asked")
    parser.add_argument("--rate", type=float, default=20.0, help="resolutions per second")
    parser.add_argument("--count", type=int, default=None, help="stop after N resolutions")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.rate <= 0:
        parser.error("--rate must be positive")
    try:
        return trio.run(run, args.dir, args.node, args.rate, args.count, args.seed)
    except (OSError, EOFError) as exc:
        print(f"workload: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    sys.exit(main())

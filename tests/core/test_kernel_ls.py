"""The daemon serving the kernel's local SA requests (RDMA_NL_LS, behavior.md §16).

This kernel has no NETLINK_RDMA, so a datagram socketpair stands in for the kernel: one end
is handed to the daemon as systemd would hand it the ``ListenNetlink=rdma 4`` socket, the test
speaks the kernel's side with the project's netlink codecs. Two real daemons with the default
provider share a simulated fabric, so answers are real resolutions.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from ibacm.core.daemon import Daemon
from ibacm.fabric.sim.world import SimWorld
from ibacm.provider.api import Counter
from ibacm.wire.netlink import (
    LsErrorReply,
    LsIpResolveReply,
    LsPathReply,
    LsSetTimeout,
    PathUse,
    decode_ls_message,
    encode_ls_ip_resolve_request,
    encode_ls_resolve_request,
)
from tests.core.support import cluster


@contextlib.asynccontextmanager
async def kernel_cluster(
    tmp_path: Path,
) -> AsyncIterator[tuple[SimWorld, Daemon, trio.socket.SocketType]]:
    """node1 and node2 daemons; node1's kernel netlink socket is a socketpair end."""
    kernel_end, daemon_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    kernel = trio.socket.from_stdlib_socket(kernel_end)

    def netlink_for(name: str) -> dict[str, Any]:
        if name == "node1":
            return {"inherited_netlink": daemon_end, "kernel_service": True}
        return {"kernel_service": False}

    try:
        async with cluster(tmp_path, nodes=2, daemon_args=netlink_for) as run:
            yield run.world, run.daemons["node1"], kernel
    finally:
        kernel.close()


async def next_message(kernel: trio.socket.SocketType) -> object:
    with trio.fail_after(30):
        return decode_ls_message(await kernel.recv(65536))


@pytest.mark.trio
async def test_kernel_path_and_ip_requests_are_answered(tmp_path: Path) -> None:
    async with kernel_cluster(tmp_path) as (world, daemon, kernel):
        # The service first tells the kernel how long it may take.
        announce = await next_message(kernel)
        assert isinstance(announce, LsSetTimeout)
        assert announce.timeout_ms > 2000

        node1, node2 = world.node("node1"), world.node("node2")
        resolves_before = daemon.counters.values[Counter.RESOLVE]
        await kernel.send(
            encode_ls_resolve_request(
                42, "mlx5_0", 1, PathUse.GMP, dgid=node2.gids[0], sgid=node1.gids[0], pkey=0xFFFF
            )
        )
        reply = await next_message(kernel)
        assert isinstance(reply, LsPathReply)
        assert reply.hdr.seq == 42
        flags, path = reply.paths[0]
        assert flags == 0x2B
        assert (path.dlid, path.slid) == (node2.lids[0], node1.lids[0])
        assert path.dgid == node2.gids[0]
        assert daemon.counters.values[Counter.RESOLVE] == resolves_before + 1

        # IP_RESOLVE (C answers it with an error): the GID of node2's IPoIB address.
        ip = ipaddress.ip_interface(node2.ipv4[0]).ip
        await kernel.send(encode_ls_ip_resolve_request(43, 5, ip))
        ip_reply = await next_message(kernel)
        assert isinstance(ip_reply, LsIpResolveReply)
        assert ip_reply.hdr.seq == 43
        assert ip_reply.gids == [node2.gids[0]]


@pytest.mark.trio
async def test_kernel_request_for_unknown_gid_gets_error_reply(tmp_path: Path) -> None:
    async with kernel_cluster(tmp_path) as (world, _daemon, kernel):
        assert isinstance(await next_message(kernel), LsSetTimeout)
        node1 = world.node("node1")
        nobody = bytes.fromhex("fe800000000000000000000000000bad")
        await kernel.send(
            encode_ls_resolve_request(
                7, "mlx5_0", 1, PathUse.UNIDIRECTIONAL, dgid=nobody, sgid=node1.gids[0]
            )
        )
        reply = await next_message(kernel)
        assert isinstance(reply, LsErrorReply)
        assert reply.hdr.seq == 7

"""Helpers for the simulated-fabric tests: a running world and one node's port, ready to use."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

from ibacm.fabric.api import Fabric, Port, PortAttributes, SaDestination, UdQp
from ibacm.fabric.sim.hub import HubFabric, serve_hub
from ibacm.fabric.sim.hub_protocol import Frame, FrameDecoder
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.mad import McMemberRecord
from tests.conftest import require_file

DATA = Path(__file__).parent / "data"
NET_EXAMPLES = Path("/usr/share/doc/ibsim-utils/net-examples")
ACM_MGID = bytes.fromhex("ff154001ffff00030400000000000000")
ACM_QKEY = 0x80010000


def net_example(name: str) -> str:
    """Text of one of ibsim's example topologies (Debian ibsim-utils)."""
    return require_file(NET_EXAMPLES / name).read_text()


@asynccontextmanager
async def running(world: SimWorld) -> AsyncIterator[SimWorld]:
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        yield world
        nursery.cancel_scope.cancel()


@asynccontextmanager
async def hub(world: SimWorld, path: Path) -> AsyncIterator[str]:
    """``world`` running and a hub serving it at ``path`` (yielded as the hub gives it); the
    hub stops when the block ends, or before when a test shuts it down."""
    async with running(world), trio.open_nursery() as nursery:
        yield await nursery.start(serve_hub, world, path)
        nursery.cancel_scope.cancel()


@dataclass
class NodePort:
    """Port 1 of the first device of a node, with its attributes and SA destination."""

    fabric: Fabric
    port: Port
    attrs: PortAttributes

    @property
    def dest(self) -> SaDestination:
        return SaDestination(self.attrs.sm_lid, self.attrs.sm_sl, self.attrs.sa_pkey_index())

    @property
    def gid(self) -> bytes:
        return self.attrs.gids[0]

    @property
    def lid(self) -> int:
        return self.attrs.lid

    async def sa(self, mad: bytes, *, timeout_ms: int = 200, retries: int = 2) -> bytes:
        return await self.port.sa_send(mad, self.dest, timeout_ms=timeout_ms, retries=retries)

    async def qp(self, recv_depth: int = 64) -> UdQp:
        return await self.port.open_ud(0, recv_depth=recv_depth)


async def open_node(fabric: Fabric, port_num: int = 1) -> NodePort:
    device = (await fabric.open())[0]
    port = device.port(port_num)
    return NodePort(fabric, port, await port.query())


@dataclass
class HubPair:
    """node1 and node2 of a served world, each through a hub connection of its own."""

    path: str
    world: SimWorld
    f1: HubFabric
    f2: HubFabric
    a: NodePort
    b: NodePort


@asynccontextmanager
async def hub_pair(tmp_path: Path) -> AsyncIterator[HubPair]:
    world = SimWorld(generate(2))
    async with hub(world, tmp_path / "hub.sock") as path:
        f1, f2 = HubFabric(path, "node1"), HubFabric(path, "node2")
        a, b = await open_node(f1), await open_node(f2)
        yield HubPair(path, world, f1, f2, a, b)
        await f1.aclose()
        await f2.aclose()


def acm_join_record(
    port_gid: bytes,
    *,
    qkey: int = ACM_QKEY,
    mtu: int = 4,
    rate: int = 3,
    mgid: bytes = ACM_MGID,
    join_state: int = 1,
) -> McMemberRecord:
    """The MCMemberRecord ibacmp sends for group 0 (mad-protocol.md §9.6)."""
    return McMemberRecord(
        mgid=mgid,
        port_gid=port_gid,
        qkey=qkey,
        mtu_selector=2,
        mtu=mtu,
        pkey=0xFFFF,
        rate_selector=2,
        rate=rate,
        scope=5,
        join_state=join_state,
    )


async def frames_answered(stream: trio.SocketStream, data: bytes, count: int) -> list[Frame]:
    """Send raw hub frames ``data``; the first ``count`` frames the hub sends back."""
    await stream.send_all(data)
    decoder = FrameDecoder()
    frames: list[Frame] = []
    with trio.fail_after(10):
        while len(frames) < count:
            frames += decoder.feed(await stream.receive_some(1 << 16))
    return frames

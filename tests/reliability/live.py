"""Live daemons for the reliability suites: real ``Daemon``s with the real ``ibacmp`` provider
on one in-process ``SimWorld``, each serving its own unix socket, plus small clients.

``IBACM_SOAK=1`` (``make soak``) turns the suites' sizes up: ``soak(quick, long)`` picks one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from ibacm.config.option_values import ProviderLine, ServerMode
from ibacm.config.options import Options
from ibacm.core.daemon import Daemon
from ibacm.core.dispatch import Dispatcher
from ibacm.core.hits import HitPath
from ibacm.core.local_topology import AddressFile
from ibacm.core.local_topology import Topology as CoreTopology
from ibacm.core.model import iter_endpoints
from ibacm.core.services import DaemonServices
from ibacm.fabric.api import IpAddress
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.provider.acmp.endpoint import AcmpEndpoint
from ibacm.provider.acmp.provider import AcmpProvider
from ibacm.provider.api import Counters
from ibacm.provider.registry import ProviderEntry, ProviderSet
from ibacm.tools.sim_node_files import addr_text
from ibacm.wire.client import (
    MSG_MAX,
    AcmHdr,
    AcmMessage,
    AcmOp,
    ClientFramer,
    EpAddr,
    EpFlag,
)

ACMP = ProviderEntry("ibacmp", AcmpProvider, "ibacm.provider.acmp.provider:AcmpProvider")
SOAK = os.environ.get("IBACM_SOAK") == "1"


def soak(quick: int, long: int) -> int:
    """``long`` under ``make soak``, else ``quick``."""
    return long if SOAK else quick


def resolve_frame(source: str, dest: str, flags: int = 0) -> bytes:
    """``ib_acme -f n -s SOURCE -d DEST`` (plus ``flags`` on the DEST entry, e.g. NODELAY)."""
    return AcmMessage(
        hdr=AcmHdr(opcode=AcmOp.RESOLVE),
        entries=[
            EpAddr.from_name(source, EpFlag.SOURCE),
            EpAddr.from_name(dest, EpFlag.DEST | flags),
        ],
    ).encode()


def node_options(run_dir: Path, **changes: object) -> Options:
    run_dir.mkdir(parents=True, exist_ok=True)
    options = Options(
        log_file="stderr",
        lock_file=str(run_dir / "ibacm.pid"),
        run_dir=str(run_dir),
        server_mode=ServerMode.UNIX,
        providers=[ProviderLine("ibacmp", True, None, 1)],
    )
    for key, value in changes.items():
        setattr(options, key, value)
    return options


@dataclass(eq=False)
class LiveNode:
    name: str
    daemon: Daemon
    run_dir: Path
    finished: trio.Event = field(default_factory=trio.Event)
    crashed: list[BaseException] = field(default_factory=list)

    @property
    def socket_path(self) -> str:
        return str(self.run_dir / "ibacm-unix.sock")

    def endpoints(self) -> list[AcmpEndpoint]:
        return [
            ep.ctx
            for ep in iter_endpoints(self.daemon.topology.devices)
            if isinstance(ep.ctx, AcmpEndpoint)
        ]

    @property
    def alive(self) -> bool:
        return not self.finished.is_set()


@dataclass(eq=False)
class LiveCluster:
    world: SimWorld
    nodes: dict[str, LiveNode]

    def __getitem__(self, name: str) -> LiveNode:
        return self.nodes[name]


async def _run_daemon(node: LiveNode, *, task_status: trio.TaskStatus[Daemon]) -> None:
    try:
        await node.daemon.run(task_status=task_status)
    except BaseException as exc:
        node.crashed.append(exc)
        raise
    finally:
        node.finished.set()


async def wait_endpoints_ready(nodes: Sequence[LiveNode], timeout: float = 30.0) -> None:
    with trio.fail_after(timeout):
        while not all(
            node.endpoints() and all(ep.ready for ep in node.endpoints()) for node in nodes
        ):
            await trio.sleep(0.01)


@contextlib.asynccontextmanager
async def live_cluster(
    tmp_path: Path, nodes: int = 2, *, start: int | None = None, **option_changes: object
) -> AsyncIterator[LiveCluster]:
    """A SimWorld of ``nodes`` nodes with a real daemon on the first ``start`` (default all)."""
    world = SimWorld(generate(nodes))
    cluster = LiveCluster(world, {})
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        for name in world.node_names[: start if start is not None else nodes]:
            run_dir = tmp_path / name
            options = node_options(run_dir, **option_changes)
            addr_file = run_dir / "ibacm_addr.cfg"
            addr_file.write_text(addr_text(world.topology, name))
            daemon = Daemon(
                options,
                world.fabric(name),
                addr_file=str(addr_file),
                providers=[ACMP],
                admin=False,
            )
            node = LiveNode(name, daemon, run_dir)
            await nursery.start(_run_daemon, node)
            cluster.nodes[name] = node
        await wait_endpoints_ready(list(cluster.nodes.values()))
        try:
            yield cluster
        finally:
            for node in cluster.nodes.values():
                node.daemon.request_shutdown()
            with trio.move_on_after(10):
                for node in cluster.nodes.values():
                    await node.finished.wait()
            nursery.cancel_scope.cancel()


class Client:
    """One client connection (async), framing replies with the real framer."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.framer = ClientFramer(replies=True)

    @classmethod
    async def connect(cls, path: str) -> Client:
        return cls(await trio.open_unix_socket(path))

    async def request(self, frame: bytes) -> bytes:
        await self.stream.send_all(frame)
        while True:
            reply = self.framer.next_frame()
            if reply is not None:
                return reply
            data = await self.stream.receive_some(MSG_MAX * 4)
            if not data:
                raise EOFError("the daemon closed the connection")
            self.framer.feed(data)

    async def aclose(self) -> None:
        await self.stream.aclose()


def blocking_request(path: str, frame: bytes, timeout: float = 10.0) -> bytes:
    """One request on a fresh blocking connection (for code running in a worker thread)."""
    framer = ClientFramer(replies=True)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(frame)
        while True:
            reply = framer.next_frame()
            if reply is not None:
                return reply
            data = sock.recv(MSG_MAX * 4)
            if not data:
                raise EOFError("the daemon closed the connection")
            framer.feed(data)


# -- the core without sockets (for the mock clock) --------------------------------------------


@dataclass(eq=False)
class CoreNode:
    """One node's real core (topology + dispatcher) and ibacmp, without client sockets."""

    name: str
    topology: CoreTopology
    dispatcher: Dispatcher
    scope: trio.CancelScope
    hits: HitPath = field(init=False)

    def __post_init__(self) -> None:
        # The daemon's cache-hit path (its client loop's), counted with the global counters.
        self.hits = HitPath(self.dispatcher.devices, self.dispatcher.max_paths)
        self.dispatcher.counters.add_tally(self.hits.tally)

    def answer_now(self, frame: bytes) -> bytes | None:
        """What the daemon answers without waiting: a cache hit, a PERF or EP query (None:
        ``dispatcher.resolve`` answers, the RESOLVE counted)."""
        return self.hits.answer(frame, trio.current_time()) or self.dispatcher.answer_now(frame)

    def endpoints(self) -> list[AcmpEndpoint]:
        return [
            ep.ctx
            for ep in iter_endpoints(self.topology.devices)
            if isinstance(ep.ctx, AcmpEndpoint)
        ]

    async def stop(self) -> None:
        await self.topology.close()
        self.scope.cancel()


async def _no_route(dest: IpAddress, scope_id: int) -> IpAddress:
    raise OSError(errno.ENETUNREACH, "no kernel route in the simulated fabric")


async def start_core_node(
    world: SimWorld, work: Path, name: str, nursery: trio.Nursery, **option_changes: object
) -> CoreNode:
    """Open ``name``'s devices and ports with ibacmp, as the daemon does at start-up."""
    run_dir = work / name
    options = node_options(run_dir, **option_changes)
    addr_file = run_dir / "ibacm_addr.cfg"
    addr_file.write_text(addr_text(world.topology, name))
    counters = Counters()
    services = DaemonServices(options, counters, None)
    providers = ProviderSet.create([ACMP], services, default="ibacmp")
    await providers.start()
    topology = CoreTopology(
        world.fabric(name),
        providers,
        services,
        AddressFile(str(addr_file), support_ips=options.support_ips_in_addr_cfg),
    )
    scope = await nursery.start(_hosted, topology)
    return CoreNode(name, topology, Dispatcher(topology.devices, counters, _no_route), scope)


async def _hosted(
    topology: CoreTopology, *, task_status: trio.TaskStatus[trio.CancelScope]
) -> None:
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            await nursery.start(topology.run)
            task_status.started(scope)

"""Shared pieces of the core tests: a daemon on the simulated fabric and a raw ACM client."""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from ibacm.config.option_values import ProviderLine, ServerMode
from ibacm.config.options import Options
from ibacm.core.daemon import Daemon
from ibacm.core.dispatch import Dispatcher
from ibacm.core.local_topology import AddressFile
from ibacm.core.local_topology import Topology as CoreTopology
from ibacm.core.model import iter_endpoints
from ibacm.core.services import DaemonServices
from ibacm.core.srcaddr import Probe
from ibacm.fabric.api import IpAddress
from ibacm.fabric.sim.topo_file import Topology, generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.provider.acmp.provider import AcmpProvider
from ibacm.provider.api import Counters
from ibacm.provider.registry import ProviderEntry, ProviderSet
from ibacm.wire.client import MSG_MAX, ClientFramer
from tests.core.provider_pkg.testprov import TestProvider

TESTPROV = ProviderEntry("testprov", TestProvider, "tests.core.provider_pkg.testprov")


def make_options(tmp_path: Path, **changes: object) -> Options:
    """Options with every file inside ``tmp_path`` and testprov as the default provider."""
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    options = Options(
        log_file="stderr",
        lock_file=str(run / "ibacm.pid"),
        run_dir=str(run),
        providers=[ProviderLine("testprov", True, None, 1)],
    )
    for key, value in changes.items():
        setattr(options, key, value)
    return options


@dataclass
class Running:
    world: SimWorld
    daemon: Daemon
    run_dir: Path

    @property
    def unix_socket(self) -> str:
        return str(self.run_dir / "ibacm-unix.sock")

    @property
    def provider(self) -> TestProvider:
        provider = self.daemon.providers.get("testprov")
        assert isinstance(provider, TestProvider)
        return provider


@contextlib.asynccontextmanager
async def sim_daemon(
    tmp_path: Path,
    *,
    topology: Topology | None = None,
    node: str = "node1",
    addr_lines: Sequence[str] = (),
    options: Options | None = None,
    providers: Sequence[ProviderEntry] = (TESTPROV,),
    opts_file: str | None = None,
    admin: bool = False,
) -> AsyncIterator[Running]:
    """A real Daemon on a running SimWorld; shut down gracefully at the end."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    world = SimWorld(topology or generate(2))
    options = options or make_options(tmp_path)
    addr_file = tmp_path / "ibacm_addr.cfg"
    if not addr_file.exists():
        addr_file.write_text("".join(f"{line}\n" for line in addr_lines))
    daemon = Daemon(
        options,
        world.fabric(node),
        addr_file=str(addr_file),
        opts_file=opts_file,
        providers=list(providers),
        admin=admin,
    )
    finished = trio.Event()

    async def run_daemon(*, task_status: trio.TaskStatus[Daemon]) -> None:
        try:
            await daemon.run(task_status=task_status)
        finally:
            finished.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        await nursery.start(run_daemon)
        try:
            yield Running(world, daemon, Path(options.run_dir))
        finally:
            daemon.request_shutdown()
            with trio.move_on_after(10):
                await finished.wait()
            nursery.cancel_scope.cancel()


class AcmClient:
    """A raw client-protocol connection (what ib_acme/librdmacm do, minus their quirks)."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.framer = ClientFramer(replies=True)

    @classmethod
    async def unix(cls, path: str) -> AcmClient:
        return cls(await trio.open_unix_socket(path))

    @classmethod
    async def tcp(cls, host: str, port: int) -> AcmClient:
        return cls(await trio.open_tcp_stream(host, port))

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def receive(self) -> bytes:
        """One whole reply; raises EOFError when the daemon closed the connection."""
        while True:
            frame = self.framer.next_frame()
            if frame is not None:
                return frame
            data = await self.stream.receive_some(MSG_MAX * 4)
            if not data:
                raise EOFError("connection closed by the daemon")
            self.framer.feed(data)

    async def request(self, data: bytes) -> bytes:
        await self.send(data)
        return await self.receive()

    async def closed_by_peer(self, timeout: float = 5.0) -> bool:
        """True when the daemon closes the connection (EOF) within ``timeout``."""
        with trio.move_on_after(timeout):
            try:
                data = await self.stream.receive_some(MSG_MAX)
            except trio.BrokenResourceError:
                return True
            return data == b""
        return False

    async def aclose(self) -> None:
        await self.stream.aclose()


def unix_mode(tmp_path: Path) -> Options:
    return make_options(tmp_path, server_mode=ServerMode.UNIX)


def free_tcp_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Core:
    """The core without sockets: topology + dispatcher on a running SimWorld."""

    world: SimWorld
    topology: CoreTopology
    dispatcher: Dispatcher
    counters: Counters
    provider: TestProvider


async def _no_route(dest: IpAddress, scope_id: int) -> IpAddress:
    raise OSError(errno.ENETUNREACH, "Network is unreachable")


@contextlib.asynccontextmanager
async def sim_core(
    tmp_path: Path,
    *,
    topology: Topology | None = None,
    node: str = "node1",
    addr_lines: Sequence[str] | None = (),
    options: Options | None = None,
    probe: Probe = _no_route,
) -> AsyncIterator[Core]:
    """Devices, ports and endpoints of ``node`` served by testprov, and a Dispatcher on them.

    The default source-selection probe says "no route", so automatic source selection
    depends only on the endpoints' on-link prefixes (deterministic on any test machine).
    """
    world = SimWorld(topology or generate(2))
    options = options or make_options(tmp_path)
    addr_file = tmp_path / "ibacm_addr.cfg"
    if addr_lines is not None:  # None: no address file, the core generates one
        addr_file.write_text("".join(f"{line}\n" for line in addr_lines))
    counters = Counters()
    services = DaemonServices(options, counters, None)
    providers = ProviderSet.create([TESTPROV], services, default="testprov")
    await providers.start()
    provider = providers.get("testprov")
    assert isinstance(provider, TestProvider)
    topo = CoreTopology(
        world.fabric(node),
        providers,
        services,
        AddressFile(str(addr_file), support_ips=options.support_ips_in_addr_cfg),
    )
    dispatcher = Dispatcher(topo.devices, counters, probe)
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        await nursery.start(topo.run)
        try:
            yield Core(world, topo, dispatcher, counters, provider)
        finally:
            await topo.close()
            nursery.cancel_scope.cancel()


IBACMP = ProviderEntry("ibacmp", AcmpProvider, "ibacm.provider.acmp.provider:AcmpProvider")


@dataclass
class Cluster:
    """Daemons with the real default provider on one simulated fabric, in this process."""

    world: SimWorld
    daemons: dict[str, Daemon]
    base: Path

    def socket(self, node: str = "node1") -> str:
        return str(self.base / node / "ibacm-unix.sock")


@contextlib.asynccontextmanager
async def cluster(
    tmp_path: Path,
    *,
    nodes: int = 3,
    ports: int = 1,
    node1: Options | None = None,
    customize: Callable[[str, Options], None] | None = None,
    daemon_args: Callable[[str], dict[str, Any]] | None = None,
) -> AsyncIterator[Cluster]:
    """One daemon per node, each with its own directory ``tmp_path/<node>`` holding its
    address file, sockets and pid file. ``node1`` replaces node1's options; ``customize``
    edits each node's options; ``daemon_args`` adds Daemon keyword arguments per node."""
    world = SimWorld(generate(nodes, ports_per_hca=ports))
    daemons: dict[str, Daemon] = {}
    async with trio.open_nursery() as nursery:
        await nursery.start(world.run)
        for name in world.node_names:
            home = tmp_path / name
            home.mkdir()
            (home / "ibacm_addr.cfg").write_text(f"{name} mlx5_0 1 default\n")
            options = Options(log_file="stderr", run_dir=str(home), lock_file=str(home / "pid"))
            if name == "node1" and node1 is not None:
                options = node1
                options.run_dir = str(home)
            if customize is not None:
                customize(name, options)
            extra = daemon_args(name) if daemon_args is not None else {}
            daemon = Daemon(
                options,
                world.fabric(name),
                addr_file=str(home / "ibacm_addr.cfg"),
                providers=[IBACMP],
                admin=extra.pop("admin", False),
                **extra,
            )
            await nursery.start(daemon.run)
            daemons[name] = daemon
        # Ready means serving; the endpoints may still be joining their groups. A test that
        # resolves at once must not race a peer's join (its request would wait a retry).
        with trio.move_on_after(10):
            while not all(_endpoints_ready(daemon) for daemon in daemons.values()):
                await trio.sleep(0.005)
        try:
            yield Cluster(world, daemons, tmp_path)
        finally:
            for daemon in daemons.values():
                daemon.request_shutdown()
            with trio.move_on_after(10):
                for daemon in daemons.values():
                    await daemon.stopped.wait()
            nursery.cancel_scope.cancel()


def _endpoints_ready(daemon: Daemon) -> bool:
    return all(
        getattr(endpoint.ctx, "ready", True) for endpoint in iter_endpoints(daemon.topology.devices)
    )

"""Share one simulated fabric between processes: the hub server.

``serve_hub(world, path)`` listens on a unix socket; each daemon connects with
``HubFabric(path, node_name)`` (``hub_client.py``, re-exported here) and reaches the world
through it: UD sends/receives, SA MADs, port queries, events and IP addresses (framing in
``hub_protocol``). The hub never blocks the fabric on a slow client: UD MADs for a client that
stops reading are dropped once its queue is full, as an RNR drop would, and so are the
POST_ERROR / SA_POST_ERROR answers to its failed posts once that many control frames wait
(counted in the ``post_error_dropped`` stat). Control clients (``ibacm-sim fault ...``,
``hub_call``) change faults, flap ports, move the SM and so on.

``python -m ibacm.fabric.sim.hub --dir DIR ...`` runs a hub as its own process (what
``ibacm-sim up`` starts): it writes DIR/topology.json and DIR/hub.pid, serves DIR/hub.sock,
sends sd_notify READY=1 and cleans up on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import traceback
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from ibacm.fabric.api import (
    AddressVector,
    FabricError,
    IpEvent,
    PortEvent,
    ReceivedMad,
    SaDestination,
)
from ibacm.fabric.sim import hub_protocol as hp
from ibacm.fabric.sim.faults import FaultSettingError
from ibacm.fabric.sim.hub_client import HubConnectionLost, HubError, HubFabric, hub_call
from ibacm.fabric.sim.hub_protocol import Frame, FrameType
from ibacm.fabric.sim.runtime import DeviceRuntime, HostRuntime, PortRuntime, WorldQp
from ibacm.fabric.sim.topo_file import Topology, TopologyError, generate, parse_ibnetdiscover
from ibacm.fabric.sim.world import SimWorld

DATA_QUEUE_LIMIT = 65536
"""UD MADs a hub holds for one client before dropping (the client is not reading)."""
_READ_SIZE = 1 << 16


class _Hub:
    def __init__(self, world: SimWorld, nursery: trio.Nursery) -> None:
        self.world = world
        self.nursery = nursery
        self.sessions: set[_Session] = set()
        self.shutdown = trio.Event()


class _HubQp:
    """World-side sink of a client's QP: MADs become UD_RECV frames."""

    def __init__(self, session: _Session, handle: int) -> None:
        self.session = session
        self.handle = handle
        self.qp: WorldQp | None = None

    def deliver(self, received: ReceivedMad) -> bool:
        return self.session.push(hp.encode_ud_recv(self.handle, received), droppable=True)


@dataclass(eq=False)
class _DeviceSink:
    session: _Session
    index: int

    def deliver_event(self, event: PortEvent) -> None:
        self.session.push(hp.encode_event(self.index, event.port_num, event.type))


class _Session:
    """One client connection (a daemon, or a control client such as ``ibacm-sim``)."""

    def __init__(self, hub: _Hub, stream: trio.abc.Stream) -> None:
        self.hub = hub
        self.world = hub.world
        self.stream = stream
        self.control: deque[bytes] = deque()
        self.data: deque[bytes] = deque()
        self.wakeup = trio.Event()
        self.idle = trio.Event()
        """Set while everything queued has been written."""
        self.host: HostRuntime | None = None
        self.devices: list[DeviceRuntime] = []
        self.device_sinks: list[_DeviceSink] = []
        self.qps: dict[int, _HubQp] = {}
        self.next_handle = 1
        self.agents: list[tuple[PortRuntime, int]] = []

    # -- output ---------------------------------------------------------------------------

    def push(self, data: bytes, *, droppable: bool = False) -> bool:
        if droppable:
            if len(self.data) >= DATA_QUEUE_LIMIT:
                return False
            self.data.append(data)
        else:
            self.control.append(data)
        self.wakeup.set()
        return True

    async def _writer(self) -> None:
        while True:
            if not self.control and not self.data:
                self.idle.set()
                self.wakeup = trio.Event()
                await self.wakeup.wait()
                continue
            self.idle = trio.Event()
            batch = list(self.control)
            self.control.clear()
            for _ in range(min(len(self.data), 512)):
                batch.append(self.data.popleft())
            await self.stream.send_all(b"".join(batch))

    def deliver_ip(self, event: IpEvent) -> None:
        entry = event.address
        self.push(
            hp.encode_json(
                FrameType.IP_EVENT,
                {"added": event.added, **hp.address_to_json(entry)},
            )
        )

    # -- input ----------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._writer)
                await self._reader()
                nursery.cancel_scope.cancel()
        except* (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away
        finally:
            self._cleanup()
            with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                await trio.aclose_forcefully(self.stream)

    async def _reader(self) -> None:
        decoder = hp.FrameDecoder()
        while True:
            chunk = await self.stream.receive_some(_READ_SIZE)
            if not chunk:
                return
            try:
                frames = decoder.feed(chunk)
            except hp.HubProtocolError as exc:
                print(f"ibacm-sim hub: dropping a client: {exc}", file=sys.stderr)
                return
            for item in frames:
                self._handle(item)

    def _handle(self, item: Frame) -> None:
        try:
            if item.type == FrameType.UD_POST:
                self._ud_post(item.body)
            elif item.type == FrameType.UD_SEND:
                self._ud_send(item.body)
            elif item.type == FrameType.SA_POST:
                self._sa_post(item.body)
            elif item.type == FrameType.CALL:
                self._call(item.body)
            elif item.type == FrameType.STAT:
                for name, value in dict(hp.decode_json(item.body)).items():
                    self.world.stats[str(name)] += int(value)
            else:
                raise hp.HubProtocolError(f"unexpected frame type {item.type:#x}")
        except hp.HubProtocolError as exc:
            print(f"ibacm-sim hub: bad frame from a client: {exc}", file=sys.stderr)

    def _ud_post(self, body: bytes) -> None:
        handle, remote_qpn, av, mad = hp.decode_ud_post(body)
        try:
            self._ud_transmit(handle, remote_qpn, av, mad)
        except FabricError as exc:
            self._post_failed(hp.encode_post_error(handle, str(exc)))

    def _post_failed(self, answer: bytes) -> None:
        """Tell the client a post failed (POST_ERROR, SA_POST_ERROR)."""
        # Not with the droppable MADs: each one is a failure the client counts or attributes.
        # Only a client that posts bad MADs and stops reading meets the bound.
        if len(self.control) < DATA_QUEUE_LIMIT:
            self.push(answer)
        else:
            self.world.stats["post_error_dropped"] += 1

    def _ud_send(self, body: bytes) -> None:
        call_id, handle, remote_qpn, av, mad = hp.decode_ud_send(body)
        try:
            self._ud_transmit(handle, remote_qpn, av, mad)
        except FabricError as exc:
            self.push(hp.encode_reply(call_id, error=exc))
        else:
            self.push(hp.encode_ok(call_id))

    def _ud_transmit(self, handle: int, remote_qpn: int, av: AddressVector, mad: bytes) -> None:
        qp = self.qps.get(handle)
        if qp is None or qp.qp is None:
            raise FabricError(f"no QP with handle {handle}")
        self.world.delivery.ud_send(qp.qp, mad, av, remote_qpn)

    def _sa_post(self, body: bytes) -> None:
        device, port, sm_lid, sm_sl, pkey_index, mad = hp.decode_sa_post(body)
        try:
            runtime = self._port(device, port)
            self.world.sa_transport.transmit(runtime, mad, SaDestination(sm_lid, sm_sl, pkey_index))
        except FabricError as exc:
            tid = int.from_bytes(mad[8:16], "big")  # the MAD header's TID, for the client
            self._post_failed(hp.encode_sa_post_error(device, port, tid, str(exc)))

    def _call(self, body: bytes) -> None:
        call_id, request = hp.decode_json_body(body)
        try:
            if not isinstance(request, dict) or not isinstance(request.get("op"), str):
                raise HubError("a call needs an object with an 'op' string")
            result = self._dispatch(request)
        except (FabricError, TopologyError, FaultSettingError) as exc:
            self.push(hp.encode_reply(call_id, error=exc))
        except (KeyError, TypeError, ValueError) as exc:
            self.push(hp.encode_reply(call_id, error=HubError(f"bad {request!r}: {exc!r}")))
        else:
            self.push(hp.encode_reply(call_id, result))

    # -- requests -------------------------------------------------------------------------

    def _port(self, device: int, port: int) -> PortRuntime:
        if not 0 <= device < len(self.devices):
            raise FabricError(f"no device with index {device}")
        return self.devices[device].port(port)

    def _dispatch(self, request: dict[str, Any]) -> Any:
        op = request["op"]
        handler = getattr(self, f"_op_{op}", None)
        if handler is None:
            raise HubError(f"unknown operation {op!r}")
        if self.host is None and op in _NODE_OPS:
            raise HubError(f"{op!r} needs a 'hello' with a node name first")
        return handler(request)

    def _op_hello(self, request: dict[str, Any]) -> Any:
        if int(request.get("version", 0)) != hp.PROTOCOL_VERSION:
            raise HubError(
                f"protocol version {request.get('version')} is not {hp.PROTOCOL_VERSION}"
            )
        if self.host is not None:
            raise HubError("hello was already sent on this connection")
        node = request.get("node")
        if node is None:
            return {"control": True}
        host = self.world.host(str(node))
        self.host = host
        self.devices = list(host.devices)
        devices = []
        for index, device in enumerate(self.devices):
            sink = _DeviceSink(self, index)
            self.device_sinks.append(sink)
            device.subscribe(sink)
            ports = []
            for port in device.ports:
                agent = self.world.sa_transport.register_agent(port, self._sa_sink(index, port.num))
                self.agents.append((port, agent))
                ports.append({"num": port.num, "agent": agent})
            devices.append({"name": device.name, "node_guid": device.node_guid, "ports": ports})
        host.subscribe_ip(self)
        self.hub.sessions.add(self)
        return {"node": host.name, "devices": devices}

    def _sa_sink(self, index: int, num: int) -> Callable[[bytes], None]:
        def deliver(mad: bytes) -> None:
            self.push(hp.encode_sa_recv(index, num, mad), droppable=True)

        return deliver

    def _op_query(self, request: dict[str, Any]) -> Any:
        port = self._port(int(request["device"]), int(request["port"]))
        attrs = self.world.directory.port_attributes(port)
        return hp.attrs_to_json(attrs)

    def _op_addresses(self, request: dict[str, Any]) -> Any:
        assert self.host is not None
        return [hp.address_to_json(entry) for entry in self.host.addresses]

    def _op_open_ud(self, request: dict[str, Any]) -> Any:
        port = self._port(int(request["device"]), int(request["port"]))
        handle = self.next_handle
        sink = _HubQp(self, handle)
        kwargs = {"qkey": int(request["qkey"])} if "qkey" in request else {}
        sink.qp = self.world.delivery.create_qp(port, int(request["pkey_index"]), sink, **kwargs)
        self.next_handle += 1
        self.qps[handle] = sink
        return {"handle": handle, "qpn": sink.qp.qpn}

    def _qp(self, request: dict[str, Any]) -> WorldQp:
        sink = self.qps.get(int(request["handle"]))
        if sink is None or sink.qp is None:
            raise FabricError(f"no QP with handle {request['handle']}")
        return sink.qp

    def _op_rebind_qp(self, request: dict[str, Any]) -> Any:
        port = self._port(int(request["device"]), int(request["port"]))
        pkey_index, qkey = int(request["pkey_index"]), int(request["qkey"])
        self.world.delivery.rebind_qp(self._qp(request), port, pkey_index, qkey)

    def _op_close_qp(self, request: dict[str, Any]) -> Any:
        qp = self._qp(request)
        self.world.delivery.destroy_qp(qp)
        del self.qps[int(request["handle"])]
        return None

    def _op_attach(self, request: dict[str, Any]) -> Any:
        mgid, mlid = bytes.fromhex(request["mgid"]), int(request["mlid"])
        self.world.delivery.attach(self._qp(request), mgid, mlid)

    def _op_detach(self, request: dict[str, Any]) -> Any:
        mgid, mlid = bytes.fromhex(request["mgid"]), int(request["mlid"])
        self.world.delivery.detach(self._qp(request), mgid, mlid)

    # -- control --------------------------------------------------------------------------

    def _op_faults(self, request: dict[str, Any]) -> Any:
        for name, value in dict(request.get("set", {})).items():
            self.world.faults.set(str(name), str(value))
        return self.world.faults.as_dict()

    def _op_stats(self, request: dict[str, Any]) -> Any:
        world = self.world
        return {
            "counters": [[c, m, a, n] for (c, m, a), n in sorted(world.counters.items())],
            "stats": dict(world.stats),
            "sa_queue": world.sa_queue_length,
            "sm_lid": world.sm_lid,
            "connected": sorted(s.host.name for s in self.hub.sessions if s.host is not None),
        }

    def _op_port(self, request: dict[str, Any]) -> Any:
        node, device, port = str(request["node"]), str(request["device"]), int(request["port"])
        if "down_for" in request:
            down_for = float(request["down_for"])
            if down_for < 0:
                raise HubError(f"down_for must be >= 0, got {down_for}")
            self.world.port(node, device, port)  # fail now for an unknown port
            self.hub.nursery.start_soon(self._flap, node, device, port, down_for)
        else:
            self.world.set_port_state(node, device, port, bool(request["up"]))

    async def _flap(self, node: str, device: str, port: int, down_for: float) -> None:
        with contextlib.suppress(FabricError):
            await self.world.port_flap(node, device, port, down_for)

    def _op_set_lid(self, request: dict[str, Any]) -> Any:
        self.world.set_lid(
            str(request["node"]), str(request["device"]), int(request["port"]), int(request["lid"])
        )

    def _op_move_sm(self, request: dict[str, Any]) -> Any:
        self.world.move_sm(str(request["node"]), reregister=bool(request.get("reregister", True)))

    def _op_reregister(self, request: dict[str, Any]) -> Any:
        node = request.get("node")
        self.world.client_reregister(None if node is None else str(node))

    def _op_hosts(self, request: dict[str, Any]) -> Any:
        return self.world.hosts_file()

    def _op_routes(self, request: dict[str, Any]) -> Any:
        return self.world.route_dump()

    def _op_shutdown(self, request: dict[str, Any]) -> Any:
        self.hub.nursery.start_soon(self._shutdown_after_reply)

    async def _shutdown_after_reply(self) -> None:
        # The reply is queued right after this request returns; stop once it is written.
        await trio.lowlevel.checkpoint()
        with trio.move_on_after(1):
            await self.idle.wait()
        self.hub.shutdown.set()

    def _cleanup(self) -> None:
        world = self.world
        for sink in self.qps.values():
            if sink.qp is not None:
                world.delivery.destroy_qp(sink.qp)
        self.qps.clear()
        for port, agent in self.agents:
            world.sa_transport.unregister_agent(port, agent)
        for device, device_sink in zip(self.devices, self.device_sinks, strict=False):
            device.unsubscribe(device_sink)
        if self.host is not None:
            self.host.unsubscribe_ip(self)
        self.hub.sessions.discard(self)


_NODE_OPS = frozenset(
    {"query", "addresses", "open_ud", "rebind_qp", "close_qp", "attach", "detach"}
)


async def _unix_listener(path: str) -> trio.SocketListener:
    target = Path(path)
    if target.exists() or target.is_symlink():
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            target.unlink()  # a stale socket of a hub that died
        else:
            raise FabricError(f"a hub is already serving {path}")
        finally:
            probe.close()
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.bind(path)
        sock.listen(256)
    except OSError:
        sock.close()
        raise
    return trio.SocketListener(sock)


async def serve_hub(
    world: SimWorld,
    socket_path: str | os.PathLike[str],
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``world`` (already running) on a unix socket until cancelled or told to stop.

    A ``shutdown`` request from a control client ends it. The socket file is removed on exit.
    """
    path = os.fspath(socket_path)
    listener = await _unix_listener(path)
    try:
        async with trio.open_nursery() as nursery:
            hub = _Hub(world, nursery)

            async def handle(stream: trio.SocketStream) -> None:
                try:
                    await _Session(hub, stream).run()
                except Exception:  # a bug must cost one connection, not the whole fabric
                    traceback.print_exc(file=sys.stderr)

            await nursery.start(trio.serve_listeners, handle, [listener])
            task_status.started(path)
            await hub.shutdown.wait()
            nursery.cancel_scope.cancel()
    finally:
        with contextlib.suppress(OSError):
            await listener.aclose()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


# -- the hub process ----------------------------------------------------------------------


@dataclass
class HubOptions:
    directory: Path
    topology: Topology
    seed: int = 0
    link_latency: float = 1e-6
    sa_service_time: float = 0.0002
    faults: dict[str, str] = field(default_factory=dict)


def load_topology(args: argparse.Namespace) -> Topology:
    if args.topology_json:
        return Topology.from_json(Path(args.topology_json).read_text())
    if args.topology:
        text = Path(args.topology).read_text()
        return parse_ibnetdiscover(text, mtu=args.mtu or 4, sm=args.sm)
    if args.nodes:
        return generate(
            args.nodes,
            hcas_per_node=args.hcas_per_node,
            ports_per_hca=args.ports_per_hca,
            mtu=args.mtu or 5,
            seed=args.seed,
        )
    raise TopologyError("give --nodes N, --topology FILE or --topology-json FILE")


def hub_argument_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ibacm.fabric.sim.hub",
        description="Run a simulated InfiniBand fabric shared by ibacm daemons over DIR/hub.sock.",
    )
    parser.add_argument("--dir", required=True, help="state directory (hub.sock, hub.pid, ...)")
    parser.add_argument("--nodes", type=int, help="generate node1..nodeN")
    parser.add_argument("--topology", help="ibnetdiscover or ibsim topology file")
    parser.add_argument("--topology-json", help="topology.json written by an earlier run")
    parser.add_argument("--hcas-per-node", type=int, default=1)
    parser.add_argument("--ports-per-hca", type=int, default=1)
    parser.add_argument("--mtu", type=int, help="port MTU enum 1..5 (default 5, files 4)")
    parser.add_argument("--sm", help="host or switch running the SM (topology files)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--link-latency", type=float, default=1e-6, help="seconds per hop")
    parser.add_argument("--sa-service-time", type=float, default=0.0002, help="seconds")
    parser.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="initial fault setting, e.g. loss=0.01 (repeatable)",
    )
    return parser


async def run_hub_process(options: HubOptions) -> None:
    """Run world + hub in DIR until SIGTERM/SIGINT or a shutdown request; tidy up after."""
    from ibacm.sd_notify import Notifier

    directory = options.directory
    world = SimWorld(
        options.topology,
        sa_service_time=options.sa_service_time,
        link_latency=options.link_latency,
        seed=options.seed,
    )
    for name, value in options.faults.items():
        world.faults.set(name, value)
    pid_file = directory / "hub.pid"
    socket_path = directory / "hub.sock"
    (directory / "topology.json").write_text(options.topology.to_json())
    pid_file.write_text(f"{os.getpid()}\n")
    try:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(world.run)

                async def serve(*, task_status: trio.TaskStatus[str]) -> None:
                    await serve_hub(world, socket_path, task_status=task_status)
                    nursery.cancel_scope.cancel()  # a shutdown request

                await nursery.start(serve)
                await Notifier.from_environment().ready(
                    f"hub serving {len(world.node_names)} nodes on {socket_path}"
                )
                async for _signal in signals:
                    nursery.cancel_scope.cancel()
                    break
    finally:
        with contextlib.suppress(FileNotFoundError):
            pid_file.unlink()
        with contextlib.suppress(FileNotFoundError):
            socket_path.unlink()


def main(argv: Sequence[str] | None = None) -> int:
    parser = hub_argument_parser()
    args = parser.parse_args(argv)
    directory = Path(args.dir)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        topology = load_topology(args)
        faults = {}
        for item in args.fault:
            name, sep, value = item.partition("=")
            if not sep:
                parser.error(f"--fault wants NAME=VALUE, got {item!r}")
            faults[name.strip()] = value.strip()
        options = HubOptions(
            directory, topology, args.seed, args.link_latency, args.sa_service_time, faults
        )
        trio.run(run_hub_process, options)
    except (TopologyError, FaultSettingError, FabricError, OSError, ValueError) as exc:
        print(f"ibacm-sim hub: {exc}", file=sys.stderr)
        return 1
    return 0


__all__ = ["HubConnectionLost", "HubError", "HubFabric", "hub_call", "main", "serve_hub"]

if __name__ == "__main__":
    sys.exit(main())

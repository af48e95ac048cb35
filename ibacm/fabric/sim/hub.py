"""Share one simulated fabric between processes: the hub server and the ``HubFabric`` client.

``serve_hub(world, path)`` listens on a unix socket; each daemon connects with
``HubFabric(path, node_name)``, which implements the ``Fabric`` interface by forwarding to the
world: UD sends/receives, SA MADs, port queries, events and IP addresses (framing in
``hub_protocol``). A hub drops UD MADs for a client that stops reading (its queue is
bounded), never blocking the fabric. A client whose hub connection drops sees every port go
DOWN (PORT_ERR, queries say DOWN, sends fail).

``HubFabric`` needs no task of its own: whichever of its callers is waiting reads the socket
and hands frames to everyone (one reader at a time, cancellation-safe), so it works with the
plain ``Fabric`` calls of the daemon. The control side (``ibacm-sim fault ...``) uses
``hub_call``.

``python -m ibacm.fabric.sim.hub --dir DIR ...`` runs a hub as its own process (this is
what ``ibacm-sim up`` starts).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import os
import signal
import socket
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from ibacm.fabric.api import (
    AddressVector,
    Device,
    Fabric,
    FabricError,
    InterfaceAddress,
    IpEvent,
    LinkLayer,
    NoDevicesError,
    Port,
    PortAttributes,
    PortDownError,
    PortEvent,
    PortEventType,
    PortState,
    ReceivedMad,
    SaDestination,
    SaSendError,
    SaTimeout,
    UdQp,
)
from ibacm.fabric.sim import hub_protocol as hp
from ibacm.fabric.sim.faults import FaultSettingError
from ibacm.fabric.sim.hub_protocol import Frame, FrameType
from ibacm.fabric.sim.topology import Topology, TopologyError, generate, parse_ibnetdiscover
from ibacm.fabric.sim.umad import UmadAgent
from ibacm.fabric.sim.world import DeviceRuntime, HostRuntime, PortRuntime, SimWorld, WorldQp

DATA_QUEUE_LIMIT = 65536
"""UD MADs a hub holds for one client before dropping (the client is not reading)."""
_READ_SIZE = 1 << 16
_ERRORS: dict[str, type[FabricError]] = {
    cls.__name__: cls
    for cls in (FabricError, NoDevicesError, PortDownError, SaSendError, SaTimeout)
}


class HubError(FabricError):
    """The hub refused a request (bad arguments, unknown node...)."""


# == server ================================================================================


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
                {"added": event.added, **_address_dict(entry)},
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
            if item.type == FrameType.UD_SEND:
                self._ud_send(item.body)
            elif item.type == FrameType.SA_SEND:
                self._sa_send(item.body)
            elif item.type == FrameType.CALL:
                self._call(item.body)
            elif item.type == FrameType.STAT:
                for name, value in dict(hp.decode_json(item.body)).items():
                    self.world.stats[str(name)] += int(value)
            else:
                raise hp.HubProtocolError(f"unexpected frame type {item.type:#x}")
        except hp.HubProtocolError as exc:
            print(f"ibacm-sim hub: bad frame from a client: {exc}", file=sys.stderr)

    def _ud_send(self, body: bytes) -> None:
        call_id, handle, remote_qpn, av, mad = hp.decode_ud_send(body)
        try:
            qp = self.qps.get(handle)
            if qp is None or qp.qp is None:
                raise FabricError(f"no QP with handle {handle}")
            self.world.ud_send(qp.qp, mad, av, remote_qpn)
        except FabricError as exc:
            self.push(hp.encode_reply(call_id, error=exc))
        else:
            self.push(hp.encode_ok(call_id))

    def _sa_send(self, body: bytes) -> None:
        call_id, device, port, sm_lid, sm_sl, pkey_index, mad = hp.decode_sa_send(body)
        try:
            runtime = self._port(device, port)
            self.world.sa_transmit(runtime, mad, SaDestination(sm_lid, sm_sl, pkey_index))
        except FabricError as exc:
            self.push(hp.encode_reply(call_id, error=exc))
        else:
            self.push(hp.encode_ok(call_id))

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
            self.world.subscribe_events(device, sink)
            ports = []
            for port in device.ports:
                agent = self.world.register_agent(port, self._sa_sink(index, port.num))
                self.agents.append((port, agent))
                ports.append({"num": port.num, "agent": agent})
            devices.append({"name": device.name, "node_guid": device.node_guid, "ports": ports})
        self.world.subscribe_ip(host, self)
        self.hub.sessions.add(self)
        return {"node": host.name, "devices": devices}

    def _sa_sink(self, index: int, num: int) -> Callable[[bytes], None]:
        def deliver(mad: bytes) -> None:
            self.push(hp.encode_sa_recv(index, num, mad), droppable=True)

        return deliver

    def _op_query(self, request: dict[str, Any]) -> Any:
        attrs = self.world.port_attributes(self._port(int(request["device"]), int(request["port"])))
        return _attrs_dict(attrs)

    def _op_addresses(self, request: dict[str, Any]) -> Any:
        assert self.host is not None
        return [_address_dict(entry) for entry in self.host.addresses]

    def _op_open_ud(self, request: dict[str, Any]) -> Any:
        port = self._port(int(request["device"]), int(request["port"]))
        handle = self.next_handle
        sink = _HubQp(self, handle)
        kwargs = {"qkey": int(request["qkey"])} if "qkey" in request else {}
        sink.qp = self.world.create_qp(port, int(request["pkey_index"]), sink, **kwargs)
        self.next_handle += 1
        self.qps[handle] = sink
        return {"handle": handle, "qpn": sink.qp.qpn}

    def _qp(self, request: dict[str, Any]) -> WorldQp:
        sink = self.qps.get(int(request["handle"]))
        if sink is None or sink.qp is None:
            raise FabricError(f"no QP with handle {request['handle']}")
        return sink.qp

    def _op_close_qp(self, request: dict[str, Any]) -> Any:
        qp = self._qp(request)
        self.world.destroy_qp(qp)
        del self.qps[int(request["handle"])]
        return None

    def _op_attach(self, request: dict[str, Any]) -> Any:
        self.world.attach(self._qp(request), bytes.fromhex(request["mgid"]), int(request["mlid"]))

    def _op_detach(self, request: dict[str, Any]) -> Any:
        self.world.detach(self._qp(request), bytes.fromhex(request["mgid"]), int(request["mlid"]))

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
                world.destroy_qp(sink.qp)
        self.qps.clear()
        for port, agent in self.agents:
            world.unregister_agent(port, agent)
        for device, device_sink in zip(self.devices, self.device_sinks, strict=False):
            world.unsubscribe_events(device, device_sink)
        if self.host is not None:
            world.unsubscribe_ip(self.host, self)
        self.hub.sessions.discard(self)


_NODE_OPS = frozenset({"query", "addresses", "open_ud", "close_qp", "attach", "detach"})


def _attrs_dict(attrs: PortAttributes) -> dict[str, Any]:
    return {
        "port_num": attrs.port_num,
        "state": int(attrs.state),
        "lid": attrs.lid,
        "lmc": attrs.lmc,
        "sm_lid": attrs.sm_lid,
        "sm_sl": attrs.sm_sl,
        "subnet_timeout": attrs.subnet_timeout,
        "active_mtu": attrs.active_mtu,
        "active_width": attrs.active_width,
        "active_speed": attrs.active_speed,
        "gids": [g.hex() for g in attrs.gids],
        "pkeys": list(attrs.pkeys),
        "link_layer": int(attrs.link_layer),
    }


def _attrs_from_dict(raw: dict[str, Any]) -> PortAttributes:
    return PortAttributes(
        port_num=int(raw["port_num"]),
        state=PortState(int(raw["state"])),
        lid=int(raw["lid"]),
        lmc=int(raw["lmc"]),
        sm_lid=int(raw["sm_lid"]),
        sm_sl=int(raw["sm_sl"]),
        subnet_timeout=int(raw["subnet_timeout"]),
        active_mtu=int(raw["active_mtu"]),
        active_width=int(raw["active_width"]),
        active_speed=int(raw["active_speed"]),
        gids=tuple(bytes.fromhex(g) for g in raw["gids"]),
        pkeys=tuple(int(p) for p in raw["pkeys"]),
        link_layer=LinkLayer(int(raw["link_layer"])),
    )


def _address_dict(entry: InterfaceAddress) -> dict[str, Any]:
    return {
        "ifname": entry.ifname,
        "address": str(entry.address),
        "prefixlen": entry.prefixlen,
        "gid": entry.gid.hex(),
        "pkey": entry.pkey,
    }


def _address_from_dict(raw: dict[str, Any]) -> InterfaceAddress:
    return InterfaceAddress(
        str(raw["ifname"]),
        ipaddress.ip_address(raw["address"]),
        int(raw["prefixlen"]),
        bytes.fromhex(raw["gid"]),
        int(raw["pkey"]),
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
                await _Session(hub, stream).run()

            await nursery.start(trio.serve_listeners, handle, [listener])
            task_status.started(path)
            await hub.shutdown.wait()
            nursery.cancel_scope.cancel()
    finally:
        with contextlib.suppress(OSError):
            await listener.aclose()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


# == client ================================================================================


class HubConnectionLost(FabricError):
    """The connection to the hub is gone."""


@dataclass(eq=False)
class _Call:
    done: bool = False
    result: Any = None
    error: dict[str, str] | None = None


class _Link:
    """A hub connection read by whichever caller waits (see the module docstring)."""

    def __init__(self, stream: trio.abc.Stream, on_frame: Callable[[Frame], None]) -> None:
        self.stream = stream
        self._decoder = hp.FrameDecoder()
        self._on_frame = on_frame
        self._send_lock = trio.Lock()
        self._pumping = False
        self._round = trio.Event()
        self.lost: str | None = None
        self.on_lost: Callable[[], None] = lambda: None
        self._calls: dict[int, _Call] = {}
        self._next_id = 1
        self.pending_stats: dict[str, int] = {}

    def kick(self) -> None:
        """Wake every waiter so it re-checks its condition."""
        old, self._round = self._round, trio.Event()
        old.set()

    async def until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            if self.lost is not None or self._pumping:
                await self._round.wait()
            else:
                await self._pump()

    async def until_set(self, event: trio.Event) -> None:
        await self.until(event.is_set)

    async def _pump(self) -> None:
        self._pumping = True
        try:
            try:
                data = await self.stream.receive_some(_READ_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                self._mark_lost(f"hub connection failed: {exc}")
                return
            if not data:
                self._mark_lost("the hub closed the connection")
                return
            try:
                frames = self._decoder.feed(data)
            except hp.HubProtocolError as exc:
                self._mark_lost(f"bad data from the hub: {exc}")
                return
            for item in frames:
                self._dispatch(item)
        finally:
            self._pumping = False
            self.kick()

    def _dispatch(self, item: Frame) -> None:
        if item.type == FrameType.REPLY:
            call_id, payload = hp.decode_json_body(item.body)
            call = self._calls.get(call_id)
            if call is not None:
                call.done = True
                if isinstance(payload, dict) and "error" in payload:
                    call.error = payload["error"]
                else:
                    call.result = payload.get("ok") if isinstance(payload, dict) else None
        elif item.type == FrameType.OK:
            call = self._calls.get(hp.decode_ok(item.body))
            if call is not None:
                call.done = True
        else:
            self._on_frame(item)

    def _mark_lost(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
            self.on_lost()

    async def send(self, data: bytes) -> None:
        if self.lost is not None:
            raise HubConnectionLost(self.lost)
        if self.pending_stats:
            data = hp.encode_json(FrameType.STAT, self.pending_stats) + data
            self.pending_stats = {}
        async with self._send_lock:
            # Shielded: a half-written frame would corrupt the stream for everyone.
            with trio.CancelScope(shield=True):
                try:
                    await self.stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                    self._mark_lost(f"hub connection failed: {exc}")
                    self.kick()
                    raise HubConnectionLost(self.lost or str(exc)) from exc

    def new_call(self) -> tuple[int, _Call]:
        call_id = self._next_id
        self._next_id = (self._next_id % 0xFFFFFFFF) + 1
        call = _Call()
        self._calls[call_id] = call
        return call_id, call

    async def finish(self, call_id: int, call: _Call, data: bytes) -> Any:
        """Send a request frame and wait for its reply; remote errors are raised here."""
        try:
            await self.send(data)
            await self.until(lambda: call.done or self.lost is not None)
        finally:
            self._calls.pop(call_id, None)
        if not call.done:
            raise HubConnectionLost(self.lost or "hub connection lost")
        if call.error is not None:
            kind = _ERRORS.get(call.error.get("type", ""), HubError)
            raise kind(call.error.get("message", "hub error"))
        return call.result

    async def call(self, request: dict[str, Any]) -> Any:
        call_id, call = self.new_call()
        return await self.finish(call_id, call, hp.encode_call(call_id, request))


class HubUdQp(UdQp):
    def __init__(self, port: HubPort, handle: int, qpn: int, recv_depth: int) -> None:
        self._port = port
        self._link = port.device.fabric.link
        self.handle = handle
        self._qpn = qpn
        self._depth = recv_depth
        self._queue: deque[ReceivedMad] = deque()
        self._closed = False

    @property
    def qpn(self) -> int:
        return self._qpn

    def deliver(self, received: ReceivedMad) -> None:
        if self._closed:
            return
        if len(self._queue) >= self._depth:
            stats = self._link.pending_stats
            stats["rnr_drop"] = stats.get("rnr_drop", 0) + 1
            return
        self._queue.append(received)

    async def send(self, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        if self._closed:
            raise FabricError(f"send on closed QP {self._qpn:#x}")
        link = self._link
        call_id, call = link.new_call()
        try:
            data = hp.encode_ud_send(call_id, self.handle, remote_qpn, av, mad)
        except hp.HubProtocolError as exc:
            link._calls.pop(call_id, None)
            raise FabricError(str(exc)) from exc
        try:
            await link.finish(call_id, call, data)
        except HubConnectionLost as exc:
            raise PortDownError(f"simulated port lost with the hub: {exc}") from exc

    async def receive(self) -> ReceivedMad:
        await self._link.until(lambda: bool(self._queue) or self._closed)
        if self._closed:
            raise trio.ClosedResourceError("the QP was destroyed")
        return self._queue.popleft()

    async def attach_mcast(self, mgid: bytes, mlid: int) -> None:
        await self._link.call(
            {"op": "attach", "handle": self.handle, "mgid": bytes(mgid).hex(), "mlid": mlid}
        )

    async def detach_mcast(self, mgid: bytes, mlid: int) -> None:
        await self._link.call(
            {"op": "detach", "handle": self.handle, "mgid": bytes(mgid).hex(), "mlid": mlid}
        )

    def close_local(self) -> None:
        self._closed = True
        self._queue.clear()
        self._link.kick()

    async def aclose(self) -> None:
        if self._closed:
            return
        self.close_local()
        self._port.device.fabric.qps.pop(self.handle, None)
        with contextlib.suppress(FabricError):
            await self._link.call({"op": "close_qp", "handle": self.handle})


class HubPort(Port):
    def __init__(self, device: HubDevice, num: int, agent_id: int) -> None:
        self.device = device
        self._num = num
        link = device.fabric.link
        self.agent = UmadAgent(agent_id, wait_for=link.until_set)
        self.last: PortAttributes | None = None

    @property
    def port_num(self) -> int:
        return self._num

    def down_attributes(self) -> PortAttributes:
        last = self.last
        if last is None:
            return PortAttributes(self._num, PortState.DOWN, 0, 0, 0, 0, 0, 0, 0, 0, (), ())
        return PortAttributes(
            last.port_num,
            PortState.DOWN,
            last.lid,
            last.lmc,
            0,
            last.sm_sl,
            last.subnet_timeout,
            last.active_mtu,
            last.active_width,
            last.active_speed,
            last.gids,
            last.pkeys,
            last.link_layer,
        )

    async def query(self) -> PortAttributes:
        fabric = self.device.fabric
        fabric.check_open()
        if fabric.link.lost is not None:
            await trio.lowlevel.checkpoint()
            return self.down_attributes()
        try:
            raw = await fabric.link.call(
                {"op": "query", "device": self.device.index, "port": self._num}
            )
        except HubConnectionLost:
            return self.down_attributes()
        self.last = _attrs_from_dict(raw)
        return self.last

    async def sa_send(
        self, mad: bytes, dest: SaDestination, *, timeout_ms: int, retries: int
    ) -> bytes:
        fabric = self.device.fabric
        fabric.check_open()
        link = fabric.link

        async def transmit(wire: bytes) -> None:
            call_id, call = link.new_call()
            try:
                data = hp.encode_sa_send(
                    call_id,
                    self.device.index,
                    self._num,
                    dest.sm_lid,
                    dest.sm_sl,
                    dest.pkey_index,
                    wire,
                )
            except hp.HubProtocolError as exc:
                link._calls.pop(call_id, None)
                raise SaSendError(str(exc)) from exc
            try:
                await link.finish(call_id, call, data)
            except HubConnectionLost as exc:
                raise SaSendError(f"hub connection lost: {exc}") from exc

        return await self.agent.send(mad, transmit, timeout_ms=timeout_ms, retries=retries)

    async def open_ud(self, pkey_index: int, *, recv_depth: int) -> UdQp:
        if recv_depth < 1:
            raise FabricError(f"recv_depth must be >= 1, got {recv_depth}")
        fabric = self.device.fabric
        fabric.check_open()
        try:
            reply = await fabric.link.call(
                {
                    "op": "open_ud",
                    "device": self.device.index,
                    "port": self._num,
                    "pkey_index": pkey_index,
                }
            )
        except HubConnectionLost as exc:
            raise PortDownError(f"simulated port lost with the hub: {exc}") from exc
        qp = HubUdQp(self, int(reply["handle"]), int(reply["qpn"]), recv_depth)
        fabric.qps[qp.handle] = qp
        return qp


class HubDevice(Device):
    def __init__(self, fabric: HubFabric, index: int, raw: dict[str, Any]) -> None:
        self.fabric = fabric
        self.index = index
        self._name = str(raw["name"])
        self._guid = int(raw["node_guid"])
        self.ports = {
            int(p["num"]): HubPort(self, int(p["num"]), int(p["agent"])) for p in raw["ports"]
        }
        self.events: deque[PortEvent] = deque()

    @property
    def name(self) -> str:
        return self._name

    @property
    def node_guid(self) -> int:
        return self._guid

    @property
    def phys_port_cnt(self) -> int:
        return max(self.ports, default=0)

    def port(self, port_num: int) -> Port:
        try:
            return self.ports[port_num]
        except KeyError:
            raise FabricError(f"{self._name} has no port {port_num}") from None

    async def wait_event(self) -> PortEvent:
        fabric = self.fabric
        await fabric.link.until(lambda: bool(self.events) or fabric.closed)
        if fabric.closed:
            raise trio.ClosedResourceError("the fabric was closed")
        return self.events.popleft()


class HubFabric(Fabric):
    """The Fabric of node ``node_name``, served by the hub at ``socket_path``."""

    def __init__(self, socket_path: str | os.PathLike[str], node_name: str) -> None:
        self.socket_path = os.fspath(socket_path)
        self.node_name = node_name
        self._link: _Link | None = None
        self.devices: list[HubDevice] = []
        self.qps: dict[int, HubUdQp] = {}
        self.ip_events: deque[IpEvent] = deque()
        self.closed = False

    @property
    def hostname(self) -> str:
        return self.node_name

    @property
    def link(self) -> _Link:
        if self._link is None:
            raise FabricError("the hub fabric is not open (call open() first)")
        return self._link

    def check_open(self) -> None:
        if self.closed:
            raise FabricError(f"the fabric of {self.node_name} is closed")

    async def open(self) -> Sequence[Device]:
        self.check_open()
        if self._link is not None:
            await trio.lowlevel.checkpoint()
            return list(self.devices)
        try:
            stream = await trio.open_unix_socket(self.socket_path)
        except OSError as exc:
            raise NoDevicesError(
                f"cannot reach the simulator hub at {self.socket_path}: {exc}"
            ) from exc
        link = _Link(stream, self._on_frame)
        link.on_lost = self._on_lost
        self._link = link
        try:
            reply = await link.call(
                {"op": "hello", "version": hp.PROTOCOL_VERSION, "node": self.node_name}
            )
        except FabricError as exc:
            await trio.aclose_forcefully(stream)
            self._link = None
            raise NoDevicesError(f"simulator hub refused node {self.node_name!r}: {exc}") from exc
        self.devices = [HubDevice(self, i, raw) for i, raw in enumerate(reply["devices"])]
        if not self.devices:
            raise NoDevicesError(f"node {self.node_name} has no InfiniBand device")
        return list(self.devices)

    def _on_frame(self, item: Frame) -> None:
        if item.type == FrameType.UD_RECV:
            handle, received = hp.decode_ud_recv(item.body)
            qp = self.qps.get(handle)
            if qp is not None:
                qp.deliver(received)
        elif item.type == FrameType.SA_RECV:
            index, num, mad = hp.decode_sa_recv(item.body)
            if 0 <= index < len(self.devices) and num in self.devices[index].ports:
                self.devices[index].ports[num].agent.deliver(mad)
        elif item.type == FrameType.EVENT:
            index, num, kind = hp.decode_event(item.body)
            if 0 <= index < len(self.devices):
                self.devices[index].events.append(PortEvent(num, kind))
        elif item.type == FrameType.IP_EVENT:
            raw = hp.decode_json(item.body)
            self.ip_events.append(IpEvent(bool(raw["added"]), _address_from_dict(raw)))

    def _on_lost(self) -> None:
        for device in self.devices:
            for num in sorted(device.ports):
                device.events.append(PortEvent(num, PortEventType.PORT_ERR))

    async def interface_addresses(self) -> Sequence[InterfaceAddress]:
        self.check_open()
        raw = await self.link.call({"op": "addresses"})
        return [_address_from_dict(entry) for entry in raw]

    async def wait_ip_event(self) -> IpEvent:
        link = self.link
        await link.until(lambda: bool(self.ip_events) or self.closed)
        if self.closed:
            raise trio.ClosedResourceError("the fabric was closed")
        return self.ip_events.popleft()

    async def aclose(self) -> None:
        if self.closed:
            await trio.lowlevel.checkpoint()
            return
        self.closed = True
        for qp in list(self.qps.values()):
            qp.close_local()
        self.qps.clear()
        if self._link is not None:
            self._link.lost = self._link.lost or "closed"
            self._link.kick()
            await trio.aclose_forcefully(self._link.stream)
        else:
            await trio.lowlevel.checkpoint()


async def hub_call(socket_path: str | os.PathLike[str], request: dict[str, Any]) -> Any:
    """One control request to a hub (``{"op": "faults", "set": {"loss": "0.1"}}`` ...)."""
    try:
        stream = await trio.open_unix_socket(os.fspath(socket_path))
    except OSError as exc:
        raise HubConnectionLost(f"cannot reach the simulator hub at {socket_path}: {exc}") from exc
    async with stream:
        link = _Link(stream, lambda item: None)
        await link.call({"op": "hello", "version": hp.PROTOCOL_VERSION})
        return await link.call(request)


# == hub process ===========================================================================


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
    from ibacm.core.systemd import Notifier

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


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["HubConnectionLost", "HubError", "HubFabric", "hub_call", "serve_hub"]

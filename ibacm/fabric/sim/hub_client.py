"""The daemon side of the simulator hub: ``HubFabric`` and control calls (``hub_call``).

``HubFabric(socket_path, node_name)`` implements the ``Fabric`` interface by forwarding to a
world served by ``serve_hub`` (hub.py): UD sends/receives, SA MADs (with umad semantics,
``UmadAgent``), port queries, events and IP addresses. When the hub connection drops, every
port goes DOWN: a PORT_ERR per port, queries answer DOWN, sends fail (PortDownError,
SaSendError), and SA requests on their way end with SaSendError.

It needs no task of its own: whichever caller is waiting (for a receive, an event, a reply)
reads the socket and hands the frames to everyone, one reader at a time, so it works with the
plain ``Fabric`` calls of the daemon and a cancelled reader loses nothing (it waits for the
socket to be readable, then reads without waiting). A QP being served (``UdQp.serve``) gets
its MADs from that reader in the round that read them, so a MAD posted in answer leaves
before any other task runs.

Writes never wait either: a frame goes to the socket at once (a non-blocking write on its
descriptor) and what the socket cannot take is kept, in call order, in an outbound buffer
that the next reader flushes first (it waits for room rather than for data while the buffer
holds something, and a write that leaves bytes behind wakes a reader waiting for data). A
frame is therefore never split by another one, and a cancelled caller cannot leave half of
one. ``post`` (a UD_POST frame) is answered only when it fails; that POST_ERROR counts in the
QP's ``completion_errors``. ``post`` raises SendQueueFull while the buffer holds
``OUTBOUND_LIMIT`` bytes; calls wait for room instead.

SA MADs go the same way, as SA_POST frames (``HubPort.sa_start``, its retransmissions and
``sa_post``): the MAD is written before ``sa_start`` returns, and its reply (SA_RECV), read by
whichever task reads, ends the ``SaCall`` in that round. A MAD the hub cannot send comes back
as an SA_POST_ERROR that ends its request with SaSendError, or is counted in the port's
``sa_post_errors`` when no request owns it.
"""

from __future__ import annotations

import contextlib
import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import trio

from ibacm.fabric.api import (
    RECEIVE_BATCH,
    AddressVector,
    Device,
    Fabric,
    FabricError,
    InterfaceAddress,
    IpEvent,
    MadHandler,
    NoDevicesError,
    Port,
    PortAttributes,
    PortDownError,
    PortEvent,
    PortEventType,
    PortState,
    PortTableDevice,
    ReceivedMad,
    SaCall,
    SaDestination,
    SaSendError,
    SaTimeout,
    SendQueueFull,
    UdQp,
    deliver_batch,
)
from ibacm.fabric.sim import hub_protocol as hp
from ibacm.fabric.sim.hub_protocol import Frame, FrameType
from ibacm.fabric.sim.umad import UmadAgent
from ibacm.log import get_logger

log = get_logger("ibacm.fabric.sim")

_READ_SIZE = 1 << 16
OUTBOUND_LIMIT = 1 << 24
"""Bytes of frames a connection holds while the hub is slow to read before ``post`` says
SendQueueFull (and calls wait for room): about 57,000 MADs, a memory bound."""


class HubError(FabricError):
    """The hub refused a request (bad arguments, unknown node or operation...)."""


_ERRORS: dict[str, type[FabricError]] = {
    cls.__name__: cls
    for cls in (FabricError, NoDevicesError, PortDownError, SaSendError, SaTimeout, HubError)
}


class HubConnectionLost(FabricError):
    """The connection to the hub is gone."""


@dataclass(eq=False)
class _Call:
    done: bool = False
    result: Any = None
    error: dict[str, str] | None = None


class _Link:
    """A hub connection read and written by its callers (see the module docstring)."""

    def __init__(self, stream: trio.SocketStream, on_frame: Callable[[Frame], bool]) -> None:
        self.stream = stream
        self._fd = stream.socket.fileno()
        self._decoder = hp.FrameDecoder()
        self._on_frame = on_frame
        self.on_round: Callable[[], None] = lambda: None
        """Called after the frames of one read are dispatched (served QPs take their MADs)."""
        self._pumping = False
        self._round = trio.Event()
        self._news = False
        """A read brought something a waiter may wait for (not only served QPs' MADs)."""
        self._reading: trio.CancelScope | None = None
        """The pump's wait for readable, cancelled when a write leaves bytes to flush."""
        self._drained = False
        """The last read emptied the socket (see ``_read``)."""
        self._out = bytearray()
        """Frames (the tail of one maybe) the socket could not take yet, in call order."""
        self.outbound_limit = OUTBOUND_LIMIT
        self.lost: str | None = None
        self.on_lost: Callable[[], None] = lambda: None
        self._calls: dict[int, _Call] = {}
        self._next_id = 1
        self.pending_stats: dict[str, int] = {}

    @property
    def outbound(self) -> int:
        """Bytes written by callers that still wait for room in the socket."""
        return len(self._out)

    def kick(self) -> None:
        """Wake every waiter so it re-checks its condition."""
        old, self._round = self._round, trio.Event()
        old.set()

    async def until(self, ready: Callable[[], bool]) -> None:
        pumped = False
        try:
            while not ready():
                if self.lost is not None or self._pumping:
                    await self._round.wait()
                    continue
                pumped = True
                # One cancel scope for as long as this task reads, not one per wait (a job
                # start's burst wakes the reader once per MAD): a write that must flush
                # cancels it (``_reading``), and the reading goes on in a new one.
                with trio.CancelScope() as scope:
                    while not ready() and self.lost is None:
                        if not await self._pump(scope) and not ready():
                            # It read without a scheduler pass (the MADs went to their
                            # handlers at once); a flood must still let others run.
                            await trio.lowlevel.checkpoint()
        finally:
            if pumped:
                self.kick()  # a waiter takes the reading over

    async def until_set(self, event: trio.Event) -> None:
        await self.until(event.is_set)

    async def _pump(self, scope: trio.CancelScope) -> bool:
        """One round: flush waiting writes, or read and hand out what the hub sent; true when
        it went through the scheduler. ``scope`` is cancelled by a write that leaves bytes
        behind while this waits for data."""
        self._pumping = True
        try:
            if self._out:
                # The hub reads in a task of its own, whatever it writes: waiting only for
                # room here cannot deadlock, and frames it sent wait for the next round.
                await trio.lowlevel.wait_writable(self._fd)
                self._flush()
                return True
            if not self._drained:
                data = self._read()
                if data is not None:
                    self._take(data)
                    return False
            self._reading = scope
            await trio.lowlevel.wait_readable(self._fd)
            self._reading = None
            # Read and handled in the round that woke up: a MAD in and the MAD a handler
            # posts for it need no scheduler pass between them (issue 28).
            data = self._read()
            if data is not None:
                self._take(data)
            return True
        except (trio.ClosedResourceError, OSError) as exc:
            self._mark_lost(f"hub connection failed: {exc}")
            return True
        finally:
            self._reading = None
            self._pumping = False
            if self._news or self.lost is not None:
                # Only then: a read that brought served QPs their MADs (a job start's
                # burst) wakes nobody else for nothing.
                self._news = False
                self.kick()

    def _read(self) -> bytes | None:
        """What the socket holds (b"" at its end), None when nothing yet."""
        try:
            data = os.read(self._fd, _READ_SIZE)
        except BlockingIOError:
            self._drained = True
            return None
        # A short read emptied the socket: the next round waits for readable without
        # trying a read that would only say EAGAIN (one system call per wake-up).
        self._drained = 0 < len(data) < _READ_SIZE
        return data

    def _take(self, data: bytes) -> None:
        if not data:
            self._mark_lost("the hub closed the connection")
            return
        try:
            for item in self._decoder.feed(data):
                self._dispatch(item)
        except hp.HubProtocolError as exc:
            self._mark_lost(f"bad data from the hub: {exc}")
        self.on_round()

    def _dispatch(self, item: Frame) -> None:
        if item.type not in (FrameType.REPLY, FrameType.OK):
            if self._on_frame(item):
                self._news = True
            return
        self._news = True
        if item.type == FrameType.REPLY:
            call_id, payload = hp.decode_json_body(item.body)
            call = self._calls.get(call_id)
            if call is not None:
                call.done = True
                if isinstance(payload, dict) and "error" in payload:
                    call.error = payload["error"]
                else:
                    call.result = payload.get("ok") if isinstance(payload, dict) else None
        else:
            call = self._calls.get(hp.decode_ok(item.body))
            if call is not None:
                call.done = True

    def _mark_lost(self, reason: str) -> None:
        if self.lost is None:
            self.lost = reason
            self._out.clear()  # nobody will take them
            self.on_lost()

    def write(self, data: bytes) -> None:
        """Put frames on the stream now, after everything written before; what the socket
        cannot take waits in the outbound buffer for the next pump. Never waits, so a frame
        is never split by another one and a cancelled caller cannot leave half of it."""
        if self.lost is not None:
            raise HubConnectionLost(self.lost)
        if self.pending_stats:
            data = hp.encode_json(FrameType.STAT, self.pending_stats) + data
            self.pending_stats = {}
        if self._out:
            self._out += data
            return
        try:
            sent = os.write(self._fd, data)
        except BlockingIOError:
            sent = 0
        except OSError as exc:
            self._mark_lost(f"hub connection failed: {exc}")
            self.kick()
            raise HubConnectionLost(self.lost or str(exc)) from exc
        if sent < len(data):
            self._out += memoryview(data)[sent:]
            if self._reading is not None:
                self._reading.cancel()  # the pump waits for the hub: let it flush first

    def post(self, data: bytes) -> None:
        """``write`` for a frame nobody waits for; SendQueueFull when the outbound buffer
        already holds ``outbound_limit`` bytes."""
        if self.lost is None and len(self._out) >= self.outbound_limit:
            raise SendQueueFull(
                f"{len(self._out)} bytes wait for the hub to read (limit {self.outbound_limit})"
            )
        self.write(data)

    def _flush(self) -> None:
        out = self._out
        while out:
            try:
                sent = os.write(self._fd, out)
            except BlockingIOError:
                return
            except OSError as exc:
                self._mark_lost(f"hub connection failed: {exc}")
                return
            del out[:sent]

    def new_call(self) -> tuple[int, _Call]:
        call_id = self._next_id
        self._next_id = (self._next_id % 0xFFFFFFFF) + 1
        call = _Call()
        self._calls[call_id] = call
        return call_id, call

    async def finish(self, call_id: int, call: _Call, data: bytes) -> Any:
        """Send a request frame and wait for its reply; remote errors are raised here."""
        try:
            if len(self._out) >= self.outbound_limit:
                await self.until(
                    lambda: len(self._out) < self.outbound_limit or self.lost is not None
                )
            self.write(data)
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
    completion_errors: int = 0  # declared again: mypyc needs it in the compiled subclass

    def __init__(self, port: HubPort, handle: int, qpn: int, recv_depth: int) -> None:
        self._port = port
        self._fabric = port.device.fabric
        self._link = self._fabric.link
        self.handle = handle
        self._qpn = qpn
        self._depth = recv_depth
        self._queue: deque[ReceivedMad] = deque()
        self._closed = False
        self._handler: MadHandler | None = None
        self._limit = RECEIVE_BATCH
        self._fed = False
        """Queued MADs wait for ``hand_over`` at the end of this read (the fabric knows)."""

    @property
    def qpn(self) -> int:
        return self._qpn

    def deliver(self, received: ReceivedMad) -> bool:
        """Queue a MAD; true when a ``receive`` may wait for it (not served: ``serve``'s
        handler takes it at the end of the read, ``hand_over``)."""
        if self._closed:
            return False
        if len(self._queue) >= self._depth:
            stats = self._link.pending_stats
            stats["rnr_drop"] = stats.get("rnr_drop", 0) + 1
            return False
        self._queue.append(received)
        if self._handler is None:
            return True
        if not self._fed:
            self._fed = True
            self._fabric.fed.append(self)
        return False

    def hand_over(self) -> None:
        """Give the queued MADs to the serving handler, ``limit`` per call."""
        self._fed = False
        queue = self._queue
        while queue and self._handler is not None:
            count = min(self._limit, len(queue))
            deliver_batch(self._handler, [queue.popleft() for _ in range(count)])

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
        except HubConnectionLost as lost:
            raise PortDownError(f"simulated port lost with the hub: {lost}") from lost

    def post(self, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        if self._closed:
            raise FabricError(f"post on closed QP {self._qpn:#x}")
        try:
            data = hp.encode_ud_post(self.handle, remote_qpn, av, mad)
        except hp.HubProtocolError as exc:
            raise FabricError(str(exc)) from exc
        try:
            self._link.post(data)
        except HubConnectionLost as lost:
            raise PortDownError(f"simulated port lost with the hub: {lost}") from lost

    def post_failed(self, message: str) -> None:
        """The hub could not send a posted MAD (its POST_ERROR): a completion error."""
        self.completion_errors += 1
        log.debug("posted send failed", qpn=self._qpn, error=message)

    async def serve(self, handler: MadHandler, limit: int = RECEIVE_BATCH) -> None:
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        if self._handler is not None:
            raise trio.BusyResourceError(f"QP {self._qpn:#x} is already served")
        self._handler, self._limit = handler, limit
        try:
            self.hand_over()  # what arrived before
            await self._link.until(lambda: self._closed)
        finally:
            self._handler = None

    async def receive(self) -> ReceivedMad:
        return (await self.receive_many(1))[0]

    async def receive_many(self, limit: int) -> list[ReceivedMad]:
        await self._link.until(lambda: bool(self._queue) or self._closed)
        if self._closed:
            raise trio.ClosedResourceError("the QP was destroyed")
        queue = self._queue
        return [queue.popleft() for _ in range(min(limit, len(queue)))]

    async def attach_mcast(self, mgid: bytes, mlid: int) -> None:
        await self._link.call(
            {"op": "attach", "handle": self.handle, "mgid": bytes(mgid).hex(), "mlid": mlid}
        )

    async def detach_mcast(self, mgid: bytes, mlid: int) -> None:
        await self._link.call(
            {"op": "detach", "handle": self.handle, "mgid": bytes(mgid).hex(), "mlid": mlid}
        )

    async def rebind(self, port_num: int, pkey_index: int, qkey: int) -> None:
        """Move the QP to another port of its device, P_Key index and Q_Key (verbs INIT)."""
        await self._link.call(
            {
                "op": "rebind_qp",
                "handle": self.handle,
                "device": self._port.device.index,
                "port": port_num,
                "pkey_index": pkey_index,
                "qkey": qkey,
            }
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
        self.sa_post_errors = 0
        """SA MADs the hub could not send that no outstanding request owned (a ReportResp)."""

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
        self.last = hp.attrs_from_json(raw)
        return self.last

    def sa_start(self, mad: bytes, dest: SaDestination, *, timeout_ms: int, retries: int) -> SaCall:
        self.device.fabric.check_open()

        def transmit(wire: bytes) -> None:
            self._transmit(wire, dest)

        return self.agent.start(mad, transmit, timeout_ms=timeout_ms, retries=retries)

    async def sa_report(self) -> bytes:
        self.device.fabric.check_open()
        return await self.agent.next_report()

    async def sa_post(self, mad: bytes, dest: SaDestination) -> None:
        self.device.fabric.check_open()
        await trio.lowlevel.checkpoint()
        self._transmit(mad, dest)

    def _transmit(self, wire: bytes, dest: SaDestination) -> None:
        """Hand one SA MAD to the hub (an SA_POST), to go to ``dest`` as it is. Never waits:
        SA MADs are few (the daemon's sa_depth bounds them), so one goes behind whatever the
        outbound buffer holds rather than failing with SendQueueFull."""
        try:
            data = hp.encode_sa_post(
                self.device.index, self._num, dest.sm_lid, dest.sm_sl, dest.pkey_index, wire
            )
            self.device.fabric.link.write(data)
        except hp.HubProtocolError as exc:
            raise SaSendError(str(exc)) from exc
        except HubConnectionLost as lost:
            raise SaSendError(f"hub connection lost: {lost}") from lost

    def sa_post_failed(self, tid: int, message: str) -> bool:
        """The hub could not send an SA MAD we posted (its SA_POST_ERROR): the request it
        belongs to ends with SaSendError (true), or, none waiting, it is counted."""
        if self.agent.fail(tid, SaSendError(f"the hub could not send the SA MAD: {message}")):
            return True
        self.sa_post_errors += 1
        log.debug("posted SA MAD failed", port=self._num, tid=f"{tid:#x}", error=message)
        return False

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
        except HubConnectionLost as lost:
            raise PortDownError(f"simulated port lost with the hub: {lost}") from lost
        qp = HubUdQp(self, int(reply["handle"]), int(reply["qpn"]), recv_depth)
        fabric.qps[qp.handle] = qp
        return qp


class HubDevice(PortTableDevice["HubPort"]):
    def __init__(self, fabric: HubFabric, index: int, raw: dict[str, Any]) -> None:
        super().__init__(str(raw["name"]), int(raw["node_guid"]))
        self.fabric = fabric
        self.index = index
        self.ports = {
            int(p["num"]): HubPort(self, int(p["num"]), int(p["agent"])) for p in raw["ports"]
        }
        self.events: deque[PortEvent] = deque()

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
        self.fed: list[HubUdQp] = []
        """Served QPs that queued MADs in the read being dispatched."""
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
        link.on_round = self._on_round
        self._link = link
        try:
            reply = await link.call(
                {"op": "hello", "version": hp.PROTOCOL_VERSION, "node": self.node_name}
            )
        except FabricError as refused:
            await trio.aclose_forcefully(stream)
            self._link = None
            raise NoDevicesError(
                f"simulator hub refused node {self.node_name!r}: {refused}"
            ) from refused
        self.devices = [HubDevice(self, i, raw) for i, raw in enumerate(reply["devices"])]
        if not self.devices:
            raise NoDevicesError(f"node {self.node_name} has no InfiniBand device")
        return list(self.devices)

    def _on_frame(self, item: Frame) -> bool:
        """Hand a frame to its QP, agent or queue; true when a waiter may wait for it."""
        if item.type == FrameType.UD_RECV:
            handle, received = hp.decode_ud_recv(item.body)
            qp = self.qps.get(handle)
            return qp is not None and qp.deliver(received)
        if item.type == FrameType.POST_ERROR:
            handle, message = hp.decode_post_error(item.body)
            failed = self.qps.get(handle)
            if failed is not None:
                failed.post_failed(message)
            return False
        if item.type == FrameType.SA_POST_ERROR:
            index, num, tid, message = hp.decode_sa_post_error(item.body)
            port = self._port(index, num)
            # An ended request is news for the task in its ``wait``, a counted failure not.
            return port is not None and port.sa_post_failed(tid, message)
        if item.type == FrameType.SA_RECV:
            index, num, mad = hp.decode_sa_recv(item.body)
            port = self._port(index, num)
            if port is not None:
                # Ends the request in this round: its ``when_ended`` waiters run here.
                port.agent.deliver(mad)
        elif item.type == FrameType.EVENT:
            index, num, kind = hp.decode_event(item.body)
            if 0 <= index < len(self.devices):
                self.devices[index].events.append(PortEvent(num, kind))
        elif item.type == FrameType.IP_EVENT:
            raw = hp.decode_json(item.body)
            self.ip_events.append(IpEvent(bool(raw["added"]), hp.address_from_json(raw)))
        return True

    def _port(self, index: int, num: int) -> HubPort | None:
        if 0 <= index < len(self.devices):
            return self.devices[index].ports.get(num)
        return None

    def _on_round(self) -> None:
        fed, self.fed = self.fed, []
        for qp in fed:
            qp.hand_over()

    def _on_lost(self) -> None:
        reason = self._link.lost if self._link is not None else None
        for device in self.devices:
            for num in sorted(device.ports):
                device.events.append(PortEvent(num, PortEventType.PORT_ERR))
                # No answer can come: the requests end now, not at their time-outs.
                device.ports[num].agent.fail_all(SaSendError(f"hub connection lost: {reason}"))

    async def interface_addresses(self) -> Sequence[InterfaceAddress]:
        self.check_open()
        raw = await self.link.call({"op": "addresses"})
        return [hp.address_from_json(entry) for entry in raw]

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
            # As a lost connection: the SA calls on their way end now (``_on_lost``).
            self._link._mark_lost("closed")
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
        link = _Link(stream, lambda item: False)
        await link.call({"op": "hello", "version": hp.PROTOCOL_VERSION})
        return await link.call(request)

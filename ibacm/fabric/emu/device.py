"""The emulated HCA of one simulated node: what ``libibacm_emu.so`` talks to.

``python -m ibacm.fabric.emu.device --hub HUB --node NODE --socket PATH`` joins the simulated
fabric as NODE (``HubFabric``: the same hub, SA, multicast, faults and capture as every Python
node) and serves the verbs and umad calls that unmodified programs make through the preload
library, over SOCK_SEQPACKET connections at PATH (``protocol.py``):

* contexts, port/GID/P_Key queries, async port events (from the fabric's faults);
* completion channels and CQs: completions are written to the CQ's own connection, an armed
  CQ's id to its channel's connection (a real fd for poll/epoll);
* UD QPs: QPN at creation, port/P_Key/Q_Key at INIT (the hub QP is rebound), receives only
  into buffers the program posted (otherwise dropped, as an HCA drops on a UD QP), sends
  through the hub with a completion when signalled, multicast attach/detach;
* umad ports: SA requests with the kernel's semantics (TID rewrite, timeout and retries,
  RMPP reassembly, an ETIMEDOUT record with the request when no answer came); the SA's
  Reports to the port, and the program's ReportResps back.

It prints ``READY`` on stdout (and sends sd_notify ``READY=1``) once it serves.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import signal
import socket
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import trio

from ibacm.fabric.api import (
    ACM_QKEY,
    MAD_SIZE,
    FabricError,
    PortAttributes,
    SaDestination,
    SaTimeout,
)
from ibacm.fabric.emu import protocol as ep
from ibacm.fabric.emu.protocol import Op
from ibacm.fabric.hw.verbs_attrs import EVENT_CODES
from ibacm.fabric.sim.hub_client import HubDevice, HubFabric, HubPort, HubUdQp
from ibacm.log import get_logger
from ibacm.sd_notify import Notifier
from ibacm.wire.mad import Method, MgmtClass

log = get_logger("ibacm.emu")

_RECV_MAX = 1 << 16
_U32 = 0xFFFFFFFF
_HUB_QUEUE = 1 << 16
"""What the hub side of a QP may hold; the program's posted buffers are the real limit."""


class _Outbox:
    """Records for one connection, written in order by one task so no sender ever blocks."""

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self._queue: deque[tuple[bytes | None, Callable[[], None] | None]] = deque()
        self._wake = trio.Event()
        self._writing = False
        self.closed = False

    @property
    def busy(self) -> bool:
        """Records are queued or being written: the program cannot see them yet."""
        return self._writing or bool(self._queue)

    def after_pending(self, then: Callable[[], None]) -> None:
        """Run ``then`` once every record queued so far is in the program's socket buffer."""
        if not self.closed:
            self._queue.append((None, then))
            self._wake.set()

    def put(self, record: bytes, *, then: Callable[[], None] | None = None) -> None:
        """Queue ``record``; ``then`` runs once it is in the program's socket buffer."""
        if not self.closed:
            self._queue.append((record, then))
            self._wake.set()

    async def run(self) -> None:
        try:
            while not self.closed:
                while self._queue:
                    record, then = self._queue.popleft()
                    if record is not None:
                        self._writing = True
                        await self.sock.send(record)
                        self._writing = False
                    if then is not None:
                        then()
                self._wake = trio.Event()
                await self._wake.wait()
        except OSError:
            self.closed = True  # the program closed its end

    def close(self) -> None:
        self.closed = True
        self._wake.set()


@dataclass(eq=False)
class _Cq:
    id: int
    channel: int
    out: _Outbox | None = None
    armed: bool = False
    written: int = 0
    """Completions given to the program's CQ connection (mod 2^32): its producer index."""


@dataclass(eq=False)
class _Qp:
    id: int
    device: HubDevice
    hub: HubUdQp
    send_cq: int
    recv_cq: int
    sig_all: bool
    state: int = ep.QPS_RESET
    credits: int = 0
    sends: deque[tuple[bool, ep.PostSend, int]] = field(default_factory=deque)
    send_wake: trio.Event = field(default_factory=trio.Event)
    cancel: trio.CancelScope = field(default_factory=trio.CancelScope)


@dataclass(eq=False)
class _UmadPort:
    id: int
    port: HubPort
    out: _Outbox
    agents: dict[int, int] = field(default_factory=dict)
    """agent id -> management class."""


class EmulatedDevice:
    """The node's verbs/umad objects; one per device process (see the module docstring)."""

    def __init__(self, fabric: HubFabric, nursery: trio.Nursery) -> None:
        self.fabric = fabric
        self.nursery = nursery
        self.devices: list[HubDevice] = []
        self._ids = 1
        self.async_streams: dict[int, list[_Outbox]] = {}  # device index -> streams
        self.contexts: dict[int, int] = {}  # context id -> device index
        self.channels: dict[int, _Outbox | None] = {}
        self.cqs: dict[int, _Cq] = {}
        self.qps: dict[int, _Qp] = {}
        self.umads: dict[int, _UmadPort] = {}
        self.stats = {
            "rnr_drop": 0,
            "not_ready_drop": 0,
            "sends": 0,
            "recvs": 0,
            "sa": 0,
            "report_no_agent": 0,
        }

    def new_id(self) -> int:
        self._ids += 1
        return self._ids

    async def open(self) -> None:
        self.devices = [d for d in await self.fabric.open() if isinstance(d, HubDevice)]
        for device in self.devices:
            self.async_streams[device.index] = []
            self.nursery.start_soon(self._events, device)

    async def _events(self, device: HubDevice) -> None:
        while True:
            try:
                event = await device.wait_event()
            except trio.ClosedResourceError:
                return
            device.ports[event.port_num].last = None
            code = EVENT_CODES.get(event.type)
            if code is None:
                continue
            for stream in self.async_streams[device.index]:
                stream.put(ep.ASYNC_EVENT.pack(code, event.port_num))

    # -- connections -----------------------------------------------------------------------
    async def serve(self, listener: trio.socket.SocketType) -> None:
        while True:
            conn, _ = await listener.accept()
            self.nursery.start_soon(self._connection, conn)

    async def _connection(self, conn: trio.socket.SocketType) -> None:
        with conn:
            while True:
                try:
                    message = await conn.recv(_RECV_MAX)
                except OSError:
                    return
                if not message:
                    return
                try:
                    request = ep.decode_request(message)
                except ep.EmuProtocolError as exc:
                    log.warning("bad message from a program", error=str(exc))
                    return
                if request.op in ep.STREAM_OPS:
                    await self._stream(conn, request)
                    return
                reply = await self._request(request)
                if request.op not in ep.NO_REPLY:
                    try:
                        await conn.send(reply)
                    except OSError:
                        return

    async def _request(self, req: ep.Request) -> bytes:
        try:
            return await self._handle(req)
        except (KeyError, IndexError, ValueError, ep.EmuProtocolError) as exc:
            log.info("request refused", op=req.op, error=str(exc))
            return ep.encode_reply(-errno.EINVAL)
        except FabricError as exc:
            log.info("request failed on the fabric", op=req.op, error=str(exc))
            return ep.encode_reply(-errno.EIO)

    async def _handle(self, req: ep.Request) -> bytes:
        op = Op(req.op)
        if op is Op.LIST:
            infos = b"".join(
                ep.encode_device_info(d.name, d.node_guid, len(d.ports)) for d in self.devices
            )
            return ep.encode_reply(0, len(self.devices), payload=infos)
        if op is Op.OPEN:
            context = self.new_id()
            self.contexts[context] = self.devices[req.dev].index
            return ep.encode_reply(0, context)
        if op in (Op.QUERY_PORT, Op.QUERY_GID, Op.QUERY_PKEY):
            return await self._query(op, req)
        if op is Op.CREATE_CQ:
            cq = _Cq(self.new_id(), req.a)
            if cq.channel and cq.channel not in self.channels:
                raise KeyError(f"no completion channel {cq.channel}")
            self.cqs[cq.id] = cq
            return ep.encode_reply(0, cq.id)
        if op is Op.ARM_CQ:
            self._arm(self.cqs[req.a], polled=req.b)
            return b""
        if op is Op.DESTROY_CQ:
            cq = self.cqs.pop(req.a)
            if cq.out is not None:
                cq.out.close()
            return ep.encode_reply()
        if op is Op.CREATE_QP:
            return await self._create_qp(req)
        if op is Op.MODIFY_QP:
            return await self._modify_qp(self.qps[req.a], req)
        if op is Op.DESTROY_QP:
            qp = self.qps.pop(req.a)
            qp.cancel.cancel()
            await qp.hub.aclose()
            return ep.encode_reply()
        if op is Op.POST_SEND:
            self._post_send(self.qps[req.a], req)
            return b""
        if op is Op.POST_RECV:
            self.qps[req.a].credits += req.b
            return b""
        if op in (Op.ATTACH, Op.DETACH):
            qp = self.qps[req.a]
            if len(req.payload) != 16:
                raise ep.EmuProtocolError("an MGID is 16 bytes")
            if op is Op.ATTACH:
                await qp.hub.attach_mcast(req.payload, req.b)
            else:
                await qp.hub.detach_mcast(req.payload, req.b)
            return ep.encode_reply()
        if op is Op.UMAD_REGISTER:
            umad = self.umads[req.a]
            agent = self.new_id()
            umad.agents[agent] = req.b
            return ep.encode_reply(0, agent)
        if op is Op.UMAD_UNREGISTER:
            self.umads[req.a].agents.pop(req.b)
            return ep.encode_reply()
        raise ep.EmuProtocolError(f"op {op.name} cannot be used here")

    async def _port_attrs(self, req: ep.Request, *, fresh: bool) -> PortAttributes:
        port = self.devices[req.dev].ports[req.a]
        if fresh or port.last is None:
            return await port.query()
        return port.last

    async def _query(self, op: Op, req: ep.Request) -> bytes:
        attrs = await self._port_attrs(req, fresh=op is Op.QUERY_PORT)
        if op is Op.QUERY_PORT:
            return ep.encode_reply(payload=ep.encode_port_attr(attrs))
        table: Sequence[bytes] | Sequence[int] = attrs.gids if op is Op.QUERY_GID else attrs.pkeys
        if req.b >= len(table):
            return ep.encode_reply(-errno.EINVAL)
        if op is Op.QUERY_GID:
            return ep.encode_reply(payload=attrs.gids[req.b])
        return ep.encode_reply(0, attrs.pkeys[req.b])

    # -- streams -----------------------------------------------------------------------------
    async def _stream(self, conn: trio.socket.SocketType, req: ep.Request) -> None:
        out = _Outbox(conn)
        op = Op(req.op)
        try:
            stream_id = self._open_stream(op, req, out)
        except (KeyError, IndexError):
            await conn.send(ep.encode_reply(-errno.EINVAL))
            return
        try:
            await conn.send(ep.encode_reply(0, stream_id))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(out.run)
                if op is Op.UMAD_OPEN:
                    nursery.start_soon(self._umad_reports, self.umads[stream_id])
                    await self._umad_reader(conn, self.umads[stream_id], nursery)
                else:
                    await _until_closed(conn)
                out.close()
        except OSError:
            pass
        finally:
            out.close()
            self._close_stream(op, req, out, stream_id)

    def _open_stream(self, op: Op, req: ep.Request, out: _Outbox) -> int:
        """Registers a stream connection where the device writes its records; its id."""
        if op is Op.ASYNC:
            self.async_streams[self.contexts[req.a]].append(out)
            return 0
        if op is Op.CHANNEL:
            self.contexts[req.a]
            channel = self.new_id()
            self.channels[channel] = out
            return channel
        if op is Op.CQ_DATA:
            self.cqs[req.a].out = out
            return 0
        umad = _UmadPort(self.new_id(), self.devices[req.dev].ports[req.a], out)
        self.umads[umad.id] = umad
        return umad.id

    def _close_stream(self, op: Op, req: ep.Request, out: _Outbox, stream_id: int) -> None:
        """The program closed a stream (or exited): what it registered goes with it."""
        if op is Op.ASYNC:
            streams = self.async_streams.get(self.contexts.get(req.a, -1), [])
            if out in streams:
                streams.remove(out)
        elif op is Op.CHANNEL:
            self.channels.pop(stream_id, None)
        elif op is Op.UMAD_OPEN:
            self.umads.pop(stream_id, None)

    # -- QPs ---------------------------------------------------------------------------------
    async def _create_qp(self, req: ep.Request) -> bytes:
        if req.c != ep.IBV_QPT_UD:
            return ep.encode_reply(-errno.EOPNOTSUPP)
        send_cq, recv_cq = self.cqs[req.a], self.cqs[req.b]
        device = self.devices[req.dev]
        first = min(device.ports)
        hub = await device.ports[first].open_ud(0, recv_depth=_HUB_QUEUE)
        assert isinstance(hub, HubUdQp)
        qp = _Qp(self.new_id(), device, hub, send_cq.id, recv_cq.id, bool(req.d))
        self.qps[qp.id] = qp
        self.nursery.start_soon(self._qp_tasks, qp)
        return ep.encode_reply(0, qp.id, hub.qpn)

    async def _modify_qp(self, qp: _Qp, req: ep.Request) -> bytes:
        if len(req.payload) < ep.QP_MOD.size:
            raise ep.EmuProtocolError("MODIFY_QP without its attributes")
        port_num, pkey_index, qkey, _ = ep.QP_MOD.unpack_from(req.payload)
        mask, state = req.b, req.c
        if mask & ep.IBV_QP_STATE and state == ep.QPS_INIT and qp.state == ep.QPS_RESET:
            if not mask & ep.IBV_QP_PORT or port_num not in qp.device.ports:
                return ep.encode_reply(-errno.EINVAL)
            await qp.hub.rebind(port_num, pkey_index, qkey)
        elif (
            mask & (ep.IBV_QP_PKEY_INDEX | ep.IBV_QP_PORT | ep.IBV_QP_QKEY)
            and qp.state != ep.QPS_RESET
        ):
            return ep.encode_reply(-errno.EOPNOTSUPP)  # moving a live UD QP is not emulated
        if mask & ep.IBV_QP_STATE:
            qp.state = state
            if state == ep.QPS_RESET:
                qp.credits = 0
        return ep.encode_reply()

    def _post_send(self, qp: _Qp, req: ep.Request) -> None:
        post = ep.decode_post_send(req.payload)
        qp.sends.append((bool(req.b), post, req.c))
        qp.send_wake.set()

    async def _qp_tasks(self, qp: _Qp) -> None:
        with qp.cancel:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._qp_sender, qp)
                await self._qp_receiver(qp)

    async def _qp_sender(self, qp: _Qp) -> None:
        while True:
            while qp.sends:
                signaled, post, remote_qpn = qp.sends.popleft()
                status = await self._transmit(qp, post, remote_qpn)
                if signaled or qp.sig_all:
                    self._complete(qp.send_cq, ep.encode_send_completion(qp.id, post.wr_id, status))
            qp.send_wake = trio.Event()
            await qp.send_wake.wait()

    async def _transmit(self, qp: _Qp, post: ep.PostSend, remote_qpn: int) -> int:
        if len(post.data) != MAD_SIZE:
            return ep.WC_LOC_LEN_ERR  # the simulated fabric carries MAD-sized UD messages
        try:
            await qp.hub.send(post.data, post.av, remote_qpn)
        except FabricError as exc:
            log.info("UD send failed", qpn=qp.hub.qpn, error=str(exc))
            return ep.WC_GENERAL_ERR
        self.stats["sends"] += 1
        return ep.WC_SUCCESS

    async def _qp_receiver(self, qp: _Qp) -> None:
        while True:
            try:
                received = await qp.hub.receive()
            except trio.ClosedResourceError:
                return
            if qp.state not in (ep.QPS_RTR, ep.QPS_RTS):
                self.stats["not_ready_drop"] += 1
                continue
            if qp.credits <= 0:
                self.stats["rnr_drop"] += 1  # no posted buffer: a UD QP drops it
                continue
            qp.credits -= 1
            self.stats["recvs"] += 1
            header = None
            if any(received.sgid):
                header = ep.grh(0, 0, 0, received.sgid, received.dgid, len(received.mad))
            self._complete(
                qp.recv_cq,
                ep.encode_recv_completion(
                    qp.id,
                    src_qp=received.src_qp,
                    slid=received.slid,
                    path_bits=received.dlid_path_bits,
                    pkey_index=received.pkey_index,
                    grh_bytes=header,
                    payload=received.mad,
                ),
            )

    def _arm(self, cq: _Cq, *, polled: int) -> None:
        """ibv_req_notify_cq, posted with the count of completions the program has polled
        (an HCA's arm doorbell carries its consumer index; nobody waits for an answer).
        Completions written that it has not polled yet raise the event at once, after they
        are in its socket; otherwise the next completion raises it. A completion polled
        after the arm was posted makes that event spurious, never lost."""
        channel = self.channels.get(cq.channel)
        if cq.out is not None and channel is not None and cq.written != polled & _U32:
            cq.armed = False
            cq.out.after_pending(lambda: channel.put(ep.CQ_EVENT.pack(cq.id)))
        else:
            cq.armed = True

    def _complete(self, cq_id: int, record: bytes) -> None:
        cq = self.cqs.get(cq_id)
        if cq is None or cq.out is None:
            return
        cq.written = (cq.written + 1) & _U32
        if not cq.armed:
            cq.out.put(record)
            return
        cq.armed = False
        channel = self.channels.get(cq.channel)
        if channel is None:
            cq.out.put(record)
            return
        # As on an HCA, the completion is in the CQ before the event says so: a program that
        # polls on the event must find it.
        event = ep.CQ_EVENT.pack(cq.id)
        cq.out.put(record, then=lambda: channel.put(event))

    # -- umad --------------------------------------------------------------------------------
    async def _umad_reader(
        self, conn: trio.socket.SocketType, umad: _UmadPort, nursery: trio.Nursery
    ) -> None:
        while True:
            try:
                message = await conn.recv(_RECV_MAX)
            except OSError:
                return  # the program died
            if not message:
                return
            try:
                header, mad = ep.decode_umad(message)
            except ep.EmuProtocolError as exc:
                log.warning("bad umad write", error=str(exc))
                continue
            if header.agent_id not in umad.agents:
                log.info("umad send on an unregistered agent", agent=header.agent_id)
                continue
            nursery.start_soon(self._sa_request, umad, header, mad)

    async def _sa_request(self, umad: _UmadPort, header: ep.UmadHeader, mad: bytes) -> None:
        dest = SaDestination(header.lid, header.sl, header.pkey_index)
        if len(mad) == MAD_SIZE and mad[3] == Method.REPORT_RESP:
            # The ack of a Report: sent as it is, nothing comes back.
            with contextlib.suppress(FabricError):
                await umad.port.sa_post(mad, dest)
            return
        if header.timeout_ms == 0 or len(mad) != MAD_SIZE or mad[3] & 0x80:
            log.info("umad send without an answer to wait for is not carried", length=len(mad))
            return
        self.stats["sa"] += 1
        status, answer = 0, mad
        try:
            answer = await umad.port.sa_send(
                mad, dest, timeout_ms=header.timeout_ms, retries=header.retries
            )
        except SaTimeout:
            status = errno.ETIMEDOUT
        except FabricError as exc:
            log.warning("SA request not sent", error=str(exc))
            status = errno.EIO
        reply = ep.UmadHeader(
            header.agent_id, status, 0, 0, 0, 1, header.qkey, header.lid, header.sl, 0, 0, 0,
            0, 0, bytes(16), 0, header.pkey_index,
        )  # fmt: skip
        umad.out.put(ep.encode_umad(reply, answer))

    async def _umad_reports(self, umad: _UmadPort) -> None:
        """The SA's Reports to this port, handed to the program's class 0x03 agent as the
        kernel hands them to the agent registered for the Report method (the preload library
        does not pass method masks on: the SA sends Reports only to ports that subscribed)."""
        while True:
            try:
                report = await umad.port.sa_report()
            except FabricError:
                return
            agent = next((a for a, cls in umad.agents.items() if cls == MgmtClass.SUBN_ADM), None)
            if agent is None:
                self.stats["report_no_agent"] += 1
                continue
            attrs = umad.port.last
            header = ep.UmadHeader(
                agent, 0, 0, 0, 0, 1, ACM_QKEY, attrs.sm_lid if attrs else 0, 0, 0, 0, 0,
                0, 0, bytes(16), 0, 0,
            )  # fmt: skip
            umad.out.put(ep.encode_umad(header, report))


async def _until_closed(conn: trio.socket.SocketType) -> None:
    """Streams carry nothing from the program; its closing them (or dying) is the destroy."""
    with contextlib.suppress(OSError):
        while await conn.recv(_RECV_MAX):
            pass


async def run_device(
    hub: Path,
    node: str,
    path: Path,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    fabric = HubFabric(hub, node)
    listener = trio.socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with listener:
        path.unlink(missing_ok=True)
        await listener.bind(os.fspath(path))
        listener.listen(128)
        try:
            async with trio.open_nursery() as nursery:
                device = EmulatedDevice(fabric, nursery)
                await device.open()
                nursery.start_soon(device.serve, listener)
                task_status.started()
        finally:
            with trio.CancelScope(shield=True):
                await fabric.aclose()
            path.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ibacm-emu-device", description=__doc__.splitlines()[0])
    parser.add_argument("--hub", required=True, type=Path, help="the simulator hub's socket")
    parser.add_argument("--node", required=True, help="the simulated node this device is on")
    parser.add_argument("--socket", required=True, type=Path, help="where programs connect")
    args = parser.parse_args(argv)

    async def run() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with trio.open_nursery() as nursery:
                await nursery.start(run_device, args.hub, args.node, args.socket)
                print("READY", flush=True)
                await Notifier.from_environment().ready(f"emulated HCA of {args.node}")
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    break

    try:
        trio.run(run)
    except KeyboardInterrupt:
        return 0
    except FabricError as exc:
        print(f"ibacm-emu-device: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

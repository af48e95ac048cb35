"""See every MAD the daemon sends and receives: a tap around any ``Fabric``, and a capture file.

``TapFabric`` wraps a backend (hardware or simulated) and hands each MAD that crosses its
ports to the registered observers, with the addressing the wrapped calls know:

* SA MADs (``Port.sa_start``/``sa_send``): the request from the port LID to the SM LID, QP1
  to QP1, Q_Key 0x80010000, P_Key of the SA P_Key index; its answer the other way round (an
  RMPP answer is shown as its segments), then the exchange with its outcome. The umad
  layer's retransmissions happen below the interface, so a request appears once, and its
  upper TID bits are as the daemon gave them (the kernel's agent number is only visible in
  the answer). A started call is traced with the port attributes last queried and its
  answer in the round the backend ends it, before the caller's ``when_ended`` waiters run
  (a call its caller's cancellation abandons has no exchange, as a cancelled ``sa_send``);
  ``sa_send`` is a started call's ``wait`` where the backend can start calls;
* ACM MADs (``UdQp.send``/``post``, ``receive``/``serve``): LIDs and QPNs from the address
  vector or the work completion, P_Key of the QP, Q_Key 0x80010000 and always a GRH (ACM
  always sends one). A received GRH's traffic class, flow label and hop limit are not
  reported by the receive path and show as 0; a multicast arrival shows the MLID the QP
  attached with. A posted MAD (which cannot wait for a port query) and a served one are
  traced with the port attributes last queried; a served MAD is traced before the handler
  sees it, so it precedes the MAD posted in answer.

With no observer the tap costs one attribute test per MAD. ``CaptureControl`` is an observer
that writes the MADs to a pcap file of ERF type-21 records (``ibacm.wire.erf``) that tshark and
Wireshark decode; it starts and stops at run time (``ibacm --capture FILE``, the admin command
``capture``). Capture interface 0 ("Port A") holds sent MADs, interface 1 ("Port B") received
ones. A full queue drops MADs from the capture (counted), never slows the fabric down. A file
that cannot be written (full disk) loses the MADs of the failed write (counted, said once on
stderr per interval) and is cut back to its last whole record, so it stays readable; the
capture goes on and writes again once there is room.
"""

from __future__ import annotations

import contextlib
import enum
import io
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from ibacm.fabric.api import (
    ACM_QKEY,
    MAD_SIZE,
    MULTICAST_QPN,
    RECEIVE_BATCH,
    SA_QPN,
    AddressVector,
    Device,
    Fabric,
    FabricError,
    InterfaceAddress,
    IpEvent,
    MadHandler,
    Port,
    PortAttributes,
    PortEvent,
    ReceivedMad,
    SaCall,
    SaDestination,
    SaSendError,
    SaTimeout,
    UdQp,
)
from ibacm.log import get_logger
from ibacm.losses import Losses, reason
from ibacm.wire import erf
from ibacm.wire.errors import WireError
from ibacm.wire.mad import MadHeader, Method, MgmtClass, SaAttr, split_rmpp

log = get_logger("ibacm.capture")

DEFAULT_QUEUE = 4096
"""MADs waiting for the capture writer before further ones are dropped."""
CAPTURE_FILE_MODE = 0o600
"""Captures hold addresses and GIDs of the fabric: owner only."""
INTERFACE_SENT = 0
INTERFACE_RECEIVED = 1
_DEFAULT_PKEY = 0xFFFF


# -- what observers see ------------------------------------------------------------------------


class Direction(enum.StrEnum):
    SENT = "sent"
    RECEIVED = "received"


@dataclass(frozen=True, slots=True)
class MadKind:
    """Names of a MAD's class, method and attribute (for logs and metric labels)."""

    mgmt_class: str
    method: str
    attribute: str


_CLASS_NAMES: dict[int, str] = {MgmtClass.SUBN_ADM: "sa", MgmtClass.ACM: "acm"}
_ATTR_NAMES: dict[int, str] = {attr: attr.name.lower() for attr in SaAttr}


def describe_mad(mad: bytes) -> MadKind:
    """Class/method/attribute names of ``mad``; unknown values are given in hex."""
    if len(mad) < 24:
        return MadKind("short", "short", "short")
    header = MadHeader.decode(mad)
    mgmt_class = _CLASS_NAMES.get(header.mgmt_class, f"0x{header.mgmt_class:02x}")
    try:
        method = Method(header.method).name.lower()
    except ValueError:
        method = f"0x{header.method:02x}"
    if header.mgmt_class == MgmtClass.ACM:
        attribute = "resolve"  # ACM MADs have no attribute ID: bytes 16.. are the record
    else:
        attribute = _ATTR_NAMES.get(header.attr_id, f"0x{header.attr_id:04x}")
    return MadKind(mgmt_class, method, attribute)


@dataclass(frozen=True, slots=True)
class MadTrace:
    """One MAD that crossed a port, with the packet addressing around it."""

    time: float
    """trio clock at the send completion or the receive."""
    direction: Direction
    port: str
    """``<device>/<port>``."""
    mad: bytes
    slid: int
    dlid: int
    src_qp: int
    dest_qp: int
    pkey: int
    qkey: int = ACM_QKEY
    sl: int = 0
    sgid: bytes | None = None
    """GRH source GID; None when the packet has no GRH."""
    dgid: bytes | None = None
    tclass: int = 0
    flow_label: int = 0
    hop_limit: int = 0

    @property
    def kind(self) -> MadKind:
        return describe_mad(self.mad)

    def packet(self) -> bytes:
        """The IB packet as it crossed the link: LRH [+GRH] + BTH + DETH + MAD + ICRC + VCRC."""
        grh = None
        if self.sgid is not None:
            grh = erf.GlobalRouteHeader(
                sgid=self.sgid,
                dgid=self.dgid if self.dgid is not None else bytes(16),
                tclass=self.tclass,
                flow_label=self.flow_label,
                hop_limit=self.hop_limit,
            )
        return erf.ud_packet(
            self.mad,
            slid=self.slid,
            dlid=self.dlid,
            dest_qp=self.dest_qp,
            src_qp=self.src_qp,
            qkey=self.qkey,
            pkey=self.pkey,
            sl=self.sl,
            grh=grh,
        )


class SaOutcome(enum.StrEnum):
    OK = "ok"
    TIMEOUT = "timeout"
    SEND_ERROR = "send_error"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class SaExchange:
    """One SA request (``sa_start``/``sa_send``) from its send to its answer (or failure),
    retransmissions included."""

    port: str
    request: bytes
    outcome: SaOutcome
    latency: float
    """Seconds from the send to the end (trio clock)."""
    status: int | None = None
    """MAD status word of the answer; None without an answer."""

    @property
    def kind(self) -> MadKind:
        return describe_mad(self.request)


class MadObserver(Protocol):
    """What a tap reports to. Called synchronously on the MAD path: be quick, never block."""

    def on_mad(self, trace: MadTrace) -> None: ...

    def on_sa_exchange(self, exchange: SaExchange) -> None: ...


# -- the tap ----------------------------------------------------------------------------------


class TapFabric(Fabric):
    """A ``Fabric`` that reports every MAD of the wrapped one to its observers."""

    def __init__(self, inner: Fabric, observers: Iterable[MadObserver] = ()) -> None:
        self.inner = inner
        self.offers_verbs = inner.offers_verbs
        # Replaced, never mutated: a MAD being reported keeps the tuple it started with.
        self.observers: tuple[MadObserver, ...] = tuple(observers)
        self.observer_errors = 0
        """Exceptions raised by observers (each is caught; the first per observer logged)."""
        self._failed_observers: set[int] = set()
        self._devices: dict[Device, TapDevice] = {}

    def add_observer(self, observer: MadObserver) -> None:
        if observer not in self.observers:
            self.observers = (*self.observers, observer)

    def remove_observer(self, observer: MadObserver) -> None:
        self.observers = tuple(o for o in self.observers if o is not observer)

    def emit(self, trace: MadTrace) -> None:
        for observer in self.observers:
            try:
                observer.on_mad(trace)
            except Exception:  # an observer bug must not break the MAD path
                self._observer_failed(observer)

    def emit_exchange(self, exchange: SaExchange) -> None:
        for observer in self.observers:
            try:
                observer.on_sa_exchange(exchange)
            except Exception:
                self._observer_failed(observer)

    def _observer_failed(self, observer: MadObserver) -> None:
        # One traceback per observer; after that only a count, or every MAD would log one.
        self.observer_errors += 1
        if id(observer) not in self._failed_observers:
            self._failed_observers.add(id(observer))
            log.exception("MAD observer failed", observer=type(observer).__name__)

    async def open(self) -> Sequence[Device]:
        devices = await self.inner.open()
        wrapped: list[Device] = []
        for device in devices:
            tapped = self._devices.get(device)
            if tapped is None:
                tapped = self._devices[device] = TapDevice(self, device)
            wrapped.append(tapped)
        return wrapped

    async def interface_addresses(self) -> Sequence[InterfaceAddress]:
        return await self.inner.interface_addresses()

    async def wait_ip_event(self) -> IpEvent:
        return await self.inner.wait_ip_event()

    @property
    def hostname(self) -> str:
        return self.inner.hostname

    async def aclose(self) -> None:
        await self.inner.aclose()


class TapDevice(Device):
    def __init__(self, tap: TapFabric, inner: Device) -> None:
        self.tap = tap
        self.inner = inner
        self._ports: dict[int, TapPort] = {}

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def node_guid(self) -> int:
        return self.inner.node_guid

    @property
    def verbs_context(self) -> int | None:
        return self.inner.verbs_context

    @property
    def phys_port_cnt(self) -> int:
        return self.inner.phys_port_cnt

    def port(self, port_num: int) -> Port:
        tapped = self._ports.get(port_num)
        if tapped is None:
            tapped = self._ports[port_num] = TapPort(self, self.inner.port(port_num))
        return tapped

    async def wait_event(self) -> PortEvent:
        return await self.inner.wait_event()


def _pkey_at(attrs: PortAttributes | None, index: int) -> int:
    if attrs is not None and 0 <= index < len(attrs.pkeys):
        return attrs.pkeys[index]
    return _DEFAULT_PKEY


def _outcome(error: FabricError) -> SaOutcome:
    if isinstance(error, SaTimeout):
        return SaOutcome.TIMEOUT
    if isinstance(error, SaSendError):
        return SaOutcome.SEND_ERROR
    return SaOutcome.ERROR


def _sa_segments(answer: bytes) -> list[bytes]:
    """The 256-byte MADs an answer arrived as (RMPP answers come back reassembled)."""
    if len(answer) <= MAD_SIZE:
        return [answer.ljust(MAD_SIZE, b"\0")]
    try:
        return split_rmpp(answer)
    except WireError:
        return [answer[:MAD_SIZE]]


class TapPort(Port):
    def __init__(self, device: TapDevice, inner: Port) -> None:
        self.device = device
        self.inner = inner
        self.attrs: PortAttributes | None = None
        """The last attributes the daemon queried (LID, GIDs, P_Keys for the addressing)."""

    @property
    def tap(self) -> TapFabric:
        return self.device.tap

    @property
    def name(self) -> str:
        return f"{self.device.name}/{self.port_num}"

    @property
    def port_num(self) -> int:
        return self.inner.port_num

    async def query(self) -> PortAttributes:
        self.attrs = await self.inner.query()
        return self.attrs

    async def known_attrs(self) -> PortAttributes | None:
        """The cached attributes, queried once if the daemon has not done so yet."""
        if self.attrs is None:
            try:
                await self.query()
            except FabricError:
                return None
        return self.attrs

    async def sa_send(
        self, mad: bytes, dest: SaDestination, *, timeout_ms: int, retries: int
    ) -> bytes:
        tap = self.tap
        if not tap.observers:
            return await self.inner.sa_send(mad, dest, timeout_ms=timeout_ms, retries=retries)
        attrs = await self.known_attrs()
        call = self.sa_start(mad, dest, timeout_ms=timeout_ms, retries=retries)
        if call is not None:
            return await call.wait()
        # A backend that cannot start calls: the same traces around its sa_send.
        lid = attrs.lid if attrs is not None else 0
        pkey = _pkey_at(attrs, dest.pkey_index)
        started = trio.current_time()
        tap.emit(self._sa_trace(Direction.SENT, started, mad, lid, dest, pkey))
        try:
            answer = await self.inner.sa_send(mad, dest, timeout_ms=timeout_ms, retries=retries)
        except FabricError as exc:
            self._exchange(mad, _outcome(exc), started)
            raise
        self._answered(mad, answer, lid, dest, pkey, started)
        return answer

    def sa_start(
        self, mad: bytes, dest: SaDestination, *, timeout_ms: int, retries: int
    ) -> SaCall | None:
        tap = self.tap
        if not tap.observers:
            return self.inner.sa_start(mad, dest, timeout_ms=timeout_ms, retries=retries)
        # Nothing may be awaited here: the attributes the daemon last queried.
        attrs = self.attrs
        lid = attrs.lid if attrs is not None else 0
        pkey = _pkey_at(attrs, dest.pkey_index)
        started = trio.current_time()
        try:
            inner = self.inner.sa_start(mad, dest, timeout_ms=timeout_ms, retries=retries)
        except FabricError as exc:
            tap.emit(self._sa_trace(Direction.SENT, started, mad, lid, dest, pkey))
            self._exchange(mad, _outcome(exc), started)
            raise
        if inner is None:
            return None
        tap.emit(self._sa_trace(Direction.SENT, started, mad, lid, dest, pkey))

        def traced(call: SaCall) -> None:
            # Registered first: traced in the round that read the answer, before the
            # caller's waiters. A call its caller abandoned (cancelled) has no exchange, as
            # a cancelled ``sa_send`` has none.
            if call.reply is not None:
                self._answered(mad, call.reply, lid, dest, pkey, started)
            elif call.error is not None and not call.abandoned:
                self._exchange(mad, _outcome(call.error), started)

        inner.when_ended(traced)
        return inner

    def _answered(
        self, mad: bytes, answer: bytes, lid: int, dest: SaDestination, pkey: int, started: float
    ) -> None:
        """Trace an answer (as the segments it came in) and its exchange."""
        tap = self.tap
        now = trio.current_time()
        for segment in _sa_segments(answer):
            tap.emit(self._sa_trace(Direction.RECEIVED, now, segment, lid, dest, pkey))
        status = int.from_bytes(answer[4:6], "big") if len(answer) >= 6 else None
        self._exchange(mad, SaOutcome.OK, started, status)

    async def sa_report(self) -> bytes:
        report = await self.inner.sa_report()
        if self.tap.observers:
            await self._trace_unsolicited(Direction.RECEIVED, report, None)
        return report

    async def sa_post(self, mad: bytes, dest: SaDestination) -> None:
        if self.tap.observers:
            await self._trace_unsolicited(Direction.SENT, mad, dest)
        await self.inner.sa_post(mad, dest)

    async def _trace_unsolicited(
        self, direction: Direction, mad: bytes, dest: SaDestination | None
    ) -> None:
        attrs = await self.known_attrs()
        if dest is None:  # a Report comes from the SM
            dest = SaDestination(
                attrs.sm_lid if attrs else 0,
                attrs.sm_sl if attrs else 0,
                attrs.sa_pkey_index() if attrs else 0,
            )
        lid = attrs.lid if attrs is not None else 0
        pkey = _pkey_at(attrs, dest.pkey_index)
        self.tap.emit(self._sa_trace(direction, trio.current_time(), mad, lid, dest, pkey))

    def _sa_trace(
        self,
        direction: Direction,
        when: float,
        mad: bytes,
        lid: int,
        dest: SaDestination,
        pkey: int,
    ) -> MadTrace:
        # SA MADs travel without a GRH between the port and the SM, QP1 to QP1.
        slid, dlid = (lid, dest.sm_lid) if direction is Direction.SENT else (dest.sm_lid, lid)
        return MadTrace(
            time=when,
            direction=direction,
            port=self.name,
            mad=bytes(mad),
            slid=slid,
            dlid=dlid,
            src_qp=SA_QPN,
            dest_qp=SA_QPN,
            pkey=pkey,
            sl=dest.sm_sl,
        )

    def _exchange(
        self, mad: bytes, outcome: SaOutcome, started: float, status: int | None = None
    ) -> None:
        latency = trio.current_time() - started
        self.tap.emit_exchange(SaExchange(self.name, bytes(mad), outcome, latency, status))

    async def open_ud(self, pkey_index: int, *, recv_depth: int) -> UdQp:
        qp = await self.inner.open_ud(pkey_index, recv_depth=recv_depth)
        return TapUdQp(self, qp, pkey_index)


class TapUdQp(UdQp):
    def __init__(self, port: TapPort, inner: UdQp, pkey_index: int) -> None:
        self.port = port
        self.inner = inner
        self.pkey_index = pkey_index
        self._mlids: dict[bytes, int] = {}
        """MGID -> MLID of the groups attached (the MLID a multicast arrival was sent to)."""

    @property
    def qpn(self) -> int:
        return self.inner.qpn

    @property
    def completion_errors(self) -> int:
        return self.inner.completion_errors

    @completion_errors.setter
    def completion_errors(self, value: int) -> None:
        self.inner.completion_errors = value

    async def send(self, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        tap = self.port.tap
        if not tap.observers:
            await self.inner.send(mad, av, remote_qpn)
            return
        attrs = await self.port.known_attrs()
        await self.inner.send(mad, av, remote_qpn)
        # Nothing may be awaited from here on: the MAD is on the wire.
        tap.emit(self._sent_trace(attrs, mad, av, remote_qpn))

    def post(self, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        self.inner.post(mad, av, remote_qpn)
        tap = self.port.tap
        if tap.observers:
            # A post cannot wait for a query: the attributes the daemon last queried.
            tap.emit(self._sent_trace(self.port.attrs, mad, av, remote_qpn))

    def _sent_trace(
        self, attrs: PortAttributes | None, mad: bytes, av: AddressVector, remote_qpn: int
    ) -> MadTrace:
        lid = attrs.lid if attrs is not None else 0
        sgid = bytes(16)
        if attrs is not None and 0 <= av.sgid_index < len(attrs.gids):
            sgid = attrs.gids[av.sgid_index]
        return MadTrace(
            time=trio.current_time(),
            direction=Direction.SENT,
            port=self.port.name,
            mad=bytes(mad),
            slid=lid | av.src_path_bits,
            dlid=av.dlid,
            src_qp=self.qpn,
            dest_qp=remote_qpn,
            pkey=_pkey_at(attrs, self.pkey_index),
            sl=av.sl,
            sgid=sgid,
            dgid=av.dgid,
            tclass=av.traffic_class,
            flow_label=av.flow_label,
            hop_limit=av.hop_limit,
        )

    async def serve(self, handler: MadHandler, limit: int = RECEIVE_BATCH) -> None:
        port = self.port
        if port.tap.observers:
            await port.known_attrs()

        def traced(batch: list[ReceivedMad]) -> None:
            tap = port.tap
            if tap.observers:
                for got in batch:
                    tap.emit(self._received_trace(got))
            handler(batch)

        await self.inner.serve(traced, limit)

    async def receive(self) -> ReceivedMad:
        if self.port.tap.observers:
            await self.port.known_attrs()  # before the receive: afterwards nothing may wait
        got = await self.inner.receive()
        tap = self.port.tap
        if tap.observers:
            tap.emit(self._received_trace(got))
        return got

    async def receive_many(self, limit: int) -> list[ReceivedMad]:
        if self.port.tap.observers:
            await self.port.known_attrs()
        batch = await self.inner.receive_many(limit)
        tap = self.port.tap
        if tap.observers:
            for got in batch:
                tap.emit(self._received_trace(got))
        return batch

    def _received_trace(self, got: ReceivedMad) -> MadTrace:
        attrs = self.port.attrs
        lid = attrs.lid if attrs is not None else 0
        multicast = got.dgid[:1] == b"\xff"
        if multicast:
            dlid, dest_qp = self._mlids.get(got.dgid, 0), MULTICAST_QPN
        else:
            dlid, dest_qp = lid | got.dlid_path_bits, self.qpn
        return MadTrace(
            time=trio.current_time(),
            direction=Direction.RECEIVED,
            port=self.port.name,
            mad=bytes(got.mad),
            slid=got.slid,
            dlid=dlid,
            src_qp=got.src_qp,
            dest_qp=dest_qp,
            pkey=_pkey_at(attrs, got.pkey_index),
            sgid=got.sgid,
            dgid=got.dgid,
        )

    async def attach_mcast(self, mgid: bytes, mlid: int) -> None:
        await self.inner.attach_mcast(mgid, mlid)
        self._mlids[bytes(mgid)] = mlid

    async def detach_mcast(self, mgid: bytes, mlid: int) -> None:
        await self.inner.detach_mcast(mgid, mlid)
        self._mlids.pop(bytes(mgid), None)

    async def aclose(self) -> None:
        await self.inner.aclose()


# -- the capture file --------------------------------------------------------------------------


class CaptureError(Exception):
    """A capture could not be started or written; the message says why."""


class CaptureUsageError(CaptureError, ValueError):
    """The request itself is wrong (bad path or action, nothing running, already running)."""


@dataclass(eq=False, slots=True)
class _Session:
    path: str
    send: trio.MemorySendChannel[MadTrace]
    wall_anchor: float
    clock_anchor: float
    done: trio.Event
    records: int = 0
    written: int = 0
    dropped: int = 0
    unencodable: int = 0
    error: str | None = None
    active: bool = True
    losses: Losses = field(default_factory=lambda: Losses("captured MAD"))
    """MADs that a failed write (full disk) kept out of the file."""


def capture_record(trace: MadTrace, seconds: float) -> bytes:
    """The pcap record of one traced MAD (ERF type 21, interface by direction)."""
    interface = INTERFACE_SENT if trace.direction is Direction.SENT else INTERFACE_RECEIVED
    return erf.erf_infiniband_record(seconds, trace.packet(), interface)


def _open_capture_file(path: str) -> io.FileIO:
    # O_NOFOLLOW: a planted symlink must not redirect a root daemon's write.
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, CAPTURE_FILE_MODE)
    # Unbuffered: a failed write is known at once, and nothing is left to fail at close.
    return io.FileIO(fd, "wb")


def _append(file: io.FileIO, data: bytes, end: int) -> None:
    """Write ``data`` at ``end`` (the end of the last whole record). If that fails part way,
    cut the file back to ``end`` first, so a reader never meets half a record, and raise."""
    view = memoryview(data)
    done = 0
    try:
        while done < len(data):
            done += file.write(view[done:]) or 0
    except OSError:
        with contextlib.suppress(OSError):
            file.truncate(end)
            file.seek(end)
        raise


class CaptureControl:
    """Start and stop writing a tap's MADs to a capture file; see the module docstring.

    ``run`` must be running (``await nursery.start(control.run)``): the file writer of each
    capture lives in its nursery. ``start``/``stop``/``status`` are what ``--capture`` and the
    admin command ``capture`` call.
    """

    def __init__(
        self,
        tap: TapFabric,
        *,
        queue_size: int = DEFAULT_QUEUE,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        self.tap = tap
        self._queue_size = queue_size
        self._wall_clock = wall_clock
        self._nursery: trio.Nursery | None = None
        self._session: _Session | None = None
        self._lock = trio.Lock()

    @property
    def active(self) -> bool:
        return self._session is not None and self._session.active

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the capture writers until cancelled (a running capture is flushed and closed)."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None
            self.tap.remove_observer(self)

    async def start(self, path: object) -> dict[str, Any]:
        """Begin a capture to ``path`` (absolute; created 0600 or truncated)."""
        if not isinstance(path, str) or not path.strip():
            raise CaptureUsageError(f"capture path must be a non-empty string, got {path!r}")
        if not os.path.isabs(path):
            raise CaptureUsageError(f"capture path must be absolute, got {path!r}")
        async with self._lock:
            if self._nursery is None:
                raise CaptureError("the capture control is not running")
            if self._session is not None and self._session.active:
                raise CaptureUsageError(
                    f"a capture to {self._session.path!r} is already running; stop it first"
                )
            try:
                raw = await trio.to_thread.run_sync(_open_capture_file, path)
            except OSError as exc:
                raise CaptureError(f"cannot open capture file {path!r}: {reason(exc)}") from exc
            header = erf.pcap_file_header()
            try:
                await trio.to_thread.run_sync(_append, raw, header, 0)
            except BaseException as failure:
                raw.close()
                if isinstance(failure, OSError):
                    raise CaptureError(
                        f"cannot write capture file {path!r}: {reason(failure)}"
                    ) from failure
                raise
            send, receive = trio.open_memory_channel[MadTrace](self._queue_size)
            session = _Session(
                path=path,
                send=send,
                wall_anchor=self._wall_clock(),
                clock_anchor=trio.current_time(),
                done=trio.Event(),
            )
            self._session = session
            session.written = len(header)
            self._nursery.start_soon(self._writer, session, receive, raw)
            self.tap.add_observer(self)
            log.info("MAD capture started", path=path)
            return self.status()

    async def stop(self) -> dict[str, Any]:
        """End the running capture; returns once every queued MAD is in the file."""
        async with self._lock:
            session = self._session
            if session is None or not session.active:
                raise CaptureUsageError("no capture is running")
            self.tap.remove_observer(self)
            session.send.close()
            await session.done.wait()
            log.info("MAD capture stopped", path=session.path, records=session.records)
            return self.status()

    def status(self) -> dict[str, Any]:
        """JSON-able state of the current (or last) capture."""
        session = self._session
        if session is None:
            return {
                "active": False,
                "path": None,
                "records": 0,
                "dropped": 0,
                "lost": 0,
                "bytes": 0,
            }
        return {
            "active": session.active,
            "path": session.path,
            "records": session.records,
            "dropped": session.dropped,
            "lost": session.losses.total,
            "unencodable": session.unencodable,
            "bytes": session.written,
            "started": session.wall_anchor,
            "error": session.error,
        }

    async def command(self, args: Mapping[str, Any]) -> dict[str, Any]:
        """The admin command: ``{"action": "start"|"stop"|"status", "path": ...}``."""
        action = args.get("action", "status")
        if action == "start":
            return await self.start(args.get("path"))
        if action == "stop":
            return await self.stop()
        if action == "status":
            return self.status()
        raise CaptureUsageError(f"capture action must be start, stop or status, got {action!r}")

    # -- observer ----------------------------------------------------------------------------

    def on_mad(self, trace: MadTrace) -> None:
        session = self._session
        if session is None or not session.active:
            return
        try:
            session.send.send_nowait(trace)
        except trio.WouldBlock:
            session.dropped += 1
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass  # stopping: the MAD came after the end of the capture

    def on_sa_exchange(self, exchange: SaExchange) -> None:
        """Latencies are for metrics; the capture has the MADs themselves."""

    # -- writer ------------------------------------------------------------------------------

    def _encode(self, session: _Session, traces: Sequence[MadTrace]) -> list[bytes]:
        chunks = []
        for trace in traces:
            seconds = max(0.0, session.wall_anchor + (trace.time - session.clock_anchor))
            try:
                chunks.append(capture_record(trace, seconds))
            except WireError as exc:
                session.unencodable += 1
                log.warning("MAD not capturable", port=trace.port, error=str(exc))
        return chunks

    async def _write(self, session: _Session, file: io.FileIO, traces: Sequence[MadTrace]) -> None:
        """Append the records of ``traces``; a failed write costs them, never the capture."""
        chunks = self._encode(session, traces)
        if not chunks:
            return
        data = b"".join(chunks)
        losses = session.losses
        try:
            # Shielded: MADs taken off the queue must reach the file even at shutdown.
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(_append, file, data, session.written)
        except OSError as exc:
            session.error = f"writing {session.path!r} failed: {reason(exc)}"
            if not losses.failing:  # once per failure, not per write: the log may be full too
                log.error("MAD capture losing records", path=session.path, error=reason(exc))
            losses.lost(session.path, reason(exc), len(chunks))
            return
        session.records += len(chunks)
        session.written += len(data)
        if losses.failing:
            losses.recovered(session.path)
            session.error = None
            log.warning("MAD capture writing again", path=session.path, lost=losses.total)

    async def _writer(
        self,
        session: _Session,
        receive: trio.MemoryReceiveChannel[MadTrace],
        file: io.FileIO,
    ) -> None:
        try:
            async for trace in receive:
                await self._write(session, file, [trace, *_drain(receive)])
        finally:
            with trio.CancelScope(shield=True):
                await self._finish(session, receive, file)

    async def _finish(
        self,
        session: _Session,
        receive: trio.MemoryReceiveChannel[MadTrace],
        file: io.FileIO,
    ) -> None:
        """Write what is still queued (shutdown), close the file, mark the session over."""
        session.active = False
        self.tap.remove_observer(self)
        try:
            await self._write(session, file, _drain(receive))
        finally:
            receive.close()
            try:
                await trio.to_thread.run_sync(file.close)
            except OSError as exc:
                session.error = session.error or f"closing {session.path!r} failed: {reason(exc)}"
            session.done.set()


def _drain(receive: trio.MemoryReceiveChannel[MadTrace]) -> list[MadTrace]:
    items: list[MadTrace] = []
    while True:
        try:
            items.append(receive.receive_nowait())
        except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
            return items


__all__ = [
    "CAPTURE_FILE_MODE",
    "DEFAULT_QUEUE",
    "INTERFACE_RECEIVED",
    "INTERFACE_SENT",
    "CaptureControl",
    "CaptureError",
    "CaptureUsageError",
    "Direction",
    "MadKind",
    "MadObserver",
    "MadTrace",
    "SaExchange",
    "SaOutcome",
    "TapDevice",
    "TapFabric",
    "TapPort",
    "TapUdQp",
    "capture_record",
    "describe_mad",
]

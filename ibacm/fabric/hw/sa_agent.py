"""SA transactions over one umad port: send, match replies by TID, time out.

The agent is registered like C does (class 0x03, RMPP version 1) except that it says class
version 2 — the SA's version — where C says 1 (defect 41), and that its method mask takes
SubnAdmReport: the Reports of the events the provider subscribes to arrive on it (queued for
``report``, at most ``REPORT_QUEUE``, oldest dropped first) and are acked with ``post``.
Semantics are the kernel's (mad-protocol.md §9.7): every MAD is sent with the caller's
``timeout_ms`` and ``retries``, the kernel retransmits, and a reply is matched on
the low 32 bits of its TID because the kernel rewrites the upper 32 bits. A request the kernel
gave up on comes back with status ETIMEDOUT and ends its call with ``SaTimeout``.

``start`` sends and returns the transaction's ``SaCall``; the call ends in the round that
reads its reply (or the kernel's ETIMEDOUT report), so its ``when_ended`` callbacks run there
(issue 28). Receiving is driven by whichever call's ``wait`` (or ``report``) is waiting
(``TurnPoller``): it waits in trio for the port's fd (a kernel umad device, the emulated HCA's
socket) and reads what is queued; where there is no fd to poll (ibsim's preload) it runs a
blocking ``umad_recv`` with a short timeout in a worker thread, and calls end when the
thread's hand-off arrives. A trio deadline of ``timeout_ms x (retries + 1)`` plus a grace
period after the send backs the kernel's own timeout up, so a MAD layer that never reports
timeouts (the simulator) still ends every call.

Replies longer than one MAD: with kernel RMPP the whole reply arrives in one read and is
returned as is; RMPP DATA segments that arrive one at a time (a MAD layer without RMPP) are
acknowledged segment by segment and reassembled with ``RmppReassembler``. Replies shorter
than 256 bytes (the simulator sends only the used part) are zero-padded to a full MAD.
"""

from __future__ import annotations

import errno
from collections import deque
from dataclasses import dataclass, field

import trio

from ibacm.fabric.api import (
    ACM_QKEY,
    MAD_SIZE,
    SA_QPN,
    FabricError,
    SaCall,
    SaDestination,
    SaSendError,
    SaTimeout,
)
from ibacm.fabric.hw.poller import TurnPoller
from ibacm.fabric.hw.umad import UmadApi, UmadError, UmadPacket, UmadSendAddress
from ibacm.log import get_logger
from ibacm.wire.errors import WireError
from ibacm.wire.mad import (
    MAD_HDR_LEN,
    RMPP_VERSION,
    SA_CLASS_VERSION,
    SA_HDR_END,
    MadHeader,
    Method,
    MgmtClass,
    RmppReassembler,
    RmppType,
    SaHeader,
    build_rmpp_ack,
)

log = get_logger("ibacm.fabric.hw.sa")

POLL_MS = 50
"""How long one receive call blocks: bounds how late a cancellation or a close takes effect."""
GRACE_MS = 250
"""Extra wait after the kernel's own timeout x (retries + 1) before giving up locally."""
TID_MASK = 0xFFFFFFFF
RMPP_WINDOW = 32
"""Segments a windowed RMPP sender may send beyond the last one acknowledged."""
REPORT_QUEUE = 64


@dataclass(eq=False, slots=True)
class _Transaction:
    tid: int
    dest: SaDestination
    call: SaCall
    reassembler: RmppReassembler = field(default_factory=RmppReassembler)


def _tid_of(mad: bytes) -> int:
    return int.from_bytes(mad[8:16], "big") & TID_MASK


def _is_rmpp_segment(mad: bytes) -> bool:
    if len(mad) > MAD_SIZE or len(mad) < SA_HDR_END:
        return False  # a kernel-reassembled reply, or too short to carry an RMPP header
    sa = SaHeader.decode(mad)
    return sa.rmpp_active and sa.rmpp_type == RmppType.DATA and sa.rmpp_version == RMPP_VERSION


class SaAgent:
    """The SA agent of one (CA, port), opened with ``open()`` and closed with ``aclose()``."""

    def __init__(
        self,
        umad: UmadApi,
        ca_name: str,
        port_num: int,
        *,
        poll_ms: int = POLL_MS,
        grace_ms: int = GRACE_MS,
    ) -> None:
        self._umad = umad
        self.ca_name = ca_name
        self.port_num = port_num
        self._poll_ms = poll_ms
        self._grace_ms = grace_ms
        self._portid: int | None = None
        self._agent = -1
        self._pending: dict[int, _Transaction] = {}
        self._fd: int | None = None
        self._poller = TurnPoller(self._receive_step, name=f"SA agent {ca_name}:{port_num}")
        self.unmatched = 0
        """Replies that matched no outstanding request (late, duplicate or foreign)."""
        self._reports: deque[bytes] = deque(maxlen=REPORT_QUEUE)
        self.reports_dropped = 0

    def open(self) -> None:
        """Open the umad port and register the agent (raises ``UmadError``)."""
        portid = self._umad.open_port(self.ca_name, self.port_num)
        try:
            self._agent = self._umad.register(
                portid, MgmtClass.SUBN_ADM, SA_CLASS_VERSION, RMPP_VERSION, (Method.REPORT,)
            )
        except BaseException:
            self._umad.close_port(portid)
            raise
        self._portid = portid
        self._fd = self._umad.poll_fd(portid)

    @property
    def outstanding(self) -> int:
        return len(self._pending)

    @property
    def polled(self) -> bool:
        """Replies are read when the port's fd polls readable (not in a worker thread)."""
        return self._fd is not None

    async def request(
        self, mad: bytes, dest: SaDestination, *, timeout_ms: int, retries: int
    ) -> bytes:
        """Send one SA MAD and return the (reassembled) reply MAD."""
        return await self.start(mad, dest, timeout_ms=timeout_ms, retries=retries).wait()

    def start(self, mad: bytes, dest: SaDestination, *, timeout_ms: int, retries: int) -> SaCall:
        """Send one SA MAD (the kernel retransmits it) and return its call, ended in the
        round that reads its reply; its ``wait`` reads the port until then, or ends it with
        SaTimeout ``timeout_ms x (retries + 1)`` plus the grace after the send."""
        portid = self._require_open()
        if len(mad) != MAD_SIZE:
            raise SaSendError(f"an SA MAD is {MAD_SIZE} bytes, got {len(mad)}")
        if timeout_ms <= 0 or retries < 0:
            raise SaSendError(f"bad umad timing: timeout_ms={timeout_ms}, retries={retries}")
        tid = _tid_of(mad)
        if tid in self._pending:
            raise SaSendError(f"TID {tid:#010x} is already outstanding on {self.ca_name}")
        deadline_ms = timeout_ms * (retries + 1) + self._grace_ms
        deadline = trio.current_time() + deadline_ms / 1000

        async def drive(call: SaCall) -> None:
            with trio.move_on_at(deadline):
                try:
                    await self._poller.wait_until(lambda: call.ended)
                except trio.ClosedResourceError:
                    call.end(None, self._closed_error())
            # Past the deadline (a call that ended already keeps its end).
            call.end(None, SaTimeout(f"no SA reply for TID {tid:#010x} in {deadline_ms} ms"))

        transaction = _Transaction(tid, dest, SaCall(drive))
        pending = self._pending

        def forget(_: SaCall) -> None:
            if pending.get(tid) is transaction:
                del pending[tid]

        pending[tid] = transaction
        transaction.call.when_ended(forget)
        try:
            self._send(portid, mad, dest, timeout_ms=timeout_ms, retries=retries)
        except BaseException:
            forget(transaction.call)
            raise
        return transaction.call

    async def report(self) -> bytes:
        """The next SubnAdmReport the SA sent to this port."""
        self._require_open()
        try:
            await self._poller.wait_until(lambda: bool(self._reports))
        except trio.ClosedResourceError as exc:
            raise self._closed_error() from exc
        return self._reports.popleft()

    def post(self, mad: bytes, dest: SaDestination) -> None:
        """Send one SA MAD that gets no answer (a ReportResp), its TID as it is."""
        portid = self._require_open()
        if len(mad) != MAD_SIZE:
            raise SaSendError(f"an SA MAD is {MAD_SIZE} bytes, got {len(mad)}")
        self._send(portid, mad, dest, timeout_ms=0, retries=0)

    async def aclose(self) -> None:
        """Fail outstanding calls, wait for the receive thread, close the port."""
        if self._portid is None:
            return
        self._poller.close()
        self._fail_all(self._closed_error())
        if self._fd is not None:
            trio.lowlevel.notify_closing(self._fd)  # wakes a step waiting for the fd
        await self._poller.wait_idle()
        portid, self._portid = self._portid, None
        self._umad.unregister(portid, self._agent)
        self._umad.close_port(portid)

    # -- internals -----------------------------------------------------------------------
    def _require_open(self) -> int:
        if self._portid is None or self._poller.closed:
            raise SaSendError(f"the SA agent of {self.ca_name} port {self.port_num} is closed")
        return self._portid

    def _send(
        self, portid: int, mad: bytes, dest: SaDestination, *, timeout_ms: int, retries: int
    ) -> None:
        address = UmadSendAddress(
            dlid=dest.sm_lid, dqpn=SA_QPN, sl=dest.sm_sl, qkey=ACM_QKEY, pkey_index=dest.pkey_index
        )
        try:
            self._umad.send(
                portid, self._agent, mad, address, timeout_ms=timeout_ms, retries=retries
            )
        except UmadError as exc:
            raise SaSendError(str(exc)) from exc

    def _closed_error(self) -> SaSendError:
        return SaSendError(f"SA agent of {self.ca_name} closed")

    async def _receive_step(self) -> None:
        portid = self._portid
        if portid is None:
            return
        try:
            if self._fd is not None:
                await trio.lowlevel.wait_readable(self._fd)
                packet = self._umad.recv(portid, 0)
            else:
                packet = await trio.to_thread.run_sync(self._umad.recv, portid, self._poll_ms)
        except UmadError as exc:
            self._fail_all(SaSendError(f"receive on {self.ca_name}: {exc}"))
            return
        # Dispatched before any checkpoint, so a cancelled waiter loses nothing.
        if packet is not None:
            self._dispatch(packet)

    def _fail_all(self, error: FabricError) -> None:
        for transaction in list(self._pending.values()):  # an ended call leaves the table
            transaction.call.end(None, error)

    def _dispatch(self, packet: UmadPacket) -> None:
        mad = packet.mad
        if len(mad) < MAD_HDR_LEN:
            log.warning("short umad packet dropped", length=len(mad), ca=self.ca_name)
            return
        if not packet.status and mad[3] == Method.REPORT and packet.agent_id == self._agent:
            if len(self._reports) == self._reports.maxlen:
                self.reports_dropped += 1
            self._reports.append(mad.ljust(MAD_SIZE, b"\0"))
            return
        tid = _tid_of(mad)
        transaction = self._pending.get(tid)
        if transaction is None or packet.agent_id != self._agent:
            self.unmatched += 1
            log.debug("unmatched SA packet dropped", tid=f"{tid:#010x}", status=packet.status)
            return
        if packet.status:
            transaction.call.end(None, self._status_error(tid, packet.status))
            return
        header = MadHeader.decode(mad[:MAD_HDR_LEN])
        if not header.method & 0x80:
            return  # not a response (our own request echoed by a loopback): ignore
        if _is_rmpp_segment(mad):
            self._accept_segment(transaction, mad.ljust(MAD_SIZE, b"\0"))
        else:
            transaction.call.end(mad.ljust(MAD_SIZE, b"\0"))

    @staticmethod
    def _status_error(tid: int, status: int) -> FabricError:
        if status == errno.ETIMEDOUT:
            return SaTimeout(f"SA request TID {tid:#010x} timed out (umad status ETIMEDOUT)")
        name = errno.errorcode.get(status, str(status))
        return SaSendError(f"SA request TID {tid:#010x} failed: umad status {name}")

    def _accept_segment(self, transaction: _Transaction, segment: bytes) -> None:
        try:
            whole = transaction.reassembler.feed(segment)
        except WireError as exc:
            tid = transaction.tid
            transaction.call.end(None, SaSendError(f"bad RMPP reply for TID {tid:#010x}: {exc}"))
            return
        self._acknowledge(transaction, segment)
        if whole is not None:
            transaction.call.end(whole)

    def _acknowledge(self, transaction: _Transaction, segment: bytes) -> None:
        # A windowed RMPP sender sends further segments only once earlier ones are ACKed.
        portid = self._portid
        if portid is None:
            return
        seg_num = SaHeader.decode(segment).seg_num
        ack = build_rmpp_ack(segment, new_window_last=seg_num + RMPP_WINDOW)
        address = UmadSendAddress(
            dlid=transaction.dest.sm_lid,
            dqpn=SA_QPN,
            sl=transaction.dest.sm_sl,
            qkey=ACM_QKEY,
            pkey_index=transaction.dest.pkey_index,
        )
        try:
            self._umad.send(portid, self._agent, ack, address, timeout_ms=0, retries=0)
        except UmadError as exc:
            transaction.call.end(None, SaSendError(f"cannot acknowledge RMPP segment: {exc}"))


class PortSa:
    """The SA access of one port: its agent, or why it has none.

    As in C, a port whose umad agent cannot be opened keeps working without SA access; its
    SA requests then fail with a ``SaSendError`` that says why.
    """

    def __init__(self, umad: UmadApi, ca_name: str, port_num: int) -> None:
        self._agent: SaAgent | None = SaAgent(umad, ca_name, port_num)
        self.error = ""
        try:
            self._agent.open()
        except UmadError as exc:
            self._agent, self.error = None, str(exc)
            log.warning("no SA access on port", device=ca_name, port=port_num, error=self.error)
        self._where = f"{ca_name} port {port_num}"

    def start(self, mad: bytes, dest: SaDestination, *, timeout_ms: int, retries: int) -> SaCall:
        """``SaAgent.start`` (the port's ``sa_start``; its ``sa_send`` waits for the call)."""
        return self._require().start(mad, dest, timeout_ms=timeout_ms, retries=retries)

    async def report(self) -> bytes:
        return await self._require().report()

    def post(self, mad: bytes, dest: SaDestination) -> None:
        self._require().post(mad, dest)

    def _require(self) -> SaAgent:
        if self._agent is None:
            raise SaSendError(f"no umad SA agent on {self._where}: {self.error}")
        return self._agent

    async def aclose(self) -> None:
        if self._agent is not None:
            await self._agent.aclose()

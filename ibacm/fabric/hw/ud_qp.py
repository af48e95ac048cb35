"""The ACM UD QP on a real HCA, through pyverbs.

One QP per endpoint (mad-protocol.md §1): Q_Key 0x80010000, the endpoint's P_Key index, one
CQ for sends and receives bound to a completion channel, ``recv_depth`` receive buffers of
296 bytes (40-byte GRH area + MAD) re-posted once the poll that read it is handled — also
after an error completion, so errors cannot wedge the endpoint (C defect 46) — and a GRH on
every send.

Completions are driven by whichever task waits (``TurnPoller``: a ``send``, a receiver or
``serve``): it waits for the completion channel's fd with ``trio.lowlevel.wait_readable``, then
acknowledges the event, polls the CQ empty, re-arms it and polls again. Send completions go to their
waiting ``send``, or release the slot of a ``post`` (an error status is logged and counted);
the received MADs of each poll go to the ``serve`` handler in that same round (issue 28: no
scheduler pass between a MAD in and the MAD it causes), or to a queue for ``receive_many``.

The work requests are built once, one per receive buffer and one per send slot, and posted
again and again (a provider copies a work request when it is posted): a post costs one verbs
call, not two pyverbs objects, whose scatter lists Debian's pyverbs never frees (about 64
bytes lost per post before).
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

import trio

from ibacm.fabric.api import (
    ACM_QKEY,
    MAD_SIZE,
    RECEIVE_BATCH,
    AddressVector,
    FabricError,
    MadHandler,
    ReceivedMad,
    SendQueueFull,
    UdQp,
    deliver_batch,
)
from ibacm.fabric.hw import verbs_attrs as attrs
from ibacm.fabric.hw.poller import TurnPoller
from ibacm.fabric.hw.pyverbs_loader import Pyverbs
from ibacm.fabric.hw.verbs_handles import ContextHandle, LibVerbs, VerbsHandles
from ibacm.log import get_logger

log = get_logger("ibacm.fabric.hw.qp")

SEND_DEPTH = 32
"""Sends in flight per QP (C: resolve_depth + send_depth, 2 by default)."""
POLL_BATCH = 16
AH_CACHE = 1024
"""Address handles kept per QP, least recently used dropped first."""
SEND_WR_BASE = 1 << 32
"""Send work requests are numbered from here; receives use their buffer index."""


@dataclass(frozen=True, slots=True)
class QpResources:
    """What a device lends a QP: pyverbs, the C-level helpers and the device objects."""

    pv: Pyverbs
    lib: LibVerbs
    handles: VerbsHandles
    ctx: Any
    ctx_handle: ContextHandle
    pd: Any
    port_num: int


@dataclass(eq=False, slots=True)
class _Send:
    slot: int
    status: int | None = None
    abandoned: bool = False
    """Nobody waits for its completion (a ``post``, or a cancelled ``send``): the completion
    step releases the slot and counts an error status."""


class HwUdQp(UdQp):
    """A UD QP in RTS with its CQ, completion channel and registered buffers."""

    def __init__(self, res: QpResources, *, pkey_index: int, recv_depth: int) -> None:
        if recv_depth < 1:
            raise FabricError(f"recv_depth must be at least 1, got {recv_depth}")
        self._res = res
        self._recv_depth = recv_depth
        self._closing: list[Any] = []  # pyverbs objects, closed in reverse creation order
        self._recv_wrs: list[Any] = []
        """One work request per receive buffer (wr_id = its index), posted again and again."""
        self._send_wrs: list[Any] = []
        """One work request per send slot (wr_id = SEND_WR_BASE + slot)."""
        self._free_slots = list(range(SEND_DEPTH))
        self._send_credits = trio.Semaphore(SEND_DEPTH)
        self._sends: dict[int, _Send] = {}
        self._received: deque[ReceivedMad] = deque()
        self._reposting: list[int] = []
        """Receive buffers read in this poll, posted again after their MADs are handled."""
        self._ahs: OrderedDict[AddressVector, Any] = OrderedDict()
        self._handler: MadHandler | None = None
        self._handler_limit = RECEIVE_BATCH
        self.dropped = 0
        """Received MADs dropped because nobody consumed the queue fast enough."""
        try:
            self._create(pkey_index)
        except res.pv.Error as exc:
            self._destroy()
            raise FabricError(f"cannot create the UD QP on port {res.port_num}: {exc}") from exc
        except BaseException:
            self._destroy()
            raise
        self._poller = TurnPoller(self._completion_step, name=f"UD QP {self.qpn:#x}")

    def _create(self, pkey_index: int) -> None:
        res, pv = self._res, self._res.pv
        # Created so that the reverse order (QP, MR, CQ, channel) is a valid teardown.
        self._channel = self._keep(pv.cq.CompChannel(res.ctx))
        self._fd = res.handles.comp_channel_fd(self._channel, res.ctx_handle)
        cq_size = SEND_DEPTH + self._recv_depth
        self._cq = self._keep(pv.cq.CQ(res.ctx, cq_size, None, self._channel, 0))
        self._cq.req_notify()
        size = (self._recv_depth + SEND_DEPTH) * attrs.RECV_SIZE
        self._mr = self._keep(pv.mr.MR(res.pd, size, pv.enums.IBV_ACCESS_LOCAL_WRITE))
        init = attrs.qp_init_attr(pv, self._cq, send_depth=SEND_DEPTH, recv_depth=self._recv_depth)
        state = attrs.ud_qp_attr(pv, port_num=res.port_num, pkey_index=pkey_index)
        self._qp = self._keep(pv.qp.QP(res.pd, init, state))
        self._qp_pointer = res.handles.qp(self._qp, res.ctx_handle)
        self._success = pv.enums.IBV_WC_SUCCESS
        self._grh_flag = pv.enums.IBV_WC_GRH
        buf, lkey = self._mr.buf, self._mr.lkey
        for slot in range(self._recv_depth):
            address = buf + slot * attrs.RECV_SIZE
            self._recv_wrs.append(attrs.recv_wr(pv, wr_id=slot, address=address, lkey=lkey))
        for slot in range(SEND_DEPTH):
            address = buf + (self._recv_depth + slot) * attrs.RECV_SIZE
            wr_id = SEND_WR_BASE + slot
            self._send_wrs.append(attrs.send_wr(pv, wr_id=wr_id, address=address, lkey=lkey))
        post_recv = self._qp.post_recv
        for wr in self._recv_wrs:
            post_recv(wr)

    def _keep(self, obj: Any) -> Any:
        self._closing.append(obj)
        return obj

    # -- UdQp ------------------------------------------------------------------------------
    @property
    def qpn(self) -> int:
        qpn: int = self._qp.qp_num
        return qpn

    async def send(self, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        self._check_mad(mad)
        self._require_open()
        try:
            self._send_credits.acquire_nowait()  # a free slot: no trip through the scheduler
        except trio.WouldBlock:
            await self._send_credits.acquire()
        wr_id = self._post_slot(mad, av, remote_qpn)
        record = self._sends[wr_id]
        slot = record.slot
        try:
            await self._poller.wait_until(lambda: record.status is not None)
        finally:
            if record.status is None:
                # Still owned by the HCA: the slot comes back with the completion.
                record.abandoned = True
            else:
                self._sends.pop(wr_id, None)  # gone already if the QP closed meanwhile
                self._release(slot)
        if record.status != self._success:
            raise FabricError(f"send completion error: status {record.status}")

    def post(self, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        self._check_mad(mad)
        if self._poller.closed:
            raise FabricError(f"UD QP {self.qpn:#x} is closed")
        try:
            self._send_credits.acquire_nowait()
        except trio.WouldBlock:
            raise SendQueueFull(
                f"UD QP {self.qpn:#x}: all {SEND_DEPTH} send slots are in flight"
            ) from None
        self._sends[self._post_slot(mad, av, remote_qpn)].abandoned = True

    async def serve(self, handler: MadHandler, limit: int = RECEIVE_BATCH) -> None:
        """``UdQp.serve``; one handler at a time (``trio.BusyResourceError``). A failure of
        the CQ itself is raised (``FabricError``): the QP cannot receive any more."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        if self._handler is not None:
            raise trio.BusyResourceError(f"UD QP {self.qpn:#x} is already served")
        self._handler, self._handler_limit = handler, limit
        try:
            self._hand_over()  # what receive_many had not taken yet comes first
            # Never satisfied: this task takes its turns driving the CQ until the QP closes.
            await self._poller.wait_until(lambda: False)
        except trio.ClosedResourceError:
            return
        finally:
            self._handler = None

    async def receive(self) -> ReceivedMad:
        return (await self.receive_many(1))[0]

    async def receive_many(self, limit: int) -> list[ReceivedMad]:
        await self._poller.wait_until(lambda: bool(self._received))
        queue = self._received
        return [queue.popleft() for _ in range(min(limit, len(queue)))]

    async def attach_mcast(self, mgid: bytes, mlid: int) -> None:
        self._require_open()
        self._res.lib.attach_mcast(self._qp_pointer, mgid, mlid)

    async def detach_mcast(self, mgid: bytes, mlid: int) -> None:
        self._require_open()
        self._res.lib.detach_mcast(self._qp_pointer, mgid, mlid)

    async def aclose(self) -> None:
        if self._poller.closed:
            return
        self._poller.close()
        # Wakes a task blocked in wait_readable on the channel before its fd is closed.
        trio.lowlevel.notify_closing(self._fd)
        await self._poller.wait_idle()
        self._destroy()

    # -- internals -------------------------------------------------------------------------
    def _require_open(self) -> None:
        if self._poller.closed:
            raise trio.ClosedResourceError(f"UD QP {self.qpn:#x} is closed")

    def _check_mad(self, mad: bytes) -> None:
        if len(mad) != MAD_SIZE:
            raise FabricError(f"a MAD is {MAD_SIZE} bytes, got {len(mad)}")

    def _post_slot(self, mad: bytes, av: AddressVector, remote_qpn: int) -> int:
        """Post ``mad`` in a free slot (its credit already taken); the record's wr_id."""
        slot = self._free_slots.pop()
        wr_id = SEND_WR_BASE + slot
        try:
            self._post_send(slot, mad, av, remote_qpn)
        except BaseException as exc:
            self._release(slot)
            if isinstance(exc, self._res.pv.Error):
                raise FabricError(f"cannot post a send on UD QP {self.qpn:#x}: {exc}") from exc
            raise
        self._sends[wr_id] = _Send(slot)
        return wr_id

    def _destroy(self) -> None:
        # Sends still owned by the HCA die with the QP: no completion will come for them.
        self._sends.clear()
        while self._closing:
            self._closing.pop().close()
        # Not closed: Debian's pyverbs never frees a work request's scatter list by itself,
        # but a pyverbs that did would free it twice after an explicit close. So a QP's
        # fixed set is never freed: recv_depth + SEND_DEPTH work requests and the SGEs they
        # were built from, about 64 bytes each.
        self._recv_wrs.clear()
        self._send_wrs.clear()
        # After the QP: sends still posted to it may use them.
        for ah in self._ahs.values():
            ah.close()
        self._ahs.clear()

    def _release(self, slot: int) -> None:
        self._free_slots.append(slot)
        self._send_credits.release()

    def _post_send(self, slot: int, mad: bytes, av: AddressVector, qpn: int) -> None:
        self._mr.write(mad, MAD_SIZE, (self._recv_depth + slot) * attrs.RECV_SIZE)
        wr = self._send_wrs[slot]
        wr.set_wr_ud(self._address_handle(av), qpn, ACM_QKEY)
        self._qp.post_send(wr)

    def _address_handle(self, av: AddressVector) -> Any:
        ah = self._ahs.get(av)
        if ah is not None:
            self._ahs.move_to_end(av)
            return ah
        pv = self._res.pv
        ah = pv.addr.AH(self._res.pd, attr=attrs.ah_attr(pv, av, self._res.port_num))
        self._ahs[av] = ah
        if len(self._ahs) > AH_CACHE:
            _, oldest = self._ahs.popitem(last=False)
            oldest.close()
        return ah

    async def _completion_step(self) -> None:
        await trio.lowlevel.wait_readable(self._fd)
        cq = self._cq
        try:
            self._channel.get_cq_event(cq)
            # At once, not in batches: ibv_destroy_cq waits for every event to be
            # acknowledged, and pyverbs destroys the CQ itself when its context closes first.
            cq.ack_events(1)
            # As C's completion handler: poll and handle first (a MAD's answer goes out
            # before anything else is asked of the device), re-arm, then poll again for
            # what completed in between (it raised no event).
            self._drain()
            cq.req_notify()
            self._drain()
        except self._res.pv.Error as exc:
            raise FabricError(f"completion queue of UD QP {self.qpn:#x}: {exc}") from exc

    def _drain(self) -> None:
        """Poll the CQ empty; each batch's MADs to the handler, then their buffers back."""
        poll = self._cq.poll
        while True:
            count, completions = poll(POLL_BATCH)
            if not count:
                return
            for wc in completions:
                wr_id = wc.wr_id
                if wr_id >= SEND_WR_BASE:
                    self._send_completed(wc, wr_id)
                else:
                    self._recv_completed(wc, wr_id)
            if self._handler is not None:
                self._hand_over()
            self._repost()
            if count < POLL_BATCH:
                return

    def _repost(self) -> None:
        slots, self._reposting = self._reposting, []
        if self._poller.closed:
            return
        post_recv, wrs = self._qp.post_recv, self._recv_wrs
        for slot in slots:
            post_recv(wrs[slot])

    def _send_completed(self, wc: Any, wr_id: int) -> None:
        record = self._sends.get(wr_id)
        if record is None:
            log.warning("completion for an unknown send", wr_id=wr_id)
            return
        status = record.status = wc.status
        if record.abandoned:
            del self._sends[wr_id]
            self._release(record.slot)
            if status != self._success:
                self.completion_errors += 1
                log.debug("send completion error", status=status, qpn=self.qpn)

    def _recv_completed(self, wc: Any, slot: int) -> None:
        if wc.status == self._success:
            mad = attrs.received_mad(
                self._mr.read(attrs.RECV_SIZE, slot * attrs.RECV_SIZE),
                byte_len=wc.byte_len,
                grh_present=bool(wc.wc_flags & self._grh_flag),
                slid=wc.slid,
                src_qp=wc.src_qp,
                dlid_path_bits=wc.dlid_path_bits,
                pkey_index=wc.pkey_index,
            )
            if mad is not None:
                self._queue(mad)
        elif not self._poller.closed:
            log.warning("receive completion error", status=wc.status, qpn=self.qpn)
        # Posted again once the batch is handled (``_repost``): its bytes were copied.
        self._reposting.append(slot)

    def _hand_over(self) -> None:
        """Queued MADs to the ``serve`` handler, if one is set, in batches of its limit."""
        queue, handler = self._received, self._handler
        while queue and handler is not None and not self._poller.closed:
            deliver_batch(
                handler, [queue.popleft() for _ in range(min(self._handler_limit, len(queue)))]
            )

    def _queue(self, mad: ReceivedMad) -> None:
        if len(self._received) >= self._recv_depth:
            self.dropped += 1  # like an RNR drop: the consumer is recv_depth MADs behind
            return
        self._received.append(mad)

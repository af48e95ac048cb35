"""Carrying MADs across the simulated fabric: UD QPs, unicast, multicast, latency and faults.

Unicast goes by DLID to the QP number given; multicast goes to every QP attached to the
MGID/MLID on ports that joined the group through the SA, the sender's own QP included (IB
loopback). Receivers check the Q_Key and the partition; a full receive queue drops the MAD
(like an RNR drop). Every transmission takes hops x ``link_latency`` plus ``faults.delay`` and
may be lost, duplicated or corrupted (``faults``). Every MAD put on the wire is counted in
``counters`` by (class, method, attribute); what happened to them is in ``stats``. The SA
transport (``sa_transport.py``) sends its MADs through the same counting, latency and faults.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import trio

from ibacm.fabric.api import (
    ACM_QKEY,
    MAD_SIZE,
    MULTICAST_QPN,
    AddressVector,
    FabricError,
    PortDownError,
    PortState,
    ReceivedMad,
)
from ibacm.fabric.sim.directory import Directory
from ibacm.fabric.sim.faults import FaultInjector, Faults
from ibacm.fabric.sim.multicast import (
    JOIN_FULL,
    JOIN_NON_MEMBER,
    MLID_FIRST,
    MLID_LAST,
    GroupTable,
)
from ibacm.fabric.sim.runtime import MAX_QPN, PortRuntime, QpSink, WorldQp
from ibacm.fabric.sim.sa_view import pkey_shared
from ibacm.fabric.sim.scheduler import DeliveryScheduler

GSI_QPN = 1
_RECEIVING = JOIN_FULL | JOIN_NON_MEMBER


def mad_key(mad: bytes) -> tuple[int, int, int]:
    """(management class, method, attribute ID) of a MAD; ACM MADs have no attribute (0)."""
    mgmt_class = mad[1] if len(mad) > 1 else 0
    method = mad[3] if len(mad) > 3 else 0
    attr = 0 if mgmt_class == 0x2C or len(mad) < 18 else int.from_bytes(mad[16:18], "big")
    return mgmt_class, method, attr


class Delivery:
    """See the module docstring. ``groups`` is the SA's group table (who joined what)."""

    def __init__(
        self,
        directory: Directory,
        groups: GroupTable,
        faults: Faults,
        inject: FaultInjector,
        stats: Counter[str],
        *,
        link_latency: float,
    ) -> None:
        if link_latency < 0:
            raise ValueError(f"link_latency must be >= 0, got {link_latency}")
        self.directory = directory
        self.router = directory.router
        self.groups = groups
        self.faults = faults
        self.inject = inject
        self.stats = stats
        self.link_latency = link_latency
        self.counters: Counter[tuple[int, int, int]] = Counter()
        self._scheduler = DeliveryScheduler()
        self._attached: dict[int, dict[WorldQp, bytes]] = {}
        self._running = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver until cancelled: ``await nursery.start(delivery.run)``."""
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self._scheduler.run)
                self._running = True
                task_status.started()
        finally:
            self._running = False

    @property
    def running(self) -> bool:
        return self._running

    def require_running(self) -> None:
        if not self._running:
            raise FabricError("the simulated fabric is not running (start it with world.run)")

    # -- counting, latency, faults --------------------------------------------------------

    def count_sent(self, mad: bytes) -> None:
        self.counters[mad_key(mad)] += 1

    def count(
        self, mgmt_class: int | None = None, method: int | None = None, attr: int | None = None
    ) -> int:
        """MADs sent on the fabric matching every given criterion (None = any)."""
        return sum(
            n
            for (c, m, a), n in self.counters.items()
            if (mgmt_class is None or c == mgmt_class)
            and (method is None or m == method)
            and (attr is None or a == attr)
        )

    def latency(self, hops: int) -> float:
        return hops * self.link_latency + self.faults.delay

    def send_copies(self, mad: bytes, delay: float, deliver: Callable[[bytes], None]) -> None:
        """``deliver`` each copy the faults leave of ``mad`` (none, one, two; maybe altered)."""
        copies, outcome = self.inject.copies(mad)
        if outcome is not None:
            self.stats[outcome] += 1
        for copy in copies:
            self._scheduler.call_later(delay, deliver, copy)

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        self._scheduler.call_later(delay, callback, *args)

    # -- UD QPs ---------------------------------------------------------------------------

    def create_qp(
        self, port: PortRuntime, pkey_index: int, sink: QpSink, *, qkey: int = ACM_QKEY
    ) -> WorldQp:
        if not 0 <= pkey_index < len(port.pkeys):
            raise FabricError(
                f"{port.name}: P_Key index {pkey_index} outside the {len(port.pkeys)}-entry table"
            )
        if not 0 <= qkey <= 0xFFFFFFFF:
            raise FabricError(f"Q_Key {qkey:#x} does not fit 32 bits")
        device = port.device
        if device.next_qpn > MAX_QPN:
            raise FabricError(f"{device.name}: out of QP numbers")
        qp = WorldQp(device.next_qpn, port, pkey_index, qkey, sink)
        device.next_qpn += 1
        port.qps[qp.qpn] = qp
        return qp

    def rebind_qp(self, qp: WorldQp, port: PortRuntime, pkey_index: int, qkey: int) -> None:
        """A verbs QP's RESET->INIT: it gets its port, P_Key index and Q_Key, keeping its QPN.

        Verbs hands out the QPN at creation, before the port is known (QPNs are per device, so
        a move between ports of one device cannot collide)."""
        if qp.closed:
            raise FabricError("modify of a destroyed QP")
        if port.device is not qp.port.device:
            raise FabricError(f"QP {qp.qpn:#x} cannot move to another device")
        if qp.attachments:
            raise FabricError(f"QP {qp.qpn:#x} is attached to multicast groups")
        if not 0 <= pkey_index < len(port.pkeys):
            raise FabricError(
                f"{port.name}: P_Key index {pkey_index} outside the {len(port.pkeys)}-entry table"
            )
        if not 0 <= qkey <= 0xFFFFFFFF:
            raise FabricError(f"Q_Key {qkey:#x} does not fit 32 bits")
        qp.port.qps.pop(qp.qpn, None)
        qp.port, qp.pkey_index, qp.qkey = port, pkey_index, qkey
        qp.__post_init__()
        port.qps[qp.qpn] = qp

    def destroy_qp(self, qp: WorldQp) -> None:
        if qp.closed:
            return
        qp.closed = True
        for mgid, mlid in list(qp.attachments):
            self.detach(qp, mgid, mlid)
        qp.port.qps.pop(qp.qpn, None)

    def attach(self, qp: WorldQp, mgid: bytes, mlid: int) -> None:
        _check_mcast(mgid, mlid)
        if qp.closed:
            raise FabricError("attach on a destroyed QP")
        qp.attachments.add((bytes(mgid), mlid))
        self._attached.setdefault(mlid, {})[qp] = bytes(mgid)

    def detach(self, qp: WorldQp, mgid: bytes, mlid: int) -> None:
        _check_mcast(mgid, mlid)
        if (bytes(mgid), mlid) not in qp.attachments:
            raise FabricError(f"QP {qp.qpn:#x} is not attached to that MGID/MLID {mlid:#x}")
        qp.attachments.discard((bytes(mgid), mlid))
        attached = self._attached.get(mlid)
        if attached is not None:
            attached.pop(qp, None)
            if not attached:
                del self._attached[mlid]

    # -- sending --------------------------------------------------------------------------

    def ud_send(self, qp: WorldQp, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        """Post one MAD from ``qp``; errors are raised at once (the send completion)."""
        self.require_running()
        if qp.closed:
            raise FabricError(f"send on destroyed QP {qp.qpn:#x}")
        port = qp.port
        if not port.active:
            raise PortDownError(f"{port.name} is {port.state.name}")
        if len(mad) != MAD_SIZE:
            raise FabricError(f"a UD MAD must be {MAD_SIZE} bytes, got {len(mad)}")
        if not 0 <= av.sgid_index < 1:
            raise FabricError(f"{port.name}: GID index {av.sgid_index} is not in the GID table")
        if not 0 <= remote_qpn <= MAX_QPN:
            raise FabricError(f"remote QPN {remote_qpn:#x} does not fit 24 bits")
        mad = bytes(mad)
        self.count_sent(mad)
        slid = port.lid | (av.src_path_bits & ((1 << port.lmc) - 1))
        if remote_qpn == MULTICAST_QPN:
            self._multicast(qp, mad, av, slid)
        else:
            self._unicast(qp, mad, av, slid, remote_qpn)

    def _multicast(self, qp: WorldQp, mad: bytes, av: AddressVector, slid: int) -> None:
        if not MLID_FIRST <= av.dlid <= MLID_LAST:
            raise FabricError(f"multicast send needs a multicast DLID, got {av.dlid:#x}")
        group = self.groups.by_mlid.get(av.dlid)
        dgid = av.dgid
        if group is None or group.mgid != dgid:
            self.stats["mcast_no_group"] += 1
            return
        attached = self._attached.get(av.dlid)
        if not attached:
            return
        # The hot path of a multicast storm: plain lookups, one batch per hop count.
        router = self.router
        sender = qp.port
        members = group.members
        table = router.switch_distances(sender.switch) if sender.switch else None
        s_qkey, s_base, s_full = qp.qkey, qp.pkey_base, qp.pkey_full
        sgid, src_qpn = sender.gid0, qp.qpn
        batches: dict[int, list[tuple[WorldQp, ReceivedMad]]] = {}
        shared: dict[int, ReceivedMad] = {}
        qkey_drops = pkey_drops = 0
        for receiver, mgid in attached.items():
            rport = receiver.port
            member = members.get(rport.guid)
            if mgid != dgid or member is None or not member.join_state & _RECEIVING:
                continue  # the switches do not forward the group to this port
            if receiver.qkey != s_qkey:
                qkey_drops += 1
                continue
            if receiver.pkey_base != s_base or not (s_full or receiver.pkey_full):
                pkey_drops += 1
                continue
            if rport is sender:
                hops = 0
            elif table is not None and rport.switch is not None:
                entry = table.get(rport.switch)
                if entry is None:
                    continue
                hops = entry[0] + 2
            else:
                path = router.path(sender.guid, rport.guid)
                if path is None:
                    continue
                hops = path.hops
            received = shared.get(receiver.pkey_index)
            if received is None:  # one immutable record per P_Key index, shared by receivers
                received = ReceivedMad(mad, sgid, dgid, slid, src_qpn, 0, receiver.pkey_index)
                shared[receiver.pkey_index] = received
            batches.setdefault(hops, []).append((receiver, received))
        if qkey_drops:
            self.stats["qkey_drop"] += qkey_drops
        if pkey_drops:
            self.stats["pkey_drop"] += pkey_drops
        for hops, items in batches.items():
            self._dispatch_ud(items, self.latency(hops))

    def _unicast(
        self, qp: WorldQp, mad: bytes, av: AddressVector, slid: int, remote_qpn: int
    ) -> None:
        target = self.directory.lid_owner(av.dlid)
        if not isinstance(target, PortRuntime):
            self.stats["no_route"] += 1
            return
        receiver = target.qps.get(remote_qpn)
        if receiver is None:
            # QP1 (GSI) has no agent for class 0x2C, other numbers no QP: the HCA drops it.
            self.stats["gsi_drop" if remote_qpn == GSI_QPN else "no_qp"] += 1
            return
        if receiver.qkey != qp.qkey:
            self.stats["qkey_drop"] += 1
            return
        if not pkey_shared(qp.pkey, receiver.pkey):
            self.stats["pkey_drop"] += 1
            return
        path = self.router.path(qp.port.guid, target.guid)
        if path is None:
            self.stats["no_route"] += 1
            return
        bits = av.dlid & ((1 << target.lmc) - 1)
        received = ReceivedMad(mad, qp.port.gid0, av.dgid, slid, qp.qpn, bits, receiver.pkey_index)
        self._dispatch_ud([(receiver, received)], self.latency(path.hops))

    def _dispatch_ud(self, items: list[tuple[WorldQp, ReceivedMad]], delay: float) -> None:
        if self.faults.alters_transmissions:
            fated: list[tuple[WorldQp, ReceivedMad]] = []
            for receiver, received in items:
                copies, outcome = self.inject.copies(received.mad)
                if outcome is not None:
                    self.stats[outcome] += 1
                for copy in copies:
                    fated.append(
                        (
                            receiver,
                            received if copy is received.mad else replace(received, mad=copy),
                        )
                    )
            items = fated
        if items:
            self._scheduler.call_later(delay, self._deliver_batch, items)

    def _deliver_batch(self, items: list[tuple[WorldQp, ReceivedMad]]) -> None:
        delivered = 0
        stats = self.stats
        for receiver, received in items:
            if receiver.closed:
                stats["closed_qp_drop"] += 1
            elif receiver.port.state != PortState.ACTIVE:
                stats["port_down_drop"] += 1
            elif receiver.sink.deliver(received):
                delivered += 1
            else:
                stats["rnr_drop"] += 1
        stats["delivered"] += delivered


def _check_mcast(mgid: bytes, mlid: int) -> None:
    if len(mgid) != 16 or mgid[0] != 0xFF:
        raise FabricError("an MGID is 16 bytes starting with 0xff")
    if not MLID_FIRST <= mlid <= MLID_LAST:
        raise FabricError(f"MLID {mlid:#x} is outside {MLID_FIRST:#x}..{MLID_LAST:#x}")

"""Event subscriptions at the simulated SA (InformInfo) and the Reports they lead to.

As OpenSM keeps them: InformInfo SET with Subscribe 1 adds (or updates) the requester's
subscription, 0 removes it (REQ_INVALID when there is none, Subscribe echoed as 0); either
is answered with GetResp echoing the InformInfo. Security traps 256..259 need an SM_Key; a
GID must name a known port. ``reports(trap, guid, issuer)`` builds the SubnAdmReport for
every subscriber that wants the notice; each stays in ``unacked`` until the subscriber's
ReportResp (same TID) arrives, and the SA transport sends it again meanwhile. A port that
leaves the subnet loses its subscriptions (``forget_port``), and a new SM starts with none.
"""

from __future__ import annotations

from dataclasses import replace

from ibacm.fabric.sim.sa_view import SaEndpoint, SaFabric, common_pkey, gid_port, invalid
from ibacm.fabric.sim.topo_file.model import gid_of
from ibacm.wire.errors import WireError
from ibacm.wire.mad import MadHeader, SaAttr, SaMad
from ibacm.wire.notice import INFORM_INFO_LEN, InformInfo, Notice, Trap, build_report

_SECURITY_TRAPS = range(256, 260)
"""Traps a subscriber needs an SM_Key for (C15-0.2-1.16, as OpenSM enforces)."""


class Subscriptions:
    """See the module docstring."""

    def __init__(self, fabric: SaFabric) -> None:
        self.fabric = fabric
        self.subscriptions: dict[tuple[int, bytes], InformInfo] = {}
        """(subscriber port GUID, the InformInfo as compared) -> the subscription."""
        self.unacked: dict[int, int] = {}
        """Reports sent and not acknowledged yet: TID -> the subscriber's port GUID."""
        self._report_tid = 0

    def inform(self, requester: SaEndpoint, request: SaMad) -> tuple[InformInfo, bool]:
        """An InformInfo SET: the InformInfo asked for, and whether it was done (else it is
        refused with Subscribe 0). Raises ``SaFail`` for a request that is invalid as such."""
        try:
            info = InformInfo.decode(request.data[:INFORM_INFO_LEN])
        except WireError:
            raise invalid() from None  # e.g. IsGeneric neither 0 nor 1
        if info.subscribe > 1:
            raise invalid()
        if request.sa.sm_key == 0 and info.is_generic and info.trap_num in _SECURITY_TRAPS:
            raise invalid()
        # OpenSM compares subscriptions without the QPN (it keeps the requester's).
        key = (requester.guid, replace(info, subscribe=1, qpn=0).encode())
        if info.subscribe:
            if any(info.gid) and gid_port(self.fabric, info.gid) is None:
                return info, False
            self.subscriptions[key] = info
        elif self.subscriptions.pop(key, None) is None:
            return info, False
        return info, True

    def reports(self, trap: Trap, guid: int, issuer: SaEndpoint) -> list[tuple[int, bytes]]:
        """The SubnAdmReport of trap 64..67 about port ``guid`` for every subscriber that
        wants it (one per subscriber), as (subscriber GUID, MAD); each waits in ``unacked``."""
        prefix = self.fabric.subnet_prefix
        gid = gid_of(prefix, guid)
        notice = Notice.gid_trap(
            trap,
            gid,
            issuer_lid=issuer.lid,
            issuer_gid=gid_of(prefix, issuer.guid),
        )
        subject = self.fabric.endpoint_by_guid(guid)
        subject_pkeys = subject.pkeys if subject is not None else ()
        wanting = {
            subscriber
            for (subscriber, _key), info in self.subscriptions.items()
            if info.matches(notice) and _covers(info, gid, subject)
        }
        out: list[tuple[int, bytes]] = []
        for subscriber in sorted(wanting):
            port = self.fabric.endpoint_by_guid(subscriber)
            if port is None or subscriber == guid:
                continue
            if subject_pkeys and common_pkey(port.pkeys, subject_pkeys) is None:
                continue  # OpenSM reports GIDs only to ports of a shared partition
            self._report_tid = (self._report_tid + 1) & 0xFFFFFFFF or 1
            mad = build_report(self._report_tid, notice)
            self.unacked[self._report_tid] = subscriber
            out.append((subscriber, mad))
        return out

    def acknowledged(self, requester: SaEndpoint, header: MadHeader) -> None:
        """A ReportResp: the Report of that TID to that subscriber is not sent again."""
        if header.attr_id != SaAttr.NOTICE:
            return
        tid = header.tid & 0xFFFFFFFF
        if self.unacked.get(tid) == requester.guid:
            del self.unacked[tid]

    def forget_port(self, guid: int) -> None:
        """A port left the subnet: its subscriptions and pending Reports go (OpenSM's drop
        manager removes them; the port subscribes again when it comes back)."""
        for key in [k for k in self.subscriptions if k[0] == guid]:
            del self.subscriptions[key]
        for tid in [t for t, subscriber in self.unacked.items() if subscriber == guid]:
            del self.unacked[tid]

    def forget_all(self) -> None:
        """A new SM: it knows no subscriptions and owes no Reports."""
        self.subscriptions.clear()
        self.unacked.clear()


def _covers(info: InformInfo, gid: bytes, subject: SaEndpoint | None) -> bool:
    """Whether a subscription's GID or LID range takes in the port the notice is about."""
    if any(info.gid):
        return info.gid[8:] == gid[8:]
    if info.lid_range_begin == 0xFFFF:
        return True
    if subject is None:
        return False
    end = info.lid_range_end or info.lid_range_begin
    return info.lid_range_begin <= subject.lid <= end

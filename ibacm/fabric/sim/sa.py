"""The simulated Subnet Administrator: PathRecord and MCMemberRecord, answered like OpenSM.

``SubnetAdministrator.handle`` takes one request MAD (bytes) and the requester's port and
returns the response MADs (one, or several RMPP segments for a GetTable), built with the
project codecs. The rules follow what OpenSM does (checked against OpenSM on ibsim; the
recorded answers are test fixtures): PathRecord GET returns the first matching path or status
NO_RECORDS, with reversible set, numb_path 0, MTU/rate the path minimum and selector 2, packet
lifetime the subnet timeout (0 for loopback); MCMemberRecord SET creates a group on the first
full-member join (MLID from 0xC000 up), later joiners must match Q_Key/P_Key/TClass/SL/flow/
hop and the MTU/rate selectors and be able to carry the group's MTU and rate, else status
REQ_INVALID; IPoIB groups other than a partition's broadcast group are only created when that
broadcast group exists and their components match it; DELETE removes the member and the group
with its last full member. Unknown attributes or methods get generic status 0x000C.

Event subscriptions as OpenSM keeps them: InformInfo SET with Subscribe 1 adds (or updates)
the requester's subscription, 0 removes it (REQ_INVALID when there is none, Subscribe echoed
as 0); either is answered with GetResp echoing the InformInfo. Security traps 256..259 need an
SM_Key; a GID must name a known port. ``reports(trap, gid)`` builds the SubnAdmReport for
every subscriber that wants the notice; each stays in ``unacked`` until the subscriber's
ReportResp (same TID) arrives, and the world sends it again meanwhile. A port that leaves the
subnet loses its subscriptions (``forget_port``), and a new SM starts with none.
"""

from __future__ import annotations

import struct
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from types import SimpleNamespace
from typing import Protocol

from ibacm.fabric.sim.multicast import (
    IPOIB_QKEY,
    IPOIB_SIGNATURES,
    JOIN_FULL,
    JOIN_SEND_ONLY_FULL,
    GroupTable,
    McGroup,
    Member,
    ipoib_broadcast_mgid,
    mgid_signature,
)
from ibacm.fabric.sim.routing import Router
from ibacm.wire.errors import WireError
from ibacm.wire.mad import (
    MAD_SIZE,
    MC_MEMBER_RECORD_LEN,
    SA_DATA_LEN,
    MadHeader,
    MadStatus,
    McComp,
    McMemberRecord,
    Method,
    SaAttr,
    SaMad,
    SaStatus,
    build_sa_response,
    sa_status_word,
    split_rmpp,
)
from ibacm.wire.notice import (
    INFORM_INFO_LEN,
    InformInfo,
    Notice,
    Trap,
    build_report,
)
from ibacm.wire.path_record import (
    PATH_LAYOUT,
    PATH_RECORD_LEN,
    REVERSIBLE_BIT,
    PathComp,
    PathRecord,
)
from ibacm.wire.rates import rate_to_gbps

LINK_LOCAL_PREFIX = 0xFE80000000000000
MAX_PAIRS = 250_000
"""A PathRecord query spanning more source x destination pairs is refused (NO_RESOURCES)."""

_PC = SimpleNamespace(**{name: int(bit) for name, bit in PathComp.__members__.items()})
"""PathComp bits as plain ints: ``int & IntFlag`` is slow, and a GetTable tests N^2 pairs."""
_JOIN_MASK = McComp.MGID | McComp.PORT_GID | McComp.JOIN_STATE
_CREATE_MASK = (
    _JOIN_MASK | McComp.QKEY | McComp.TCLASS | McComp.PKEY | McComp.FLOW_LABEL | McComp.SL
)
_RATES_BY_SPEED = sorted((rate_to_gbps(r), r) for r in range(2, 26))
_SECURITY_TRAPS = range(256, 260)
"""Traps a subscriber needs an SM_Key for (C15-0.2-1.16, as OpenSM enforces)."""


class SaEndpoint(Protocol):
    """What the SA knows about a LID-addressable port (HCA port or switch port 0)."""

    @property
    def guid(self) -> int: ...
    @property
    def lid(self) -> int: ...
    @property
    def lmc(self) -> int: ...
    @property
    def pkeys(self) -> tuple[int, ...]: ...
    @property
    def mtu_cap(self) -> int: ...
    @property
    def rate(self) -> int: ...


class SaFabric(Protocol):
    """The subnet as the SM sees it (only ACTIVE ports are part of it)."""

    @property
    def subnet_prefix(self) -> int: ...
    @property
    def subnet_timeout(self) -> int: ...
    @property
    def router(self) -> Router: ...
    def endpoint_by_lid(self, lid: int) -> SaEndpoint | None: ...
    def endpoint_by_guid(self, guid: int) -> SaEndpoint | None: ...
    def endpoints(self) -> Sequence[SaEndpoint]:
        """Every active endpoint in LID order."""
        ...


class _SaFail(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"SA status {status:#06x}")
        self.status = status


def _invalid() -> _SaFail:
    return _SaFail(sa_status_word(SaStatus.REQ_INVALID))


def _gid(prefix: int, guid: int) -> bytes:
    return prefix.to_bytes(8, "big") + guid.to_bytes(8, "big")


def pkey_shared(a: int, b: int) -> bool:
    """Same partition (low 15 bits, non-zero) and at least one full member."""
    return (a & 0x7FFF) == (b & 0x7FFF) and a & 0x7FFF != 0 and bool((a | b) & 0x8000)


def _has_pkey(pkeys: Iterable[int], pkey: int) -> bool:
    return any((p & 0x7FFF) == (pkey & 0x7FFF) and p & 0x7FFF for p in pkeys)


def _rate_gbps(rate: int) -> float:
    try:
        return rate_to_gbps(rate)
    except WireError:
        return 0.0


class SubnetAdministrator:
    """See the module docstring."""

    def __init__(self, fabric: SaFabric) -> None:
        self.fabric = fabric
        self.groups = GroupTable()
        self.subscriptions: dict[tuple[int, bytes], InformInfo] = {}
        """(subscriber port GUID, the InformInfo as compared) -> the subscription."""
        self.unacked: dict[int, int] = {}
        """Reports sent and not acknowledged yet: TID -> the subscriber's port GUID."""
        self._report_tid = 0
        self._mgid_counter = 0
        self.records_sent: Counter[int] = Counter()
        """Records answered, by SA attribute: what the SA pays (a GetTable of N paths is N)."""

    def create_ipoib_groups(self, pkeys: Iterable[int], *, mtu: int = 4, rate: int = 3) -> None:
        """The IPoIB broadcast group of each partition, as OpenSM creates them at start."""
        for pkey in sorted({p | 0x8000 for p in pkeys if p & 0x7FFF}):
            mgid = ipoib_broadcast_mgid(pkey)
            if mgid in self.groups.by_mgid:
                continue
            mlid = self.groups.allocate_mlid()
            if mlid is None:
                return
            self.groups.add(
                McGroup(
                    mgid=mgid,
                    mlid=mlid,
                    qkey=IPOIB_QKEY,
                    pkey=pkey,
                    mtu=mtu,
                    rate=rate,
                    packet_life=self.fabric.subnet_timeout,
                    scope_state=0x20,
                    well_known=True,
                )
            )

    # -- entry point ----------------------------------------------------------------------

    def handle(self, requester: SaEndpoint, mad: bytes) -> list[bytes]:
        """Answer one request MAD; [] when it deserves no answer (garbage or a response)."""
        if len(mad) != MAD_SIZE:
            return []
        try:
            request = SaMad.decode(mad)
        except WireError:
            return []
        if request.mad.method == Method.REPORT_RESP and request.mad.mgmt_class == 0x03:
            self._acknowledged(requester, request.mad)
            return []
        if request.mad.method & Method.RESP or request.mad.mgmt_class != 0x03:
            return []
        try:
            if request.mad.base_version != 1 or request.mad.class_version != 2:
                raise _SaFail(MadStatus.BAD_VERSION)
            return self._dispatch(requester, request)
        except _SaFail as failure:
            return self._error(request, failure.status)

    def busy(self, mad: bytes) -> list[bytes]:
        """The answer of an overloaded SA: the request echoed with MAD status BUSY."""
        try:
            request = SaMad.decode(mad)
        except WireError:
            return []
        if request.mad.method & Method.RESP:
            return []
        return self._error(request, MadStatus.BUSY)

    def _dispatch(self, requester: SaEndpoint, request: SaMad) -> list[bytes]:
        attr, method = request.mad.attr_id, request.mad.method
        if attr == SaAttr.INFORM_INFO and method == Method.SET:
            return self._inform(requester, request)
        if attr == SaAttr.PATH_RECORD and method in (Method.GET, Method.GET_TABLE):
            return self._path_records(requester, request)
        if attr == SaAttr.MC_MEMBER_RECORD:
            if method == Method.SET:
                return self._join(requester, request)
            if method == Method.DELETE:
                return self._leave(requester, request)
            if method in (Method.GET, Method.GET_TABLE):
                return self._mc_query(requester, request)
        raise _SaFail(MadStatus.METHOD_ATTR_UNSUPPORTED)

    # -- event subscriptions --------------------------------------------------------------

    def _inform(self, requester: SaEndpoint, request: SaMad) -> list[bytes]:
        try:
            info = InformInfo.decode(request.data[:INFORM_INFO_LEN])
        except WireError:
            raise _invalid() from None  # e.g. IsGeneric neither 0 nor 1
        if info.subscribe > 1:
            raise _invalid()
        if request.sa.sm_key == 0 and info.is_generic and info.trap_num in _SECURITY_TRAPS:
            raise _invalid()
        # OpenSM compares subscriptions without the QPN (it keeps the requester's).
        key = (requester.guid, replace(info, subscribe=1, qpn=0).encode())
        if info.subscribe:
            if any(info.gid) and self._gid_port(info.gid) is None:
                return self._refused(request, info)
            self.subscriptions[key] = info
        elif self.subscriptions.pop(key, None) is None:
            return self._refused(request, info)
        return self._single(request, info.encode())

    def _refused(self, request: SaMad, info: InformInfo) -> list[bytes]:
        # o13-13.1.1: a refused subscription comes back with Subscribe 0.
        echo = replace(info, subscribe=0).encode()
        status = sa_status_word(SaStatus.REQ_INVALID)
        return [build_sa_response(request, status, echo, Method.GET_RESP, attr_offset=0)]

    def _gid_port(self, gid: bytes) -> SaEndpoint | None:
        if int.from_bytes(gid[:8], "big") not in (self.fabric.subnet_prefix, LINK_LOCAL_PREFIX):
            return None
        return self.fabric.endpoint_by_guid(int.from_bytes(gid[8:], "big"))

    def reports(self, trap: Trap, guid: int, issuer: SaEndpoint) -> list[tuple[int, bytes]]:
        """The SubnAdmReport of trap 64..67 about port ``guid`` for every subscriber that
        wants it (one per subscriber), as (subscriber GUID, MAD); each waits in ``unacked``."""
        gid = _gid(self.fabric.subnet_prefix, guid)
        notice = Notice.gid_trap(
            trap,
            gid,
            issuer_lid=issuer.lid,
            issuer_gid=_gid(self.fabric.subnet_prefix, issuer.guid),
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
            if subject_pkeys and _common_pkey(port.pkeys, subject_pkeys) is None:
                continue  # OpenSM reports GIDs only to ports of a shared partition
            self._report_tid = (self._report_tid + 1) & 0xFFFFFFFF or 1
            mad = build_report(self._report_tid, notice)
            self.unacked[self._report_tid] = subscriber
            out.append((subscriber, mad))
        return out

    def _acknowledged(self, requester: SaEndpoint, header: MadHeader) -> None:
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

    def forget_subscriptions(self) -> None:
        """A new SM: it knows no subscriptions and owes no Reports."""
        self.subscriptions.clear()
        self.unacked.clear()

    # -- responses ------------------------------------------------------------------------

    @staticmethod
    def _reply_method(request: SaMad) -> int:
        # OpenSM answers a SET with GetResp (0x81), everything else with method | 0x80.
        if request.mad.method == Method.SET:
            return int(Method.GET_RESP)
        return request.mad.method | Method.RESP

    def _error(self, request: SaMad, status: int) -> list[bytes]:
        method = self._reply_method(request)
        if method == Method.GET_TABLE_RESP:
            return split_rmpp(build_sa_response(request, status, b"", method, attr_offset=0))
        echo = request.data[:SA_DATA_LEN]  # OpenSM echoes the request's record
        return [build_sa_response(request, status, echo, method, attr_offset=0)]

    def _single(self, request: SaMad, record: bytes) -> list[bytes]:
        self.records_sent[request.mad.attr_id] += 1
        method = self._reply_method(request)
        return [build_sa_response(request, 0, record, method, attr_offset=len(record) // 8)]

    def _table(self, request: SaMad, records: Sequence[bytes], size: int) -> list[bytes]:
        self.records_sent[request.mad.attr_id] += len(records)
        offset = size // 8 if records else 0
        whole = build_sa_response(
            request, 0, b"".join(records), Method.GET_TABLE_RESP, attr_offset=offset
        )
        return split_rmpp(whole)

    def _answer(self, request: SaMad, records: Sequence[bytes], size: int) -> list[bytes]:
        if request.mad.method == Method.GET_TABLE:
            return self._table(request, records, size)
        if not records:
            raise _SaFail(sa_status_word(SaStatus.NO_RECORDS))
        if len(records) > 1:
            raise _SaFail(sa_status_word(SaStatus.TOO_MANY_RECORDS))
        return self._single(request, records[0])

    # -- PathRecord -----------------------------------------------------------------------

    def _path_records(self, requester: SaEndpoint, request: SaMad) -> list[bytes]:
        path = PathRecord.decode(request.data[:PATH_RECORD_LEN])
        comp = request.sa.comp_mask
        self._check_path_request(path, comp)
        if comp & _PC.DGID and path.dgid[0] == 0xFF:
            return self._answer(request, self._multicast_path(path, requester), PATH_RECORD_LEN)
        sources = self._ends(comp, _PC.SGID, _PC.SLID, path.sgid, path.slid)
        targets = self._ends(comp, _PC.DGID, _PC.DLID, path.dgid, path.dlid)
        if len(sources) * len(targets) > MAX_PAIRS:
            raise _SaFail(sa_status_word(SaStatus.NO_RESOURCES))
        if request.mad.method == Method.GET:
            for src in sources:
                for dst in targets:
                    record = self._pair(path, comp, src, dst)
                    if record is not None:
                        return self._single(request, record.encode())
            raise _SaFail(sa_status_word(SaStatus.NO_RECORDS))
        records: list[bytes] = []
        for src in sources:
            records += self._table_from(path, comp, src, targets)
        return self._answer(request, records, PATH_RECORD_LEN)

    @staticmethod
    def _check_path_request(path: PathRecord, comp: int) -> None:
        if comp & _PC.RATE_SELECTOR and comp & _PC.RATE and not _rate_gbps(path.rate):
            raise _invalid()
        if comp & _PC.MTU_SELECTOR and comp & _PC.MTU and not 1 <= path.mtu <= 5:
            raise _invalid()
        service = comp & _PC.SERVICE_ID
        if service and service != _PC.SERVICE_ID:
            raise _SaFail(sa_status_word(SaStatus.REQ_INSUFFICIENT_COMPONENTS))

    def _ends(
        self, comp: int, gid_bit: int, lid_bit: int, gid: bytes, lid: int
    ) -> Sequence[SaEndpoint]:
        fabric = self.fabric
        by_gid = by_lid = None
        if comp & gid_bit:
            prefix = int.from_bytes(gid[:8], "big")
            if prefix not in (fabric.subnet_prefix, LINK_LOCAL_PREFIX):
                return []  # OpenSM: invalid GID, answered as "no records"
            by_gid = fabric.endpoint_by_guid(int.from_bytes(gid[8:], "big"))
            if by_gid is None:
                return []
        if comp & lid_bit:
            by_lid = fabric.endpoint_by_lid(lid)
            if by_lid is None:
                return []
        if by_gid is not None and by_lid is not None and by_gid is not by_lid:
            raise _invalid()
        chosen = by_gid or by_lid
        return [chosen] if chosen is not None else fabric.endpoints()

    def _pair(
        self, path: PathRecord, comp: int, src: SaEndpoint, dst: SaEndpoint
    ) -> PathRecord | None:
        params = self._params(path, comp, src, dst)
        if params is None:
            return None
        mtu, rate, life, pkey = params
        reversible = self._params(path, comp, dst, src) is not None
        if comp & _PC.REVERSIBLE and path.reversible and not reversible:
            return None
        prefix = self.fabric.subnet_prefix
        return PathRecord(
            dgid=_gid(prefix, dst.guid),
            sgid=path.sgid if comp & _PC.SGID else _gid(prefix, src.guid),
            dlid=path.dlid if comp & _PC.DLID else dst.lid,
            slid=path.slid if comp & _PC.SLID else src.lid,
            reversible=reversible,
            pkey=pkey,
            sl=path.sl if comp & _PC.SL else 0,
            mtu_selector=2,
            mtu=mtu,
            rate_selector=2,
            rate=rate,
            packet_life_selector=2,
            packet_life=0 if src is dst else life,
        )

    def _table_from(
        self, path: PathRecord, comp: int, src: SaEndpoint, targets: Sequence[SaEndpoint]
    ) -> list[bytes]:
        """``self._pair(path, comp, src, dst).encode()`` for every ``dst`` that has a path,
        with everything that does not depend on ``dst`` worked out once: a GetTable of one
        source answers N pairs.

        Without MTU or rate selectors in ``comp`` a path is reversible whenever it exists:
        reachability and partition sharing are symmetric, and the packet lifetime does not
        depend on the direction. With selectors, the reverse direction is checked as in
        ``_pair``.
        """
        life = _select_life(path, comp, self.fabric.subnet_timeout)
        if life is None:
            return []
        selectors = bool(
            (comp & _PC.MTU_SELECTOR and comp & _PC.MTU)
            or (comp & _PC.RATE_SELECTOR and comp & _PC.RATE)
        )
        prefix = self.fabric.subnet_prefix.to_bytes(8, "big")
        sgid = path.sgid if comp & _PC.SGID else prefix + src.guid.to_bytes(8, "big")
        slid = path.slid if comp & _PC.SLID else src.lid
        fixed_dlid = path.dlid if comp & _PC.DLID else None
        sl = path.sl if comp & _PC.SL else 0
        wants_reversible = bool(comp & _PC.REVERSIBLE and path.reversible)
        pkey_of = self._pkey_chooser(path, comp, src)
        infos = self.fabric.router.bottlenecks_from(src.guid, [dst.guid for dst in targets])
        pack = PATH_LAYOUT.pack
        reserved = bytes(6)
        records = []
        for dst, info in zip(targets, infos, strict=True):
            if info is None:
                continue
            mtu, rate = info
            reversible = True
            if selectors:
                chosen_mtu = _select_mtu(path, comp, mtu)
                chosen_rate = _select_rate(path, comp, rate)
                if chosen_mtu is None or chosen_rate is None:
                    continue
                mtu, rate = chosen_mtu, chosen_rate
                reversible = self._params(path, comp, dst, src) is not None
            pkey = pkey_of(dst.pkeys)
            if pkey is None or (wants_reversible and not reversible):
                continue
            try:
                record = pack(
                    0,
                    prefix + dst.guid.to_bytes(8, "big"),
                    sgid,
                    dst.lid if fixed_dlid is None else fixed_dlid,
                    slid,
                    0,
                    0,
                    REVERSIBLE_BIT if reversible else 0,
                    pkey,
                    sl,
                    0x80 | mtu,
                    0x80 | rate,
                    0x80 | (0 if src is dst else life),
                    0,
                    reserved,
                )
            except struct.error:
                # A value out of range: the record codec reports it as the per-pair path does.
                pair = self._pair(path, comp, src, dst)
                record = pair.encode() if pair is not None else b""
            if record:
                records.append(record)
        return records

    @staticmethod
    def _pkey_chooser(
        path: PathRecord, comp: int, src: SaEndpoint
    ) -> Callable[[tuple[int, ...]], int | None]:
        """The P_Key ``_params`` gives a pair as a function of the destination's P_Key table
        (memoized: most ports share one table)."""
        chosen: dict[tuple[int, ...], int | None] = {}
        mine = src.pkeys

        def choose(theirs: tuple[int, ...]) -> int | None:
            try:
                return chosen[theirs]
            except KeyError:
                pass
            if comp & _PC.PKEY:
                pkey = path.pkey if _ports_share(mine, theirs, path.pkey) else None
            else:
                pkey = _common_pkey(mine, theirs)
            chosen[theirs] = pkey
            return pkey

        return choose

    def _params(
        self, path: PathRecord, comp: int, src: SaEndpoint, dst: SaEndpoint
    ) -> tuple[int, int, int, int] | None:
        info = self.fabric.router.path(src.guid, dst.guid)
        if info is None:
            return None
        mtu = _select_mtu(path, comp, info.mtu)
        rate = _select_rate(path, comp, info.rate)
        life = _select_life(path, comp, self.fabric.subnet_timeout)
        if mtu is None or rate is None or life is None:
            return None
        if comp & _PC.PKEY:
            if not _ports_share(src.pkeys, dst.pkeys, path.pkey):
                return None
            pkey = path.pkey
        else:
            common = _common_pkey(src.pkeys, dst.pkeys)
            if common is None:
                return None
            pkey = common
        return mtu, rate, life, pkey

    def _multicast_path(self, path: PathRecord, requester: SaEndpoint) -> list[bytes]:
        group = self.groups.by_mgid.get(path.dgid)
        if group is None:
            return []
        record = PathRecord.decode(path.encode())
        record.dgid, record.dlid, record.tclass = group.mgid, group.mlid, group.tclass
        record.reversible, record.numb_path, record.pkey = False, 1, group.pkey
        record.mtu_selector, record.mtu = 2, group.mtu
        record.rate_selector, record.rate = 2, group.rate
        record.packet_life_selector, record.packet_life = 2, group.packet_life
        record.sl, record.qos_class = group.sl, 0
        scope = group.mgid[1] & 0xF
        record.raw_traffic, record.flow_reserved = False, 0
        record.flow_label = group.flow_label
        record.hop_limit = group.hop_limit if scope == 2 else 0xFF
        return [record.encode()]

    # -- MCMemberRecord -------------------------------------------------------------------

    def _member_port(self, record: McMemberRecord) -> SaEndpoint:
        prefix = int.from_bytes(record.port_gid[:8], "big")
        if prefix not in (self.fabric.subnet_prefix, LINK_LOCAL_PREFIX):
            raise _SaFail(sa_status_word(SaStatus.REQ_INVALID_GID))
        port = self.fabric.endpoint_by_guid(int.from_bytes(record.port_gid[8:], "big"))
        if port is None:
            raise _invalid()
        return port

    def _join(self, requester: SaEndpoint, request: SaMad) -> list[bytes]:
        comp = request.sa.comp_mask
        record = McMemberRecord.decode(request.data[:MC_MEMBER_RECORD_LEN])
        if comp & _JOIN_MASK != _JOIN_MASK:
            raise _SaFail(sa_status_word(SaStatus.REQ_INSUFFICIENT_COMPONENTS))
        port = self._member_port(record)
        proxy = port is not requester
        if proxy and _common_pkey(port.pkeys, requester.pkeys) is None:
            raise _invalid()
        if comp & McComp.PKEY and not record.pkey & 0x7FFF:
            raise _invalid()
        group = self.groups.by_mgid.get(record.mgid) if any(record.mgid) else None
        created = group is None
        if group is None:
            group = self._create(record, comp, port)
        elif not _other_fields_match(record, comp, group):
            raise _invalid()
        try:
            if (
                not _more_fields_match(record, comp, group)
                or not self._port_carries(port, group)
                or record.join_state == 0
                or not _has_pkey(port.pkeys, group.pkey)
            ):
                raise _invalid()
            member = group.members.get(port.guid)
            if member is not None and not member.proxy and requester is not port:
                raise _invalid()
            if member is not None and member.proxy and not _has_pkey(requester.pkeys, group.pkey):
                raise _invalid()
        except _SaFail:
            if created:
                self.groups.remove(group)
            raise
        if member is None:
            member = Member(port.guid, record.port_gid, 0, proxy)
            group.members[port.guid] = member
        member.join_state |= record.join_state
        reply = McMemberRecord.decode(record.encode())
        _fill_from_group(reply, group)
        reply.scope, reply.join_state = record.scope, member.join_state
        return self._single(request, reply.encode())

    def _create(self, record: McMemberRecord, comp: int, port: SaEndpoint) -> McGroup:
        if not record.join_state & (JOIN_FULL | JOIN_SEND_ONLY_FULL):
            raise _invalid()
        if comp & _CREATE_MASK != _CREATE_MASK:
            raise _SaFail(sa_status_word(SaStatus.REQ_INSUFFICIENT_COMPONENTS))
        mgid = record.mgid if any(record.mgid) else self._new_mgid(record, comp)
        self._check_requested_mgid(mgid, record, comp)
        mtu = _realizable_mtu(record, comp, port.mtu_cap)
        rate = _realizable_rate(record, comp, port.rate)
        if mtu is None or rate is None:
            raise _invalid()
        mlid = self.groups.allocate_mlid()
        if mlid is None:
            raise _SaFail(sa_status_word(SaStatus.NO_RESOURCES))
        return self.groups.add(
            McGroup(
                mgid=mgid,
                mlid=mlid,
                qkey=record.qkey,
                pkey=record.pkey,
                mtu=mtu,
                rate=rate,
                packet_life=record.packet_life,
                tclass=record.tclass,
                sl=record.sl,
                flow_label=record.flow_label,
                hop_limit=record.hop_limit,
                scope_state=record.scope_join,
            )
        )

    def _new_mgid(self, record: McMemberRecord, comp: int) -> bytes:
        scope = record.scope if comp & McComp.SCOPE else 2
        prefix = self.fabric.subnet_prefix.to_bytes(8, "big")
        while True:
            self._mgid_counter = (self._mgid_counter + 1) & 0xFFFFFFFF
            head = bytes((0xFF, 0x10 | scope, 0xA0, 0x1B)) + prefix[:6]
            mgid = head + self._mgid_counter.to_bytes(4, "big") + bytes(2)
            if mgid not in self.groups.by_mgid:
                return mgid

    def _check_requested_mgid(self, mgid: bytes, record: McMemberRecord, comp: int) -> None:
        if mgid[0] != 0xFF:
            raise _invalid()
        signature = mgid_signature(mgid)
        if signature in IPOIB_SIGNATURES:
            broadcast = ipoib_broadcast_mgid(int.from_bytes(mgid[4:6], "big"), mgid[1] & 0xF)
            if signature != 0x401B or mgid != broadcast:
                parent = self.groups.by_mgid.get(broadcast)
                if parent is None or not _other_fields_match(record, comp, parent):
                    raise _invalid()
            return
        if mgid[1] & 0xE0:
            raise _invalid()
        if signature == 0xA01B and mgid[1] & 0xF == 2:
            raise _invalid()

    def _port_carries(self, port: SaEndpoint, group: McGroup) -> bool:
        return port.mtu_cap >= group.mtu and _rate_gbps(port.rate) >= _rate_gbps(group.rate)

    def _leave(self, requester: SaEndpoint, request: SaMad) -> list[bytes]:
        comp = request.sa.comp_mask
        record = McMemberRecord.decode(request.data[:MC_MEMBER_RECORD_LEN])
        if comp & _JOIN_MASK != _JOIN_MASK:
            raise _SaFail(sa_status_word(SaStatus.REQ_INSUFFICIENT_COMPONENTS))
        prefix = int.from_bytes(record.port_gid[:8], "big")
        if prefix not in (self.fabric.subnet_prefix, LINK_LOCAL_PREFIX):
            raise _SaFail(sa_status_word(SaStatus.REQ_INVALID_GID))
        group = self.groups.by_mgid.get(record.mgid)
        if group is None:
            raise _invalid()
        member = group.members.get(int.from_bytes(record.port_gid[8:], "big"))
        leaving = record.join_state
        if (
            member is None
            or not leaving & member.join_state
            or leaving | member.join_state != member.join_state
        ):
            raise _invalid()
        port = self.fabric.endpoint_by_guid(member.port_guid)
        if not member.proxy and port is not requester:
            raise _invalid()
        if member.proxy and not _has_pkey(requester.pkeys, group.pkey):
            raise _invalid()
        member.join_state &= ~leaving
        if not member.join_state:
            del group.members[member.port_guid]
        self.groups.drop_if_unused(group)
        reply = McMemberRecord.decode(record.encode())
        reply.mtu_selector = reply.rate_selector = reply.packet_life_selector = 2
        reply.join_state = member.join_state
        return self._single(request, reply.encode())

    def _mc_query(self, requester: SaEndpoint, request: SaMad) -> list[bytes]:
        comp = request.sa.comp_mask
        query = McMemberRecord.decode(request.data[:MC_MEMBER_RECORD_LEN])
        trusted = request.sa.sm_key != 0
        found: list[bytes] = []
        for mgid in sorted(self.groups.by_mgid):
            group = self.groups.by_mgid[mgid]
            for reply in _query_matches(query, comp, group, requester, trusted):
                if not trusted:
                    reply.port_gid, reply.join_state, reply.proxy_join = bytes(16), 0, False
                found.append(reply.encode())
        return self._answer(request, found, MC_MEMBER_RECORD_LEN)


# -- helpers ------------------------------------------------------------------------------


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


def _select_mtu(path: PathRecord, comp: int, mtu: int) -> int | None:
    if not (comp & _PC.MTU_SELECTOR and comp & _PC.MTU):
        return mtu
    wanted, selector = path.mtu, path.mtu_selector
    if selector == 0:
        return mtu if mtu > wanted else None
    if selector == 1:
        if mtu < wanted:
            return mtu
        return wanted - 1 if wanted > 1 else None
    if selector == 2:
        return wanted if mtu >= wanted else None
    return mtu


def _select_rate(path: PathRecord, comp: int, rate: int) -> int | None:
    if not (comp & _PC.RATE_SELECTOR and comp & _PC.RATE):
        return rate
    have, wanted = _rate_gbps(rate), _rate_gbps(path.rate)
    selector = path.rate_selector
    if selector == 0:
        return rate if have > wanted else None
    if selector == 1:
        if have < wanted:
            return rate
        lower = [r for gbps, r in _RATES_BY_SPEED if gbps < wanted]
        return lower[-1] if lower else None
    if selector == 2:
        return path.rate if have == wanted else None
    return rate


def _select_life(path: PathRecord, comp: int, life: int) -> int | None:
    if not (comp & _PC.PACKET_LIFE_SELECTOR and comp & _PC.PACKET_LIFE):
        return life
    wanted, selector = path.packet_life, path.packet_life_selector
    if selector == 0:
        return life if life > wanted else None
    if selector == 1:
        if life < wanted:
            return life
        return wanted - 1 if wanted > 1 else None
    if selector == 2:
        return wanted if life >= wanted else None
    return life


def _ports_share(src: Sequence[int], dst: Sequence[int], pkey: int) -> bool:
    """Both ports hold the partition of ``pkey`` and at least one of them as a full member."""
    mine = [p for p in src if (p & 0x7FFF) == (pkey & 0x7FFF) and p & 0x7FFF]
    theirs = [p for p in dst if (p & 0x7FFF) == (pkey & 0x7FFF) and p & 0x7FFF]
    return any((a | b) & 0x8000 for a in mine for b in theirs)


def _common_pkey(src: Sequence[int], dst: Sequence[int]) -> int | None:
    for a in src:
        for b in dst:
            if pkey_shared(a, b):
                return a
    return None


def _other_fields_match(record: McMemberRecord, comp: int, group: McGroup) -> bool:
    """OpenSM's join validation: Q_Key, P_Key, TClass, SL, FlowLabel, HopLimit."""
    if comp & McComp.QKEY and record.qkey != group.qkey:
        return False
    if comp & McComp.PKEY:
        if not (record.pkey | group.pkey) & 0x8000:
            return False
        if record.pkey & 0x7FFF != group.pkey & 0x7FFF:
            return False
    if comp & McComp.TCLASS and record.tclass != group.tclass:
        return False
    if comp & McComp.SL and record.sl != group.sl:
        return False
    if comp & McComp.FLOW_LABEL and record.flow_label != group.flow_label:
        return False
    return not (comp & McComp.HOP_LIMIT and record.hop_limit != group.hop_limit)


def _compare(selector: int, group_value: float, wanted: float) -> bool:
    if selector == 0:
        return group_value > wanted
    if selector == 1:
        return group_value < wanted
    if selector == 2:
        return group_value == wanted
    return True


def _more_fields_match(record: McMemberRecord, comp: int, group: McGroup) -> bool:
    """MTU and rate selectors against the group (packet lifetime is ignored, as OpenSM)."""
    if comp & McComp.MTU_SELECTOR and not _compare(record.mtu_selector, group.mtu, record.mtu):
        return False
    return not (
        comp & McComp.RATE_SELECTOR
        and not _compare(record.rate_selector, _rate_gbps(group.rate), _rate_gbps(record.rate))
    )


def _realizable_mtu(record: McMemberRecord, comp: int, port_mtu: int) -> int | None:
    """OpenSM's choice of a new group's MTU from the request and the creating port."""
    selector, wanted = record.mtu_selector, record.mtu
    if not (comp & McComp.MTU and comp & McComp.MTU_SELECTOR) or selector == 3:
        return port_mtu
    value = wanted
    if selector == 0:
        if wanted >= port_mtu:
            return None
        value = port_mtu
    elif selector == 1:
        value = port_mtu if wanted > port_mtu else wanted - 1
    return value if 1 <= value <= 5 else None


def _realizable_rate(record: McMemberRecord, comp: int, port_rate: int) -> int | None:
    """The same choice for the rate (compared in Gb/s, the enum is not ordered)."""
    selector, wanted = record.rate_selector, record.rate
    if not (comp & McComp.RATE and comp & McComp.RATE_SELECTOR) or selector == 3:
        return port_rate or None
    if not _rate_gbps(wanted):
        return None
    if selector == 0:
        return port_rate if _rate_gbps(wanted) < _rate_gbps(port_rate) else None
    if selector == 1:
        if _rate_gbps(wanted) > _rate_gbps(port_rate):
            return port_rate
        lower = [r for gbps, r in _RATES_BY_SPEED if gbps < _rate_gbps(wanted)]
        return lower[-1] if lower else None
    return wanted


def _fill_from_group(reply: McMemberRecord, group: McGroup) -> None:
    reply.mgid, reply.qkey, reply.mlid = group.mgid, group.qkey, group.mlid
    reply.tclass, reply.pkey = group.tclass, group.pkey
    reply.sl, reply.flow_label, reply.hop_limit = group.sl, group.flow_label, group.hop_limit
    reply.mtu_selector, reply.mtu = 2, group.mtu
    reply.rate_selector, reply.rate = 2, group.rate
    reply.packet_life_selector, reply.packet_life = 2, group.packet_life


def _query_matches(
    query: McMemberRecord, comp: int, group: McGroup, requester: SaEndpoint, trusted: bool
) -> list[McMemberRecord]:
    if comp & McComp.MGID and query.mgid != group.mgid:
        return []
    if comp & McComp.MLID and query.mlid != group.mlid:
        return []
    if not _has_pkey(requester.pkeys, group.pkey):
        return []
    if comp & McComp.PKEY and query.pkey != group.pkey:
        return []
    if not _other_fields_match(query, comp & ~McComp.PKEY, group):
        return []
    if comp & McComp.PROXY_JOIN and query.proxy_join:
        return []
    if not _more_fields_match(query, comp, group):
        return []
    mask = (0xF0 if comp & McComp.SCOPE else 0) | (0x0F if comp & McComp.JOIN_STATE else 0)
    wanted = query.scope_join & mask

    def record_for(scope_state: int, port_gid: bytes, proxy: bool) -> McMemberRecord:
        reply = McMemberRecord()
        _fill_from_group(reply, group)
        reply.scope, reply.join_state = scope_state >> 4, scope_state & 0xF
        reply.port_gid, reply.proxy_join = port_gid, proxy
        return reply

    scope = group.scope_state & 0xF0
    if comp & McComp.PORT_GID:
        member = group.members.get(int.from_bytes(query.port_gid[8:], "big"))
        if member is None:
            return []
        state = scope | member.join_state
        if state & mask != wanted:
            return []
        return [record_for(state, member.port_gid, member.proxy)]
    if trusted:
        return [
            record_for(scope | m.join_state, m.port_gid, m.proxy)
            for m in group.members.values()
            if (scope | m.join_state) & mask == wanted
        ]
    if group.scope_state & mask != wanted:
        return []
    return [record_for(group.scope_state, bytes(16), False)]

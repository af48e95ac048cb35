"""The simulated Subnet Administrator: request MADs in, response MADs out, as OpenSM answers.

``SubnetAdministrator.handle`` takes one request MAD (bytes) and the requester's port and
returns the response MADs (one, or several RMPP segments for a GetTable), built with the
project codecs. The rules follow what OpenSM does (checked against OpenSM on ibsim; the
recorded answers are test fixtures). Each attribute has its own module: PathRecord
(``sa_paths.py``), MCMemberRecord (``sa_members.py``, on the group table of
``multicast.py``), InformInfo and the Reports it subscribes to (``sa_inform.py``). Unknown
attributes or methods get generic status 0x000C; a GET that finds no record NO_RECORDS.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import replace

from ibacm.fabric.sim.multicast import IPOIB_QKEY, GroupTable, McGroup, ipoib_broadcast_mgid
from ibacm.fabric.sim.sa_inform import Subscriptions
from ibacm.fabric.sim.sa_members import MemberRecords
from ibacm.fabric.sim.sa_paths import PathRecords
from ibacm.fabric.sim.sa_view import SaEndpoint, SaFabric, SaFail, fail
from ibacm.wire.errors import WireError
from ibacm.wire.mad import (
    MAD_SIZE,
    MC_MEMBER_RECORD_LEN,
    SA_DATA_LEN,
    MadStatus,
    Method,
    SaAttr,
    SaMad,
    SaStatus,
    build_sa_response,
    sa_status_word,
    split_rmpp,
)
from ibacm.wire.notice import InformInfo, Trap
from ibacm.wire.path_record import PATH_RECORD_LEN


class SubnetAdministrator:
    """See the module docstring."""

    def __init__(self, fabric: SaFabric) -> None:
        self.fabric = fabric
        self.groups = GroupTable()
        self.records_sent: Counter[int] = Counter()
        """Records answered, by SA attribute: what the SA pays (a GetTable of N paths is N)."""
        self._paths = PathRecords(fabric, self.groups)
        self._members = MemberRecords(fabric, self.groups)
        self._inform = Subscriptions(fabric)

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
            self._inform.acknowledged(requester, request.mad)
            return []
        if request.mad.method & Method.RESP or request.mad.mgmt_class != 0x03:
            return []
        try:
            if request.mad.base_version != 1 or request.mad.class_version != 2:
                raise SaFail(MadStatus.BAD_VERSION)
            return self._dispatch(requester, request)
        except SaFail as failure:
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
            return self._inform_info(requester, request)
        if attr == SaAttr.PATH_RECORD and method in (Method.GET, Method.GET_TABLE):
            return self._answer(request, self._paths.query(requester, request), PATH_RECORD_LEN)
        if attr == SaAttr.MC_MEMBER_RECORD:
            members = self._members
            if method == Method.SET:
                return self._single(request, members.join(requester, request))
            if method == Method.DELETE:
                return self._single(request, members.leave(requester, request))
            if method in (Method.GET, Method.GET_TABLE):
                found = members.query(requester, request)
                return self._answer(request, found, MC_MEMBER_RECORD_LEN)
        raise SaFail(MadStatus.METHOD_ATTR_UNSUPPORTED)

    # -- event subscriptions --------------------------------------------------------------

    def _inform_info(self, requester: SaEndpoint, request: SaMad) -> list[bytes]:
        info, done = self._inform.inform(requester, request)
        if done:
            return self._single(request, info.encode())
        # o13-13.1.1: a refused subscription comes back with Subscribe 0.
        echo = replace(info, subscribe=0).encode()
        status = sa_status_word(SaStatus.REQ_INVALID)
        return [build_sa_response(request, status, echo, Method.GET_RESP, attr_offset=0)]

    @property
    def subscriptions(self) -> dict[tuple[int, bytes], InformInfo]:
        """(subscriber port GUID, the InformInfo as compared) -> the subscription."""
        return self._inform.subscriptions

    @property
    def unacked(self) -> dict[int, int]:
        """Reports sent and not acknowledged yet: TID -> the subscriber's port GUID."""
        return self._inform.unacked

    def reports(self, trap: Trap, guid: int, issuer: SaEndpoint) -> list[tuple[int, bytes]]:
        """The SubnAdmReport of trap 64..67 about port ``guid`` for every subscriber that
        wants it, as (subscriber GUID, MAD); each waits in ``unacked``."""
        return self._inform.reports(trap, guid, issuer)

    def forget_port(self, guid: int) -> None:
        """A port left the subnet: its subscriptions and pending Reports go."""
        self._inform.forget_port(guid)

    def forget_subscriptions(self) -> None:
        """A new SM: it knows no subscriptions and owes no Reports."""
        self._inform.forget_all()

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
            raise fail(SaStatus.NO_RECORDS)
        if len(records) > 1:
            raise fail(SaStatus.TOO_MANY_RECORDS)
        return self._single(request, records[0])

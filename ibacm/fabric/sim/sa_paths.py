"""PathRecord queries to the simulated SA, answered as OpenSM answers them.

GET returns the first matching path (NO_RECORDS when there is none), GetTable every one;
reversible is set, numb_path 0, MTU and rate are the path minimum with selector 2, the packet
lifetime is the subnet timeout (0 for loopback). A multicast DGID gets the group's path. A
query spanning more than ``MAX_PAIRS`` source x destination pairs is refused (NO_RESOURCES).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from types import SimpleNamespace

from ibacm.fabric.sim.multicast import GroupTable
from ibacm.fabric.sim.sa_view import (
    RATES_BY_SPEED,
    SaEndpoint,
    SaFabric,
    common_pkey,
    fail,
    invalid,
    prefix_known,
    rate_gbps,
)
from ibacm.fabric.sim.topo_file.model import gid_of
from ibacm.wire.mad import Method, SaMad, SaStatus
from ibacm.wire.path_record import (
    PATH_LAYOUT,
    PATH_RECORD_LEN,
    REVERSIBLE_BIT,
    PathComp,
    PathRecord,
)

MAX_PAIRS = 250_000
"""A PathRecord query spanning more source x destination pairs is refused (NO_RESOURCES)."""

_PC = SimpleNamespace(**{name: int(bit) for name, bit in PathComp.__members__.items()})
"""PathComp bits as plain ints: ``int & IntFlag`` is slow, and a GetTable tests N^2 pairs."""


class PathRecords:
    """See the module docstring; ``groups`` are the SA's multicast groups."""

    def __init__(self, fabric: SaFabric, groups: GroupTable) -> None:
        self.fabric = fabric
        self.groups = groups

    def query(self, requester: SaEndpoint, request: SaMad) -> list[bytes]:
        """The records a PathRecord GET (at most one) or GetTable request finds."""
        path = PathRecord.decode(request.data[:PATH_RECORD_LEN])
        comp = request.sa.comp_mask
        self._check_path_request(path, comp)
        if comp & _PC.DGID and path.dgid[0] == 0xFF:
            return self._multicast_path(path, requester)
        sources = self._ends(comp, _PC.SGID, _PC.SLID, path.sgid, path.slid)
        targets = self._ends(comp, _PC.DGID, _PC.DLID, path.dgid, path.dlid)
        if len(sources) * len(targets) > MAX_PAIRS:
            raise fail(SaStatus.NO_RESOURCES)
        if request.mad.method == Method.GET:
            for src in sources:
                for dst in targets:
                    record = self._pair(path, comp, src, dst)
                    if record is not None:
                        return [record.encode()]
            return []
        records: list[bytes] = []
        for src in sources:
            records += self._table_from(path, comp, src, targets)
        return records

    @staticmethod
    def _check_path_request(path: PathRecord, comp: int) -> None:
        if comp & _PC.RATE_SELECTOR and comp & _PC.RATE and not rate_gbps(path.rate):
            raise invalid()
        if comp & _PC.MTU_SELECTOR and comp & _PC.MTU and not 1 <= path.mtu <= 5:
            raise invalid()
        service = comp & _PC.SERVICE_ID
        if service and service != _PC.SERVICE_ID:
            raise fail(SaStatus.REQ_INSUFFICIENT_COMPONENTS)

    def _ends(
        self, comp: int, gid_bit: int, lid_bit: int, gid: bytes, lid: int
    ) -> Sequence[SaEndpoint]:
        fabric = self.fabric
        by_gid = by_lid = None
        if comp & gid_bit:
            if not prefix_known(fabric, gid):
                return []  # OpenSM: invalid GID, answered as "no records"
            by_gid = fabric.endpoint_by_guid(int.from_bytes(gid[8:], "big"))
            if by_gid is None:
                return []
        if comp & lid_bit:
            by_lid = fabric.endpoint_by_lid(lid)
            if by_lid is None:
                return []
        if by_gid is not None and by_lid is not None and by_gid is not by_lid:
            raise invalid()
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
            dgid=gid_of(prefix, dst.guid),
            sgid=path.sgid if comp & _PC.SGID else gid_of(prefix, src.guid),
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
                pkey = common_pkey(mine, theirs)
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
            common = common_pkey(src.pkeys, dst.pkeys)
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
    have, wanted = rate_gbps(rate), rate_gbps(path.rate)
    selector = path.rate_selector
    if selector == 0:
        return rate if have > wanted else None
    if selector == 1:
        if have < wanted:
            return rate
        lower = [r for gbps, r in RATES_BY_SPEED if gbps < wanted]
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

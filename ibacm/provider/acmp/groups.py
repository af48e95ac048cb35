"""ACM multicast groups: which to join, the MCMemberRecord join, and what a join yields.

mad-protocol.md §4 and §9.6. Group 0 (``min_rate``/``min_mtu``) is what every node shares and
where requests go; further groups advertise faster paths for route_prot acm. C joins at most
two and never retries a failed join (defect 25); here the plan is a list (at most six fit in
a request), and ``join_forever`` retries with a jittered exponential backoff until it
succeeds.

Only groups whose join succeeded are advertised and matched (C matched requested MGIDs even
when the join had failed, building all-zero paths from them: defect 26).
"""

from __future__ import annotations

import enum
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from ibacm.config.option_values import RouteProt
from ibacm.fabric.api import ACM_QKEY, AddressVector, FabricError
from ibacm.log import get_logger
from ibacm.wire.acm_mad import MAX_GIDS_IN_MAD, mgid_for
from ibacm.wire.errors import WireError
from ibacm.wire.mad import (
    MC_MEMBER_RECORD_LEN,
    McMemberRecord,
    Method,
    SaAttr,
    SaMad,
    build_mc_join,
)
from ibacm.wire.path_record import AimablePath, PathRecord

if TYPE_CHECKING:
    from ibacm.config.options import Options

log = get_logger("ibacm.provider.acmp")

SELECTOR_EXACTLY = 2
SCOPE_SITE_LOCAL = 5
JOIN_FULL_MEMBER = 1


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """What a group is made of; its MGID follows from these and the partition."""

    rate: int
    mtu: int
    tos: int = 0
    sl: int = 0

    def mgid(self, pkey: int) -> bytes:
        return mgid_for(pkey, self.rate, self.mtu, self.tos)


def plan_groups(options: Options, port_rate: int, port_mtu: int) -> list[GroupSpec]:
    """The groups an endpoint joins, lowest preference first (mad-protocol.md §4.2).

    Group 1 (the port's own rate and MTU) only matters for route_prot acm and only when it
    differs from group 0; a port whose rate is unknown (0) does not get one.
    """
    specs = [GroupSpec(options.min_rate, options.min_mtu)]
    native = GroupSpec(port_rate, port_mtu)
    if options.route_prot == RouteProt.ACM and port_rate and native != specs[0]:
        specs.append(native)
    return specs[:MAX_GIDS_IN_MAD]


class GroupState(enum.Enum):
    JOINING = "joining"
    JOINED = "joined"


class JoinError(Exception):
    """A join attempt failed (timeout, SA status, unusable reply)."""


class McGroup:
    """One group of an endpoint and, once joined, what the SA granted."""

    __slots__ = (
        "attempts",
        "av",
        "index",
        "last_error",
        "mgid",
        "mlid",
        "path",
        "route",
        "spec",
        "state",
    )

    def __init__(self, index: int, spec: GroupSpec, pkey: int) -> None:
        self.index = index
        self.spec = spec
        self.mgid = spec.mgid(pkey)
        self.state = GroupState.JOINING
        self.mlid = 0
        self.av: AddressVector | None = None
        """Multicast address vector (DLID = MLID, DGID = MGID)."""
        self.path: PathRecord | None = None
        """The group path record (route_prot acm builds peer paths from it)."""
        self.route: AimablePath | None = None
        """``path`` packed once: what entries routed through the group aim at their peer."""
        self.attempts = 0
        self.last_error = ""

    @property
    def joined(self) -> bool:
        return self.state is GroupState.JOINED

    def reset(self) -> None:
        """Forget the join (client reregister, SM change): the group must be joined again."""
        self.state = GroupState.JOINING
        self.mlid = 0
        self.av = None
        self.path = None
        self.route = None

    def apply(self, granted: McMemberRecord, sgid_index: int, port_lid: int) -> None:
        """Record a successful join (mad-protocol.md §4.3)."""
        self.mlid = granted.mlid
        self.av = group_av(granted, sgid_index)
        self.path = group_path(granted, port_lid)
        self.route = AimablePath.of(self.path)
        self.state = GroupState.JOINED
        self.last_error = ""

    def describe(self) -> dict[str, object]:
        import ipaddress

        return {
            "index": self.index,
            "mgid": str(ipaddress.IPv6Address(self.mgid)),
            "rate": self.spec.rate,
            "mtu": self.spec.mtu,
            "state": self.state.value,
            "mlid": self.mlid,
            "attempts": self.attempts,
            "last_error": self.last_error,
        }


def join_record(mgid: bytes, port_gid: bytes, pkey: int, spec: GroupSpec) -> McMemberRecord:
    """The MCMemberRecord of a join (mad-protocol.md §9.6)."""
    return McMemberRecord(
        mgid=mgid,
        port_gid=port_gid,
        qkey=ACM_QKEY,
        mtu_selector=SELECTOR_EXACTLY,
        mtu=spec.mtu,
        tclass=spec.tos,
        pkey=pkey,
        rate_selector=SELECTOR_EXACTLY,
        rate=spec.rate,
        sl=spec.sl,
        scope=SCOPE_SITE_LOCAL,
        join_state=JOIN_FULL_MEMBER,
    )


def build_join(tid: int, group: McGroup, port_gid: bytes, pkey: int) -> bytes:
    return build_mc_join(tid, join_record(group.mgid, port_gid, pkey, group.spec))


def parse_join_reply(raw: bytes, tid: int, mgid: bytes) -> McMemberRecord:
    """The granted record of a join reply; JoinError says why the join failed."""
    try:
        reply = SaMad.decode(raw)
        # IBA answers SubnAdmSet with SubnAdmGetResp (0x81).
        if reply.mad.method not in (Method.GET_RESP, Method.SET_RESP):
            raise JoinError(f"reply method 0x{reply.mad.method:02x} is not GetResp")
        if reply.mad.attr_id != SaAttr.MC_MEMBER_RECORD:
            raise JoinError(f"reply attribute 0x{reply.mad.attr_id:04x} is not MCMemberRecord")
        if (reply.mad.tid ^ tid) & 0xFFFFFFFF:
            raise JoinError(f"reply TID 0x{reply.mad.tid:x} does not match 0x{tid:x}")
        if reply.mad.status:
            raise JoinError(f"SA status 0x{reply.mad.status:04x}")
        granted = McMemberRecord.decode(reply.data[:MC_MEMBER_RECORD_LEN])
    except WireError as exc:
        raise JoinError(f"malformed join reply: {exc}") from exc
    if granted.mgid != mgid:
        raise JoinError(f"reply is for MGID {granted.mgid.hex()}, not {mgid.hex()}")
    return granted


def group_av(granted: McMemberRecord, sgid_index: int) -> AddressVector:
    return AddressVector(
        dlid=granted.mlid,
        dgid=granted.mgid,
        sl=granted.sl,
        static_rate=granted.rate,
        sgid_index=sgid_index,
        flow_label=granted.flow_label,
        hop_limit=granted.hop_limit,
        traffic_class=granted.tclass,
    )


def group_path(granted: McMemberRecord, port_lid: int) -> PathRecord:
    path = PathRecord(
        dgid=granted.mgid,
        sgid=granted.port_gid,
        dlid=granted.mlid,
        slid=port_lid,
        flow_label=granted.flow_label,
        hop_limit=granted.hop_limit,
        tclass=granted.tclass,
        reversible=True,
        numb_path=1,
        pkey=granted.pkey,
        sl=granted.sl,
    )
    path.mtu_byte = granted.mtu_byte
    path.rate_byte = granted.rate_byte
    path.packetlifetime_byte = granted.packetlifetime_byte
    return path


def select_group(offered: Sequence[bytes], joined: dict[bytes, McGroup]) -> McGroup | None:
    """The most preferred of the peer's MGIDs (last first) that we joined too (§4.4)."""
    for mgid in reversed(offered):
        group = joined.get(mgid)
        if group is not None:
            return group
    return None


def joined_mgids(groups: Iterable[McGroup]) -> list[bytes]:
    """MGIDs to advertise in a request: joined groups, lowest preference first."""
    return [group.mgid for group in groups if group.joined][:MAX_GIDS_IN_MAD]


def jittered(delay: float, rng: random.Random) -> float:
    """A wait drawn uniformly between half of ``delay`` and all of it."""
    return delay * (0.5 + 0.5 * rng.random())


async def join_forever(
    group: McGroup,
    attempt: Callable[[McGroup], Awaitable[None]],
    initial_ms: int,
    max_ms: int,
    rng: random.Random | None = None,
) -> None:
    """Call ``attempt`` until it succeeds. The backoff doubles from initial to max ms; each
    wait is drawn between half of it and all of it, so the nodes whose joins failed together
    (the SM restarted, the SA was busy) do not all ask again in the same instant."""
    rng = random.Random() if rng is None else rng
    delay = initial_ms / 1000.0
    while True:
        group.attempts += 1
        try:
            await attempt(group)
            return
        except (JoinError, FabricError) as exc:
            group.last_error = str(exc) or type(exc).__name__
            wait = jittered(delay, rng)
            log.info(
                "multicast join failed, will retry",
                group=group.index,
                mgid=group.mgid.hex(),
                error=group.last_error,
                retry_in=round(wait, 3),
            )
        await trio.sleep(wait)
        delay = min(delay * 2, max_ms / 1000.0)

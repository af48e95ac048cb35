"""The subnet as the simulated SA sees it, and the rules every SA answer shares.

``SaFabric`` and ``SaEndpoint`` are all the SA may know of the fabric (only ACTIVE ports are
part of the subnet). The partition rules (a shared P_Key with at least one full member), the
GID prefixes it accepts and ``SaFail`` (a request answered with an SA status) are used by the
PathRecord (``sa_paths.py``), MCMemberRecord (``sa_members.py``) and InformInfo
(``sa_inform.py``) handling alike.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from ibacm.fabric.sim.routing import Router
from ibacm.wire.errors import WireError
from ibacm.wire.mad import SaStatus, sa_status_word
from ibacm.wire.rates import rate_to_gbps

LINK_LOCAL_PREFIX = 0xFE80000000000000
RATES_BY_SPEED = sorted((rate_to_gbps(r), r) for r in range(2, 26))
"""(Gb/s, rate enum) in speed order: the enum is not ordered."""


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


class SaFail(Exception):
    """The request is answered with SA/MAD status ``status`` (and no records)."""

    def __init__(self, status: int) -> None:
        super().__init__(f"SA status {status:#06x}")
        self.status = status


def invalid() -> SaFail:
    return SaFail(sa_status_word(SaStatus.REQ_INVALID))


def fail(status: SaStatus) -> SaFail:
    return SaFail(sa_status_word(status))


def prefix_known(fabric: SaFabric, gid: bytes) -> bool:
    """Whether the GID's prefix is the subnet's own or the link-local one."""
    return int.from_bytes(gid[:8], "big") in (fabric.subnet_prefix, LINK_LOCAL_PREFIX)


def gid_port(fabric: SaFabric, gid: bytes) -> SaEndpoint | None:
    """The port a GID names, if it is in the subnet."""
    if not prefix_known(fabric, gid):
        return None
    return fabric.endpoint_by_guid(int.from_bytes(gid[8:], "big"))


def pkey_shared(a: int, b: int) -> bool:
    """Same partition (low 15 bits, non-zero) and at least one full member."""
    return (a & 0x7FFF) == (b & 0x7FFF) and a & 0x7FFF != 0 and bool((a | b) & 0x8000)


def has_pkey(pkeys: Iterable[int], pkey: int) -> bool:
    return any((p & 0x7FFF) == (pkey & 0x7FFF) and p & 0x7FFF for p in pkeys)


def common_pkey(src: Sequence[int], dst: Sequence[int]) -> int | None:
    for a in src:
        for b in dst:
            if pkey_shared(a, b):
                return a
    return None


def rate_gbps(rate: int) -> float:
    try:
        return rate_to_gbps(rate)
    except WireError:
        return 0.0

"""Automatic source selection for RESOLVE requests that carry no SOURCE entry.

Like C, the kernel picks: a UDP socket of the destination's family is ``connect()``-ed to the
destination (no packet is sent) and ``getsockname()`` tells the local address of the route.
Fixes over C (defect 6): failures map to ACM statuses a client understands instead of a raw,
truncated errno, and IPv6 link-local destinations are tried with the scope of each local
IPoIB interface that has a link-local address. When the kernel's choice is not an address of
ours (no IPoIB routes, e.g. on the simulated fabric) the endpoint address whose on-link prefix
contains the destination is used instead.
"""

from __future__ import annotations

import errno
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import trio

from ibacm.fabric.api import IpAddress
from ibacm.wire.client import AcmStatus


class SourceSelectionError(Exception):
    """No source address could be chosen; ``status`` goes into the reply."""

    def __init__(self, status: AcmStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True, slots=True)
class LocalIp:
    """An IP address of a local endpoint, as far as source selection cares."""

    address: IpAddress
    prefixlen: int | None = None
    """On-link prefix length when known (system IPs), None for address-file IPs."""
    ifname: str | None = None

    def on_link(self, dest: IpAddress) -> bool:
        if self.prefixlen is None or self.address.version != dest.version:
            return False
        network = ipaddress.ip_network(f"{self.address}/{self.prefixlen}", strict=False)
        return dest in network


_ERRNO_STATUS: dict[int, AcmStatus] = {
    errno.ENETUNREACH: AcmStatus.EDESTADDR,
    errno.EHOSTUNREACH: AcmStatus.EDESTADDR,
    errno.EINVAL: AcmStatus.EDESTADDR,
    errno.EADDRNOTAVAIL: AcmStatus.ESRCADDR,
    errno.EAFNOSUPPORT: AcmStatus.EDESTTYPE,
    errno.ENOMEM: AcmStatus.ENOMEM,
    errno.ENOBUFS: AcmStatus.ENOMEM,
    errno.EMFILE: AcmStatus.ENOMEM,
    errno.ENFILE: AcmStatus.ENOMEM,
}


def status_for_errno(code: int | None) -> AcmStatus:
    """ACM status for a failed socket()/connect()/getsockname() (C sent the raw errno)."""
    return _ERRNO_STATUS.get(code or 0, AcmStatus.EINVAL)


Probe = Callable[[IpAddress, int], Awaitable[IpAddress]]


async def kernel_probe(dest: IpAddress, scope_id: int = 0) -> IpAddress:
    """The local address the kernel would use to reach ``dest`` (raises OSError)."""
    family = socket.AF_INET if dest.version == 4 else socket.AF_INET6
    sock = trio.socket.socket(family, socket.SOCK_DGRAM)
    with sock:
        if family == socket.AF_INET:
            await sock.connect((str(dest), 0))
        else:
            await sock.connect((str(dest), 0, 0, scope_id))
        local = sock.getsockname()[0]
    # getsockname may append "%scope" to IPv6 link-local text.
    return ipaddress.ip_address(str(local).split("%", 1)[0])


def _interface_index(ifname: str | None) -> int | None:
    if ifname is None:
        return None
    try:
        return socket.if_nametoindex(ifname)
    except OSError:
        return None


async def _link_local(
    dest: ipaddress.IPv6Address, local: Sequence[LocalIp], probe: Probe
) -> IpAddress:
    candidates = [ip for ip in local if ip.address.version == 6 and ip.address.is_link_local]
    if not candidates:
        raise SourceSelectionError(
            AcmStatus.EDESTADDR, f"no local IPv6 link-local address to reach {dest}"
        )
    for candidate in candidates:
        scope = _interface_index(candidate.ifname)
        if scope is None:
            # The interface is not a kernel netdev (simulated fabric): the endpoint that owns
            # this link-local address is the source.
            return candidate.address
        try:
            return await probe(dest, scope)
        except OSError:
            continue
    raise SourceSelectionError(AcmStatus.EDESTADDR, f"no interface reaches {dest}")


async def select_source(
    dest: IpAddress, local: Sequence[LocalIp], probe: Probe = kernel_probe
) -> IpAddress:
    """Pick the source address for ``dest``; raises SourceSelectionError."""
    if isinstance(dest, ipaddress.IPv6Address) and dest.is_link_local:
        return await _link_local(dest, local, probe)
    ours = {ip.address for ip in local}
    try:
        chosen = await probe(dest, 0)
    except OSError as exc:
        fallback = next((ip.address for ip in local if ip.on_link(dest)), None)
        if fallback is not None:
            return fallback
        raise SourceSelectionError(
            status_for_errno(exc.errno), f"no route to {dest}: {exc.strerror or exc}"
        ) from exc
    if chosen in ours:
        return chosen
    # The kernel routes elsewhere (no IPoIB route); an on-link endpoint address still wins.
    fallback = next((ip.address for ip in local if ip.on_link(dest)), None)
    return fallback if fallback is not None else chosen

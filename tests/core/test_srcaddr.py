"""Automatic source selection: the kernel's choice, on-link fallback, statuses, link-local."""

from __future__ import annotations

import errno
import ipaddress

import pytest

from ibacm.core.srcaddr import (
    LocalIp,
    SourceSelectionError,
    kernel_probe,
    select_source,
    status_for_errno,
)
from ibacm.fabric.api import IpAddress
from ibacm.wire.client import AcmStatus

IP = ipaddress.ip_address
LOCAL = [
    LocalIp(IP("10.0.0.1"), 16, "ib0"),
    LocalIp(IP("fd00::1"), 64, "ib0"),
    LocalIp(IP("192.168.7.1"), None, None),  # from the address file: no prefix known
]


class FakeRoute:
    """Stands in for the kernel's routing decision: returns ``address`` or fails."""

    def __init__(self, address: str | None, code: int = errno.ENETUNREACH) -> None:
        self.address = address
        self.code = code
        self.calls: list[tuple[IpAddress, int]] = []

    async def __call__(self, dest: IpAddress, scope_id: int) -> IpAddress:
        self.calls.append((dest, scope_id))
        if self.address is None:
            raise OSError(self.code, "probe failed")
        return IP(self.address)


def probe_returning(address: str | None, code: int = errno.ENETUNREACH) -> FakeRoute:
    return FakeRoute(address, code)


@pytest.mark.trio
async def test_kernel_choice_wins_when_it_is_ours() -> None:
    assert await select_source(IP("10.0.5.5"), LOCAL, probe_returning("192.168.7.1")) == IP(
        "192.168.7.1"
    )


@pytest.mark.trio
async def test_on_link_endpoint_when_the_kernel_routes_elsewhere() -> None:
    # e.g. the default route via eth0 on a machine without IPoIB routes (simulated fabric)
    assert await select_source(IP("10.0.5.5"), LOCAL, probe_returning("172.17.0.2")) == IP(
        "10.0.0.1"
    )
    assert await select_source(IP("fd00::9"), LOCAL, probe_returning(None)) == IP("fd00::1")


@pytest.mark.trio
async def test_no_on_link_endpoint_returns_the_kernel_choice() -> None:
    # Not ours: the dispatcher then answers ESRCADDR, as C.
    assert await select_source(IP("8.8.8.8"), LOCAL, probe_returning("172.17.0.2")) == IP(
        "172.17.0.2"
    )


@pytest.mark.trio
@pytest.mark.parametrize(
    ("code", "status"),
    [
        (errno.ENETUNREACH, AcmStatus.EDESTADDR),
        (errno.EHOSTUNREACH, AcmStatus.EDESTADDR),
        (errno.EADDRNOTAVAIL, AcmStatus.ESRCADDR),
        (errno.EAFNOSUPPORT, AcmStatus.EDESTTYPE),
        (errno.EMFILE, AcmStatus.ENOMEM),
        (errno.EPERM, AcmStatus.EINVAL),
    ],
)
async def test_failures_become_acm_statuses(code: int, status: AcmStatus) -> None:
    with pytest.raises(SourceSelectionError) as caught:
        await select_source(IP("8.8.8.8"), LOCAL, probe_returning(None, code))
    assert caught.value.status == status
    assert status_for_errno(code) == status


@pytest.mark.trio
async def test_link_local_destination() -> None:
    with pytest.raises(SourceSelectionError) as caught:
        await select_source(IP("fe80::2"), LOCAL, probe_returning("fe80::1"))
    assert caught.value.status == AcmStatus.EDESTADDR
    # An interface the kernel knows: probed with its scope id.
    lo = LocalIp(IP("fe80::1"), 64, "lo")
    probe = probe_returning("fe80::1")
    assert await select_source(IP("fe80::2"), [lo], probe) == IP("fe80::1")
    assert probe.calls[0][1] > 0
    # An interface the kernel does not know (simulated fabric): the endpoint address.
    sim = LocalIp(IP("fe80::7"), 64, "ib-sim-9")
    assert await select_source(IP("fe80::2"), [sim], probe_returning(None)) == IP("fe80::7")


@pytest.mark.trio
async def test_kernel_probe_on_loopback() -> None:
    assert await kernel_probe(IP("127.0.0.1")) == IP("127.0.0.1")

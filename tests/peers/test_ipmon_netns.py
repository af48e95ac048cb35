"""IP monitoring against the real kernel, on a dummy interface in a private namespace.

The monitor's netlink sockets are opened inside the namespace; addresses are added and
removed with iproute2. The IPoIB filter is swapped for one that accepts every non-loopback
link, because the test interface (a dummy, or a veth where the kernel has no dummy driver)
is ARPHRD_ETHER.
"""

from __future__ import annotations

import ipaddress
import subprocess
from collections.abc import Iterator

import pytest
import trio

from ibacm.fabric.api import IpEvent
from ibacm.fabric.hw.ipmon import IpMonitor, any_but_loopback
from tests.conftest import require_peer
from tests.peers.netns import add_test_interface, network_namespace, ns_socket_factory

pytestmark = pytest.mark.peer


@pytest.fixture
def netns() -> Iterator[str]:
    with network_namespace("ibacm-ipmon") as name:
        add_test_interface(name, "dummy0")
        yield name


def ip(netns: str, *args: str) -> None:
    subprocess.run([require_peer("ip"), "-n", netns, *args], check=True, capture_output=True)


async def aip(netns: str, *args: str) -> None:
    await trio.run_process([require_peer("ip"), "-n", netns, *args], capture_stdout=True)


async def next_event(monitor: IpMonitor, seconds: float = 5) -> IpEvent:
    with trio.fail_after(seconds):
        return await monitor.next_event()


def summary(event: IpEvent) -> tuple[bool, str, str]:
    return event.added, event.address.ifname, event.address.display


@pytest.mark.trio
async def test_enumeration_lists_ipv4_and_ipv6_with_prefix(netns: str) -> None:
    ip(netns, "addr", "add", "10.1.2.3/24", "dev", "dummy0")
    ip(netns, "addr", "add", "fd00:1::5/64", "dev", "dummy0", "nodad")
    monitor = IpMonitor(link_filter=any_but_loopback, socket_factory=ns_socket_factory(netns))
    await monitor.open()
    found = {(a.ifname, a.display, a.pkey, a.gid) for a in await monitor.addresses()}
    assert ("dummy0", "10.1.2.3/24", 0xFFFF, bytes(16)) in found
    assert ("dummy0", "fd00:1::5/64", 0xFFFF, bytes(16)) in found
    monitor.close()


@pytest.mark.trio
async def test_ipv4_and_ipv6_additions_and_removals_are_events(netns: str) -> None:
    monitor = IpMonitor(link_filter=any_but_loopback, socket_factory=ns_socket_factory(netns))
    await monitor.open()
    await aip(netns, "addr", "add", "10.9.9.9/16", "dev", "dummy0")
    assert summary(await next_event(monitor)) == (True, "dummy0", "10.9.9.9/16")
    await aip(netns, "addr", "add", "fd00:2::9/64", "dev", "dummy0", "nodad")
    added = await next_event(monitor)
    assert summary(added) == (True, "dummy0", "fd00:2::9/64")
    assert added.address.address == ipaddress.IPv6Address("fd00:2::9")
    await aip(netns, "addr", "del", "10.9.9.9/16", "dev", "dummy0")
    assert summary(await next_event(monitor)) == (False, "dummy0", "10.9.9.9/16")
    await aip(netns, "addr", "del", "fd00:2::9/64", "dev", "dummy0")
    assert summary(await next_event(monitor)) == (False, "dummy0", "fd00:2::9/64")
    monitor.close()


@pytest.mark.trio
async def test_lifetime_updates_are_not_reported_as_new_addresses(netns: str) -> None:
    monitor = IpMonitor(link_filter=any_but_loopback, socket_factory=ns_socket_factory(netns))
    await monitor.open()
    lifetimes = ("valid_lft", "300", "preferred_lft", "300", "nodad")
    await aip(netns, "addr", "add", "fd00:3::1/64", "dev", "dummy0", *lifetimes)
    assert summary(await next_event(monitor)) == (True, "dummy0", "fd00:3::1/64")
    # The kernel sends RTM_NEWADDR again for the change; nothing new appeared.
    await aip(
        netns,
        "addr",
        "change",
        "fd00:3::1/64",
        "dev",
        "dummy0",
        "valid_lft",
        "600",
        "preferred_lft",
        "300",
        "nodad",
    )
    await aip(netns, "addr", "add", "10.3.3.3/8", "dev", "dummy0")
    assert summary(await next_event(monitor)) == (True, "dummy0", "10.3.3.3/8")
    monitor.close()


@pytest.mark.trio
async def test_deleting_the_interface_removes_its_addresses(netns: str) -> None:
    add_test_interface(netns, "dummy1")
    monitor = IpMonitor(link_filter=any_but_loopback, socket_factory=ns_socket_factory(netns))
    await monitor.open()
    await aip(netns, "addr", "add", "10.4.4.4/24", "dev", "dummy1")
    assert summary(await next_event(monitor)) == (True, "dummy1", "10.4.4.4/24")
    await aip(netns, "link", "del", "dummy1")
    assert summary(await next_event(monitor)) == (False, "dummy1", "10.4.4.4/24")
    monitor.close()


@pytest.mark.trio
async def test_the_ipoib_filter_ignores_ethernet_interfaces(netns: str) -> None:
    ip(netns, "addr", "add", "10.5.5.5/24", "dev", "dummy0")
    monitor = IpMonitor(socket_factory=ns_socket_factory(netns))  # production filter
    await monitor.open()
    assert await monitor.addresses() == []
    await aip(netns, "addr", "add", "10.5.5.6/24", "dev", "dummy0")
    with trio.move_on_after(0.3) as waited:
        await monitor.next_event()
    assert waited.cancelled_caught
    monitor.close()


@pytest.mark.trio
async def test_overflow_resyncs_and_reports_exactly_the_difference(netns: str) -> None:
    ip(netns, "addr", "add", "10.6.0.1/16", "dev", "dummy0")
    ip(netns, "addr", "add", "10.6.0.2/16", "dev", "dummy0")
    factory = ns_socket_factory(netns, rcvbuf=1024)  # overflows after a few messages
    monitor = IpMonitor(link_filter=any_but_loopback, socket_factory=factory)
    await monitor.open()
    batch = [f"addr add 10.7.{i // 250}.{i % 250 + 1}/16 dev dummy0" for i in range(300)]
    batch.append("addr del 10.6.0.2/16 dev dummy0")
    await trio.run_process(
        [require_peer("ip"), "-n", netns, "-batch", "-"], stdin="\n".join(batch).encode()
    )
    events: list[IpEvent] = []
    with trio.move_on_after(3):
        while len(events) < 301:
            events.append(await monitor.next_event())
    assert monitor.resyncs >= 1
    added = {str(e.address.address) for e in events if e.added}
    removed = {str(e.address.address) for e in events if not e.added}
    assert added == {f"10.7.{i // 250}.{i % 250 + 1}" for i in range(300)}
    assert removed == {"10.6.0.2"}
    assert len(events) == 301  # each change exactly once, none for the untouched 10.6.0.1
    monitor.close()

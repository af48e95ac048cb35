"""System IP addresses of IPoIB interfaces, enumerated and monitored through rtnetlink.

Enumeration is an RTM_GETLINK + RTM_GETADDR dump; monitoring is a NETLINK_ROUTE socket bound
to links and IPv4 *and* IPv6 address events (C only followed IPv4 ``IFA_LOCAL``, defect 27).
An address is reported once per appearance: the monitor remembers what it has reported, so the
repeated RTM_NEWADDR the kernel sends for IPv6 lifetime updates are not new addresses. When
the event socket overflows (ENOBUFS), the monitor re-enumerates and reports the difference as
explicit removals and additions, so nothing is invalidated silently (C defect 28).

Only links accepted by the link filter count: by default IPoIB links (ARPHRD_INFINIBAND),
whose 20-byte hardware address holds the port GID in bytes 4..19 and whose P_Key is in sysfs
(``/sys/class/net/<if>/pkey``) or in the link's ipoib netlink data. Tests use another filter
to watch dummy interfaces in their own network namespace.
"""

from __future__ import annotations

import errno
import ipaddress
import itertools
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

from ibacm.fabric.api import ZERO_GID, FabricError, InterfaceAddress, IpEvent
from ibacm.fabric.hw import rtnetlink as rt
from ibacm.log import get_logger

log = get_logger("ibacm.fabric.hw.ipmon")

RECV_SIZE = 1 << 16
SOCKET_BUFFER = 1 << 20
ARPHRD_LOOPBACK = 772
DEFAULT_PKEY = 0xFFFF
FULL_MEMBER = 0x8000


@dataclass(frozen=True, slots=True)
class LinkInfo:
    ifindex: int
    name: str
    arphrd: int
    hwaddr: bytes
    kind: str | None = None
    ipoib_pkey: int | None = None

    @classmethod
    def from_message(cls, message: rt.LinkMessage) -> LinkInfo:
        return cls(
            message.ifindex,
            message.name,
            message.arphrd,
            message.hwaddr,
            message.kind,
            message.ipoib_pkey,
        )


LinkFilter = Callable[[LinkInfo], bool]
SocketFactory = Callable[[int], socket.socket]


def ipoib_only(link: LinkInfo) -> bool:
    """The production filter: IPoIB interfaces (ARP hardware type InfiniBand, 32)."""
    return link.arphrd == rt.ARPHRD_INFINIBAND


def any_but_loopback(link: LinkInfo) -> bool:
    """Every interface except loopback (for tests on dummy/veth interfaces)."""
    return link.arphrd != ARPHRD_LOOPBACK


def open_route_socket(groups: int) -> socket.socket:
    """A NETLINK_ROUTE socket bound to the given multicast groups (0 for dumps only)."""
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, 0)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
        sock.bind((0, groups))
    except BaseException:
        sock.close()
        raise
    return sock


def interface_gid(hwaddr: bytes) -> bytes:
    """Port GID of an IPoIB interface: bytes 4..19 of its 20-byte hardware address."""
    return bytes(hwaddr[4:20]) if len(hwaddr) == 20 else ZERO_GID


class IpMonitor:
    """Enumerates and watches the addresses of the interfaces the filter accepts."""

    def __init__(
        self,
        *,
        link_filter: LinkFilter = ipoib_only,
        socket_factory: SocketFactory = open_route_socket,
        sysfs_net: Path = Path("/sys/class/net"),
    ) -> None:
        self._filter = link_filter
        self._socket_factory = socket_factory
        self._sysfs_net = sysfs_net
        self._events: trio.socket.SocketType | None = None
        self._links: dict[int, LinkInfo] = {}
        self._known: dict[tuple[int, str], InterfaceAddress] = {}
        self._pending: deque[IpEvent] = deque()
        self._seq = itertools.count(1)
        self._dump_lock = trio.Lock()
        self.resyncs = 0

    async def open(self) -> None:
        """Subscribe first, then enumerate, so no change between the two is missed."""
        if self._events is not None:
            return
        self._events = trio.socket.from_stdlib_socket(self._socket_factory(rt.MONITOR_GROUPS))
        try:
            current = await self._snapshot()
        except BaseException:
            self.close()
            raise
        self._known = current

    async def addresses(self) -> list[InterfaceAddress]:
        """Every address of every accepted interface, freshly enumerated."""
        return list((await self._snapshot()).values())

    async def next_event(self) -> IpEvent:
        """The next address that appeared or disappeared."""
        while not self._pending:
            sock = self._require_open()
            try:
                datagram = await sock.recv(RECV_SIZE)
            except OSError as exc:
                if exc.errno != errno.ENOBUFS:
                    raise
                await self._resync("event socket overflow (ENOBUFS)")
                continue
            await self._handle(datagram)
        return self._pending.popleft()

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None

    # -- events --------------------------------------------------------------------------
    def _require_open(self) -> trio.socket.SocketType:
        if self._events is None:
            raise trio.ClosedResourceError("the IP monitor is not open")
        return self._events

    async def _handle(self, datagram: bytes) -> None:
        try:
            messages = list(rt.split_messages(datagram))
        except rt.RtnetlinkError as exc:
            log.warning("malformed rtnetlink datagram dropped", error=str(exc))
            return
        for message in messages:
            if message.type == rt.NLMSG_OVERRUN:
                await self._resync("netlink overrun")
            elif message.type in (rt.Rtm.NEWLINK, rt.Rtm.DELLINK):
                self._link_changed(rt.parse_link(message))
            elif message.type in (rt.Rtm.NEWADDR, rt.Rtm.DELADDR):
                await self._address_changed(rt.parse_addr(message))

    def _link_changed(self, message: rt.LinkMessage) -> None:
        if message.added:
            self._links[message.ifindex] = LinkInfo.from_message(message)
            return
        self._links.pop(message.ifindex, None)
        for key in [key for key in self._known if key[0] == message.ifindex]:
            self._pending.append(IpEvent(False, self._known.pop(key)))

    async def _address_changed(self, message: rt.AddrMessage) -> None:
        if message.address is None:
            return
        key = (message.ifindex, str(message.address))
        if not message.added:
            gone = self._known.pop(key, None)
            if gone is not None:
                self._pending.append(IpEvent(False, gone))
            return
        if key in self._known:
            return  # an update of an address already reported (e.g. IPv6 lifetimes)
        link = self._links.get(message.ifindex)
        if link is None:
            await self._refresh_links()
            link = self._links.get(message.ifindex)
        if link is None or not self._filter(link):
            return
        address = self._interface_address(link, message.address, message.prefixlen)
        self._known[key] = address
        self._pending.append(IpEvent(True, address))

    async def _resync(self, reason: str) -> None:
        self.resyncs += 1
        log.warning("re-enumerating IP addresses", reason=reason)
        current = await self._snapshot()
        for key in [key for key in self._known if key not in current]:
            self._pending.append(IpEvent(False, self._known.pop(key)))
        for key, address in current.items():
            if key not in self._known:
                self._known[key] = address
                self._pending.append(IpEvent(True, address))

    # -- enumeration ---------------------------------------------------------------------
    async def _snapshot(self) -> dict[tuple[int, str], InterfaceAddress]:
        await self._refresh_links()
        found: dict[tuple[int, str], InterfaceAddress] = {}
        for message in await self._dump(rt.Rtm.GETADDR):
            if message.type != rt.Rtm.NEWADDR:
                continue
            entry = rt.parse_addr(message)
            link = self._links.get(entry.ifindex)
            if entry.address is None or link is None or not self._filter(link):
                continue
            key = (entry.ifindex, str(entry.address))
            found[key] = self._interface_address(link, entry.address, entry.prefixlen)
        return found

    async def _refresh_links(self) -> None:
        links = [
            rt.parse_link(message)
            for message in await self._dump(rt.Rtm.GETLINK)
            if message.type == rt.Rtm.NEWLINK
        ]
        self._links = {link.ifindex: LinkInfo.from_message(link) for link in links}

    async def _dump(self, request: rt.Rtm) -> list[rt.NlMessage]:
        async with self._dump_lock:
            for _attempt in range(3):
                try:
                    return await self._dump_once(request)
                except _DumpInterrupted:
                    continue  # the table changed during the dump: ask again
            raise FabricError(f"rtnetlink dump {request.name} kept being interrupted")

    async def _dump_once(self, request: rt.Rtm) -> list[rt.NlMessage]:
        seq = next(self._seq)
        with trio.socket.from_stdlib_socket(self._socket_factory(0)) as sock:
            await sock.send(rt.dump_request(request, seq))
            messages: list[rt.NlMessage] = []
            while True:
                for message in rt.split_messages(await sock.recv(RECV_SIZE)):
                    if message.seq != seq:
                        continue
                    if message.type == rt.NLMSG_DONE:
                        return messages
                    if message.type == rt.NLMSG_ERROR:
                        _raise_dump_error(request, rt.parse_error(message).error)
                    if message.flags & rt.NLM_F_DUMP_INTR:
                        raise _DumpInterrupted
                    messages.append(message)

    def _interface_address(
        self,
        link: LinkInfo,
        address: ipaddress.IPv4Address | ipaddress.IPv6Address,
        prefixlen: int,
    ) -> InterfaceAddress:
        return InterfaceAddress(
            ifname=link.name,
            address=address,
            prefixlen=prefixlen,
            gid=interface_gid(link.hwaddr),
            pkey=self._pkey(link) | FULL_MEMBER,
        )

    def _pkey(self, link: LinkInfo) -> int:
        try:
            return int((self._sysfs_net / link.name / "pkey").read_text().strip(), 16) & 0xFFFF
        except (OSError, ValueError):
            pass
        return link.ipoib_pkey if link.ipoib_pkey is not None else DEFAULT_PKEY


class _DumpInterrupted(Exception):
    pass


def _raise_dump_error(request: rt.Rtm, error: int) -> None:
    code = -error
    if code in (errno.EINTR, errno.EBUSY):
        raise _DumpInterrupted
    raise FabricError(f"rtnetlink dump {request.name} failed: {errno.errorcode.get(code, code)}")

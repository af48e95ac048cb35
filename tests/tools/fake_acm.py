"""A small, deterministic ibacm stand-in for client tests, built on the wire codecs.

It answers RESOLVE (address and path forms, QUERY_SA), PERF_QUERY and EP_QUERY the way the C
daemon shapes its replies (client-protocol.md §5-§7), from a fixed table of hosts and
endpoints, so the real ``ib_acme`` and ours can be run against it and compared. ``mode``
makes it misbehave: ``close`` hangs up without answering, ``garbage`` answers random bytes,
``short`` sends only the first half of a correct answer, ``silent`` never answers,
``trailing`` appends junk after a correct answer. Every request it saw is kept in
``requests``, so tests can also check the bytes a client sent.
"""

from __future__ import annotations

import contextlib
import ipaddress
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from ibacm.wire.client import (
    AcmMessage,
    AcmOp,
    AcmStatus,
    AddrType,
    ClientFramer,
    EpAddr,
    EpConfig,
    EpFlag,
    FramingError,
    decode_ep_request,
    decode_perf_request,
    encode_ep_reply,
    encode_perf_reply,
    encode_query_sa_reply,
    encode_resolve_reply,
)
from ibacm.wire.errors import WireError
from ibacm.wire.path_record import PathRecord

SUBNET = bytes.fromhex("fe80000000000000")


@dataclass(frozen=True)
class FakeHost:
    name: str
    ipv4: str
    ipv6: str
    lid: int

    @property
    def gid(self) -> bytes:
        return SUBNET + (0x0002C90300000000 + self.lid).to_bytes(8, "big")


LOCAL = FakeHost("node1", "10.0.0.1", "fd00::1", 1)
HOSTS = (
    LOCAL,
    FakeHost("node2", "10.0.0.2", "fd00::2", 2),
    FakeHost("node3", "10.0.0.3", "fd00::3", 3),
)
ENDPOINTS = (
    # (index on its port, config)
    (
        1,
        EpConfig(
            0x0002C90300000001,
            1,
            2,
            0xFFFF,
            "ibacmp",
            ["10.0.0.1/16", "fd00::1/64", "node1", "node1-1"],
        ),
    ),
    (1, EpConfig(0x0002C90300000001, 2, 2, 0xFFFF, "ibacmp", ["node1-2"])),
    (2, EpConfig(0x0002C90300000001, 1, 2, 0x8001, "ibacmp", ["node1-3"])),
)
COUNTERS = [0, 12, 1, 2, 0, 3, 8]
EP_COUNTERS = [0, 5, 0, 1, 0, 1, 4]


def find_host(entry: EpAddr) -> FakeHost | None:
    for host in HOSTS:
        if entry.type == AddrType.NAME and entry.address_text() == host.name:
            return host
        if entry.type in (AddrType.IP, AddrType.IP6):
            text = str(ipaddress.ip_address(entry.info[: 4 if entry.type == AddrType.IP else 16]))
            if text in (host.ipv4, host.ipv6):
                return host
    return None


def path_between(source: FakeHost, dest: FakeHost) -> PathRecord:
    """What an SA would answer: reversible, MTU 2048 exactly, 40 Gb/s, lifetime 18."""
    path = PathRecord(dgid=dest.gid, sgid=source.gid, dlid=dest.lid, slid=source.lid)
    path.reversible_numpath = 0x81
    path.pkey = 0xFFFF
    path.mtu_byte = 0x84
    path.rate_byte = 0x87
    path.packetlifetime_byte = 0x92
    path.hop_limit = 0
    return path


@dataclass
class FakeAcm:
    """See the module docstring."""

    path: Path
    mode: str = "respond"
    requests: list[bytes] = field(default_factory=list)
    cached: set[str] = field(default_factory=set)
    override: Callable[[bytes], bytes] | None = None
    """Answer every request with this function instead (hand-made odd replies)."""

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on the unix socket ``path``."""
        listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
        await listener.bind(str(self.path))
        await self._accept(listener, task_status)

    async def serve_tcp(
        self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen on TCP 127.0.0.1 (a free port, handed to ``task_status.started``)."""
        listener = trio.socket.socket(trio.socket.AF_INET, trio.socket.SOCK_STREAM)
        await listener.bind(("127.0.0.1", 0))
        await self._accept(listener, task_status, listener.getsockname()[1])

    async def _accept(
        self, listener: trio.socket.SocketType, task_status: trio.TaskStatus[Any], *started: Any
    ) -> None:
        listener.listen(16)
        task_status.started(*started)
        with listener:
            async with trio.open_nursery() as nursery:
                while True:
                    sock, _ = await listener.accept()
                    nursery.start_soon(self._client, trio.SocketStream(sock))

    async def _client(self, stream: trio.SocketStream) -> None:
        # A client that hangs up mid-conversation (the C tool does, after a bad answer) only
        # ends its own connection, never the server.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            async with stream:
                await self._converse(stream)

    async def _converse(self, stream: trio.SocketStream) -> None:
        framer = ClientFramer()
        while data := await stream.receive_some(65536):
            try:
                framer.feed(data)
                while (frame := framer.next_frame()) is not None:
                    self.requests.append(frame)
                    if not await self._answer(stream, frame):
                        return
            except (FramingError, WireError):
                return

    async def _answer(self, stream: trio.SocketStream, request: bytes) -> bool:
        """Send the answer (or the misbehaviour); False once the connection must end."""
        if self.mode == "close":
            return False
        if self.mode == "silent":
            await trio.sleep_forever()
        reply = self.override(request) if self.override else self.reply(request)
        if self.mode == "garbage":
            reply = bytes(random.Random(len(self.requests)).randrange(256) for _ in range(40))
            reply = b"\xff" + reply
        elif self.mode == "short":
            await stream.send_all(reply[: max(len(reply) // 2, 4)])
            return False
        elif self.mode == "trailing":
            reply += b"\x01\x02\x03"
        await stream.send_all(reply)
        return True

    # -- answers --------------------------------------------------------------------------

    def reply(self, request: bytes) -> bytes:
        op = request[1] & 0x0F
        if op == AcmOp.RESOLVE:
            return self._resolve(AcmMessage.decode(request))
        if op == AcmOp.PERF_QUERY:
            return self._perf(request)
        return self._ep(request)

    def _resolve(self, msg: AcmMessage) -> bytes:
        if msg.entries and msg.entries[0].type == AddrType.PATH:
            return self._resolve_path(msg)
        sources = [e for e in msg.entries if e.is_source]
        dests = [e for e in msg.entries if e.is_dest]
        if len(dests) != 1:
            return encode_resolve_reply(msg.hdr, AcmStatus.EDESTTYPE, ack=True)
        dest = find_host(dests[0])
        source = find_host(sources[0]) if sources else LOCAL
        if sources and source is not LOCAL:
            return encode_resolve_reply(msg.hdr, AcmStatus.ESRCADDR, ack=True)
        if dest is None or source is None:
            return encode_resolve_reply(msg.hdr, AcmStatus.ENODATA)
        key = dests[0].info.hex()
        if dests[0].flags & EpFlag.NODELAY and key not in self.cached:
            self.cached.add(key)
            return encode_resolve_reply(msg.hdr, AcmStatus.ENODATA)
        self.cached.add(key)
        chosen = None
        if not sources:
            chosen = self._chosen_source(dests[0])
        return encode_resolve_reply(msg.hdr, 0, [path_between(source, dest)], chosen)

    @staticmethod
    def _chosen_source(dest: EpAddr) -> EpAddr | None:
        if dest.type == AddrType.IP:
            return EpAddr.from_ip(LOCAL.ipv4, EpFlag.SOURCE)
        if dest.type == AddrType.IP6:
            return EpAddr.from_ip(LOCAL.ipv6, EpFlag.SOURCE)
        return None

    def _resolve_path(self, msg: AcmMessage) -> bytes:
        entry = msg.entries[0]
        path = entry.path()
        if entry.flags & EpFlag.QUERY_SA:
            return encode_query_sa_reply(msg, 0, path)
        dest = next(
            (h for h in HOSTS if (path.dlid and h.lid == path.dlid) or h.gid == path.dgid), None
        )
        if dest is None:
            status = AcmStatus.EDESTADDR if not path.dlid else AcmStatus.ENODATA
            return encode_resolve_reply(msg.hdr, status, ack=not path.dlid)
        return encode_resolve_reply(msg.hdr, 0, [path_between(LOCAL, dest)])

    def _perf(self, request: bytes) -> bytes:
        perf = decode_perf_request(request)
        if perf.source is not None and perf.source.is_source:
            found = find_host(perf.source) is LOCAL
            return encode_perf_reply(perf.hdr, 0 if found else AcmStatus.ESRCADDR, EP_COUNTERS)
        if perf.index == 0:
            return encode_perf_reply(perf.hdr, 0, COUNTERS)
        if perf.index == 1:
            return encode_perf_reply(perf.hdr, 0, EP_COUNTERS)
        return encode_perf_reply(perf.hdr, AcmStatus.ESRCADDR, [])

    def _ep(self, request: bytes) -> bytes:
        ep = decode_ep_request(request)
        for index, config in ENDPOINTS:
            if index == ep.index and config.port_num == ep.port:
                return encode_ep_reply(ep.hdr, 0, config)
        return encode_ep_reply(ep.hdr, AcmStatus.EINVAL, None)

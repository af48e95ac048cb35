"""The client library against a fake daemon: requests, replies, and every way a reply can fail."""

from __future__ import annotations

import errno
import socket
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest
import trio

from ibacm.tools.libacm import (
    DEFAULT_TCP_PORT,
    AcmClient,
    AcmConnectError,
    AcmProtocolError,
    AcmRequestError,
    AcmStatusError,
    PortFileError,
    read_server_port,
)
from ibacm.wire.client import (
    AcmHdr,
    AcmMessage,
    AcmOp,
    AcmStatus,
    EpAddr,
    EpFlag,
    encode_perf_reply,
    encode_resolve_reply,
)
from ibacm.wire.path_record import PathRecord
from tests.tools.fake_acm import (
    COUNTERS,
    ENDPOINTS,
    EP_COUNTERS,
    HOSTS,
    LOCAL,
    FakeAcm,
    path_between,
)

T = TypeVar("T")

IP_2 = socket.inet_pton(socket.AF_INET, "10.0.0.2")
IP_1 = socket.inet_pton(socket.AF_INET, "10.0.0.1")
NOT_LOCAL = "Cannot assign requested address"


async def with_client(fake: FakeAcm, call: Callable[[AcmClient], T], timeout: float = 5.0) -> T:
    def work() -> T:
        with AcmClient.connect(str(fake.path), timeout=timeout) as client:
            return call(client)

    return await trio.to_thread.run_sync(work)


# -- connecting ---------------------------------------------------------------------------


def test_missing_unix_socket_gives_the_errno_as_c_returns_it(tmp_path: Path) -> None:
    with pytest.raises(AcmConnectError) as info:
        AcmClient.connect(str(tmp_path / "none.sock"))
    assert (info.value.ret, info.value.message) == (errno.ENOENT, "No such file or directory")


def test_unix_path_longer_than_sun_path() -> None:
    with pytest.raises(AcmConnectError) as info:
        AcmClient.connect("/" + "x" * 200)
    assert info.value.ret == errno.ENAMETOOLONG


def test_refused_tcp_connect_returns_minus_one() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(AcmConnectError) as info:
        AcmClient.connect("127.0.0.1", port=port)
    assert (info.value.ret, info.value.message) == (-1, "Connection refused")


def test_unknown_host_returns_the_getaddrinfo_code() -> None:
    with pytest.raises(AcmConnectError) as info:
        AcmClient.connect("nosuchhost.invalid")
    assert info.value.ret == socket.EAI_NONAME
    assert info.value.message == "Name or service not known"


def test_port_file(tmp_path: Path) -> None:
    port_file = tmp_path / "ibacm-tcp.port"
    assert read_server_port(port_file) == DEFAULT_TCP_PORT
    port_file.write_text("7777\n")
    assert read_server_port(port_file) == 7777
    for junk in ("", "abc\n", "70000\n", "0\n"):
        port_file.write_text(junk)
        with pytest.raises(PortFileError):
            read_server_port(port_file)


@pytest.mark.trio
async def test_tcp_service_with_its_port(short_dir: Path) -> None:
    fake = FakeAcm(short_dir / "unused.sock")
    async with trio.open_nursery() as nursery:
        port = await nursery.start(fake.serve_tcp)
        counters = await trio.to_thread.run_sync(
            lambda: AcmClient.connect("localhost", port=port).query_perf()
        )
        nursery.cancel_scope.cancel()
    assert counters == COUNTERS


# -- good answers -------------------------------------------------------------------------


@pytest.mark.trio
async def test_resolve_ip_with_a_server_chosen_source(fake: FakeAcm) -> None:
    reply = await with_client(fake, lambda c: c.resolve_ip(None, IP_2))
    assert reply.sources == ("10.0.0.1",)
    assert reply.path == path_between(LOCAL, HOSTS[1])
    assert reply.paths[0].flags == 0x2B
    request = AcmMessage.decode(fake.requests[0])
    assert [(e.flags, e.type) for e in request.entries] == [(EpFlag.DEST, 2)]


@pytest.mark.trio
async def test_resolve_ip_with_source_and_nodelay_sends_two_entries(fake: FakeAcm) -> None:
    with pytest.raises(AcmStatusError):  # a cache-only miss: the fake answers ENODATA
        await with_client(fake, lambda c: c.resolve_ip(IP_1, IP_2, EpFlag.NODELAY))
    request = AcmMessage.decode(fake.requests[0])
    assert [e.flags for e in request.entries] == [EpFlag.SOURCE, EpFlag.DEST | EpFlag.NODELAY]
    assert [e.address_text() for e in request.entries] == ["10.0.0.1", "10.0.0.2"]
    reply = await with_client(fake, lambda c: c.resolve_ip(IP_1, IP_2, EpFlag.NODELAY))
    assert reply.sources == ()  # the client named the source, the daemon adds none


@pytest.mark.trio
async def test_resolve_name(fake: FakeAcm) -> None:
    reply = await with_client(fake, lambda c: c.resolve_name("node1", "node3"))
    assert reply.path.dlid == 3
    assert reply.sources == ()


@pytest.mark.trio
async def test_resolve_path_and_sa_verification(fake: FakeAcm) -> None:
    request = PathRecord(dlid=2)
    request.reversible_numpath = 0x81
    path = await with_client(fake, lambda c: c.resolve_path(request))
    assert (path.dlid, path.slid) == (2, 1)
    checked = await with_client(fake, lambda c: c.resolve_path(path, EpFlag.QUERY_SA))
    assert checked == path
    sent = AcmMessage.decode(fake.requests[-1]).entries[0]
    assert (sent.flags, sent.type, sent.path()) == (EpFlag.QUERY_SA, 0x10, path)


@pytest.mark.trio
async def test_perf_queries(fake: FakeAcm) -> None:
    assert await with_client(fake, lambda c: c.query_perf()) == COUNTERS
    assert await with_client(fake, lambda c: c.query_perf(1)) == EP_COUNTERS
    source = EpAddr.from_ip("10.0.0.1")
    assert await with_client(fake, lambda c: c.query_perf_ep_addr(source)) == EP_COUNTERS
    assert EpAddr.decode(fake.requests[-1][16:88]).flags == EpFlag.SOURCE


@pytest.mark.trio
async def test_endpoint_query(fake: FakeAcm) -> None:
    config = await with_client(fake, lambda c: c.enum_ep(1, 1))
    assert config == ENDPOINTS[0][1]
    assert fake.requests[0] == bytes.fromhex("0103000101000010") + bytes(8)


# -- the daemon says no -------------------------------------------------------------------


@pytest.mark.trio
@pytest.mark.parametrize(
    ("call", "err", "text"),
    [
        (lambda c: c.resolve_name(None, "nodeX"), errno.ENODATA, "No data available"),
        (
            lambda c: c.resolve_ip(IP_2, IP_2),
            errno.EADDRNOTAVAIL,
            "Cannot assign requested address",
        ),
        (lambda c: c.query_perf(7), errno.EADDRNOTAVAIL, NOT_LOCAL),
        (lambda c: c.enum_ep(9, 1), errno.EINVAL, "Invalid argument"),
    ],
)
async def test_failure_status_reads_like_strerror(
    fake: FakeAcm, call: Callable[[AcmClient], object], err: int, text: str
) -> None:
    with pytest.raises(AcmStatusError) as info:
        await with_client(fake, call)
    assert (info.value.errno, info.value.message) == (err, text)


@pytest.mark.trio
async def test_names_longer_than_63_bytes_are_refused_before_sending(fake: FakeAcm) -> None:
    with pytest.raises(AcmRequestError, match="at most 63"):
        await with_client(fake, lambda c: c.resolve_name(None, "n" * 64))
    assert fake.requests == []
    with pytest.raises(AcmStatusError):  # 63 bytes fit; the fake does not know the name
        await with_client(fake, lambda c: c.resolve_name(None, "n" * 63))
    assert AcmMessage.decode(fake.requests[0]).entries[0].address_text() == "n" * 63


# -- the daemon misbehaves ----------------------------------------------------------------


@pytest.mark.trio
@pytest.mark.parametrize(
    ("mode", "fragment"),
    [
        ("close", "closed the connection without answering"),
        ("garbage", "answered garbage: version 255, expected 1"),
        ("short", "closed the connection after 80 bytes of its answer"),
        ("trailing", "answered garbage: 3 unexpected bytes follow the 160-byte"),
    ],
)
async def test_broken_answers_are_errors_not_successes(
    fake: FakeAcm, mode: str, fragment: str
) -> None:
    fake.mode = mode

    def twice(client: AcmClient) -> list[str]:
        messages = []
        for _ in range(2):
            with pytest.raises(AcmProtocolError) as info:
                client.resolve_ip(None, IP_2)
            messages.append(info.value.message)
        return messages

    first, second = await with_client(fake, twice)
    assert fragment in first
    assert second == f"not retried after an earlier failure: {first}"
    assert len(fake.requests) == 1


@pytest.mark.trio
async def test_a_silent_daemon_times_out(fake: FakeAcm) -> None:
    fake.mode = "silent"
    with pytest.raises(AcmProtocolError) as info:
        await with_client(fake, lambda c: c.query_perf(), timeout=0.2)
    assert info.value.errno == errno.ETIMEDOUT
    assert info.value.message == "no answer from the service within 0.2 s"


def _reply_with(entries: list[EpAddr], status: int = 0) -> Callable[[bytes], bytes]:
    def answer(request: bytes) -> bytes:
        hdr = AcmHdr(opcode=AcmOp.RESOLVE, status=status)
        return AcmMessage(hdr=hdr, entries=entries).encode()

    return answer


@pytest.mark.trio
@pytest.mark.parametrize(
    ("answer", "fragment"),
    [
        (_reply_with([]), "carries no path record"),
        (_reply_with([EpAddr.from_name("node1", EpFlag.DEST)]), "reply entry 0 has type 0x1"),
        (
            _reply_with([EpAddr.from_path(PathRecord()), EpAddr.from_lid(5, EpFlag.SOURCE)]),
            "reply entry 1 has type 0x5",
        ),
        (
            lambda req: (
                encode_perf_reply(AcmHdr(opcode=AcmOp.PERF_QUERY), 0, [1])[:3]
                + b"\x07"
                + encode_perf_reply(AcmHdr(opcode=AcmOp.PERF_QUERY), 0, [1])[4:]
            ),
            "opcode 0x82 answers a RESOLVE request",
        ),
        (
            lambda req: encode_resolve_reply(AcmHdr(tid=9), AcmStatus.ENODATA),
            "the answer carries tid 0x9",
        ),
    ],
)
async def test_malformed_resolve_answers(
    fake: FakeAcm, answer: Callable[[bytes], bytes], fragment: str
) -> None:
    fake.override = answer
    with pytest.raises(AcmProtocolError, match=fragment):
        await with_client(fake, lambda c: c.resolve_ip(None, IP_2))


@pytest.mark.trio
async def test_perf_answer_whose_count_disagrees_with_its_length(fake: FakeAcm) -> None:
    def answer(request: bytes) -> bytes:
        reply = bytearray(encode_perf_reply(AcmHdr(opcode=AcmOp.PERF_QUERY), 0, [1, 2]))
        reply[3] = 7  # claims 7 counters, carries 2
        return bytes(reply)

    fake.override = answer
    with pytest.raises(AcmProtocolError, match="announces 7 counters but 2 follow"):
        await with_client(fake, lambda c: c.query_perf())

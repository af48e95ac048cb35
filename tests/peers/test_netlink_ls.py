"""The kernel local SA service (RDMA_NL_LS), with a socket pair standing in for the kernel.

This kernel has no NETLINK_RDMA, so the "kernel" is the other end of an AF_UNIX datagram
socket pair; the bytes are the kernel's (built with the netlink codec, and checked against
the example in behavior.md §16.6).
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from collections.abc import AsyncIterator

import pytest
import trio
import trio.testing

from ibacm.core.netlink_ls import (
    REQUESTED_TIMEOUT_MS,
    LsService,
    open_ls_socket,
    serve_netlink,
)
from ibacm.provider.api import ResolveResult
from ibacm.wire.client import AcmStatus, EpFlag
from ibacm.wire.netlink import (
    NLA_F_MANDATORY,
    LsErrorReply,
    LsIpResolveReply,
    LsPathReply,
    LsSetTimeout,
    NlMsgHdr,
    PathUse,
    decode_ls_message,
    encode_ls_ip_resolve_request,
    encode_ls_path_reply,
    encode_ls_resolve_request,
    encode_ls_set_timeout,
)
from ibacm.wire.path_record import PathRecord
from tests.conftest import SPEC, not_applicable, require_file

DGID = bytes.fromhex("fe800000000000000002c903000a2b3d")
SGID = bytes.fromhex("fe800000000000000002c903000a2b3c")
PID = 1234


def spec_blocks() -> list[bytes]:
    """The hex blocks of behavior.md §16.6 (request, success reply) and the error reply."""
    text = require_file(SPEC / "behavior.md").read_text()
    section = text[text.index("### 16.6") : text.index("## 17.")]
    blocks = []
    for block in re.findall(r"```\n(.*?)```", section, re.S):
        data = bytearray()
        for line in block.splitlines():
            for token in line.split(":", 1)[1].split():
                if not re.fullmatch(r"[0-9a-f]{2}", token):
                    break
                data.append(int(token, 16))
        blocks.append(bytes(data))
    inline = re.search(r"Error reply: `([0-9a-f ]+)`", section)
    assert inline is not None
    blocks.append(bytes.fromhex(inline.group(1)))
    return blocks


def spec_request(path_use: int = PathUse.GMP, **overrides: object) -> bytes:
    fields: dict[str, object] = dict(
        service_id=0x1061234, dgid=DGID, sgid=SGID, tclass=0, pkey=0xFFFF
    )
    fields.update(overrides)
    return encode_ls_resolve_request(42, "mlx5_0", 1, path_use, **fields)  # type: ignore[arg-type]


def spec_path() -> PathRecord:
    """The record of the §16.6 success reply (what the SA/cache gave the daemon)."""
    reply = spec_blocks()[1]
    return PathRecord.decode(reply[16 + 4 + 8 : 16 + 4 + 8 + 64])


class Resolver:
    def __init__(self, result: ResolveResult, delay: float = 0.0) -> None:
        self.result = result
        self.delay = delay
        self.calls: list[tuple[PathRecord, EpFlag]] = []

    async def __call__(self, path: PathRecord, flags: EpFlag) -> ResolveResult:
        self.calls.append((path, flags))
        await trio.sleep(self.delay)
        return self.result


def ok(*paths: PathRecord) -> ResolveResult:
    return ResolveResult(AcmStatus.SUCCESS, paths)


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


# -- LsService, sans sockets -------------------------------------------------------------------


@pytest.mark.trio
async def test_the_spec_request_gets_the_spec_reply_byte_for_byte() -> None:
    _request, reply, _error = spec_blocks()
    resolver = Resolver(ok(spec_path()))
    service = LsService(resolver, pid=PID)
    assert await service.handle(spec_request()) == [reply]
    ((path, flags),) = resolver.calls
    assert (path.dgid, path.sgid, path.service_id, path.pkey) == (DGID, SGID, 0x1061234, 0xFFFF)
    assert path.reversible_numpath == 0x81  # GMP: reversible, one path
    assert flags == EpFlag.DEST | EpFlag.SOURCE


@pytest.mark.trio
async def test_the_spec_request_bytes_are_what_the_codec_builds() -> None:
    request = spec_blocks()[0]
    built = spec_request()
    assert len(built) == 152
    # The spec abbreviates the device name; every byte it shows must match.
    assert built[:0x17] == request[:0x17]
    assert built[0x50:] == request[0x17:]


@pytest.mark.trio
async def test_failures_get_the_spec_error_reply() -> None:
    error = spec_blocks()[2]
    service = LsService(Resolver(ResolveResult(AcmStatus.ENODATA)), pid=PID)
    assert await service.handle(spec_request()) == [error]
    empty = LsService(Resolver(ok()), pid=PID)
    assert await empty.handle(spec_request()) == [error]
    assert (service.failed, empty.failed) == (1, 1)


@pytest.mark.trio
async def test_unidirectional_queries_get_outbound_flags_and_no_reversible_bit() -> None:
    resolver = Resolver(ok(spec_path()))
    service = LsService(resolver, pid=PID)
    (reply,) = await service.handle(spec_request(PathUse.UNIDIRECTIONAL))
    decoded = decode_ls_message(reply)
    assert isinstance(decoded, LsPathReply)
    assert decoded.paths[0][0] == 0x0A
    assert resolver.calls[0][0].reversible_numpath == 0x01


@pytest.mark.trio
async def test_every_path_is_returned_the_first_as_primary() -> None:
    second = PathRecord(dgid=DGID, sgid=SGID, dlid=7, slid=3, pkey=0xFFFF)
    service = LsService(Resolver(ok(spec_path(), second)), pid=PID)
    (reply,) = await service.handle(spec_request(PathUse.ALL))
    decoded = decode_ls_message(reply)
    assert isinstance(decoded, LsPathReply)
    assert [(flags, path.dlid) for flags, path in decoded.paths] == [(0x2B, 5), (0x2D, 7)]


@pytest.mark.trio
async def test_qos_class_is_shifted_into_place() -> None:
    resolver = Resolver(ok(spec_path()))
    await LsService(resolver, pid=PID).handle(spec_request(qos_class=0x123))
    assert resolver.calls[0][0].qos_class == 0x123  # C masked it with 0xFFF0 (defect 48)


@pytest.mark.trio
async def test_attribute_rules_of_the_kernel_protocol() -> None:
    error = spec_blocks()[2]
    resolver = Resolver(ok(spec_path()))
    service = LsService(resolver, pid=PID)
    unknown_mandatory = spec_request(extra_attrs=[(NLA_F_MANDATORY | 0x1F, bytes(4))])
    assert await service.handle(unknown_mandatory) == [error]
    # An unknown optional attribute is skipped, and large messages are fine (C: > 592 dropped).
    padding = [(0x1E, bytes(200))] * 3
    (reply,) = await service.handle(spec_request(extra_attrs=padding))
    assert len(spec_request(extra_attrs=padding)) > 592
    assert isinstance(decode_ls_message(reply), LsPathReply)


@pytest.mark.trio
async def test_messages_that_are_not_ls_requests_are_dropped() -> None:
    service = LsService(Resolver(ok(spec_path())), pid=PID)
    request = spec_request()
    other_client = request[:4] + (0x1400).to_bytes(2, "little") + request[6:]
    assert await service.handle(other_client) == []
    assert await service.handle(request[:10]) == []
    assert await service.handle(request[:16] + b"") == []  # nlmsg_len beyond the datagram
    hdr = NlMsgHdr(type=0x1000, seq=42)
    seen_reply = encode_ls_path_reply(hdr, [(0x2B, spec_path())], pid=99)
    assert await service.handle(seen_reply) == []  # another service's answer on the group


@pytest.mark.trio
async def test_ip_resolve_answers_with_the_gid() -> None:
    seen: list[object] = []

    async def resolve_ip(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ResolveResult:
        seen.append(address)
        return ok(PathRecord(dgid=DGID))

    request = encode_ls_ip_resolve_request(7, 3, "192.168.1.20")
    service = LsService(Resolver(ok()), resolve_ip=resolve_ip, pid=PID)
    (reply,) = await service.handle(request)
    decoded = decode_ls_message(reply)
    assert isinstance(decoded, LsIpResolveReply)
    assert decoded.gids == [DGID] and decoded.hdr.seq == 7
    assert seen == [ipaddress.IPv4Address("192.168.1.20")]
    without = LsService(Resolver(ok()), pid=PID)
    (refused,) = await without.handle(request)
    assert isinstance(decode_ls_message(refused), LsErrorReply)


@pytest.mark.trio
async def test_a_timeout_set_by_another_service_is_followed() -> None:
    service = LsService(Resolver(ok()), pid=PID)
    assert await service.handle(encode_ls_set_timeout(1, 5000, pid=77)) == []
    assert service.kernel_timeout_ms == 5000
    await service.handle(encode_ls_set_timeout(2, 10, pid=77))
    assert service.kernel_timeout_ms == 100  # the kernel's lower clamp


@pytest.mark.trio
async def test_a_slow_resolution_is_answered_with_an_error_before_the_kernel_gives_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    service = LsService(Resolver(ok(spec_path()), delay=60), pid=PID)
    assert service.kernel_timeout_ms == 2000  # the kernel default until SET_TIMEOUT
    start = trio.current_time()
    (reply,) = await service.handle(spec_request())
    assert isinstance(decode_ls_message(reply), LsErrorReply)
    assert trio.current_time() - start == pytest.approx(1.8)  # 10% kept in reserve
    assert service.late == 1
    service.timeout_sent()
    start = trio.current_time()
    await service.handle(spec_request())
    assert trio.current_time() - start == pytest.approx(REQUESTED_TIMEOUT_MS * 0.9 / 1000)


# -- serve_netlink over a socket pair ------------------------------------------------------------


@pytest.fixture
async def kernel_pair() -> AsyncIterator[tuple[trio.socket.SocketType, trio.socket.SocketType]]:
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with trio.socket.from_stdlib_socket(ours) as a, trio.socket.from_stdlib_socket(kernel) as b:
        yield a, b


@pytest.mark.trio
async def test_serve_announces_its_timeout_then_answers_concurrently(
    kernel_pair: tuple[trio.socket.SocketType, trio.socket.SocketType],
) -> None:
    ours, kernel = kernel_pair
    fast = spec_path()
    slow_ids: set[int] = set()

    async def resolver(path: PathRecord, flags: EpFlag) -> ResolveResult:
        if path.dgid == SGID:  # the "slow" destination
            slow_ids.add(1)
            await trio.sleep(0.3)
        return ok(fast)

    service = LsService(resolver, pid=PID)
    async with trio.open_nursery() as nursery:
        await nursery.start(serve_netlink, ours, service)
        announce = decode_ls_message(await kernel.recv(4096))
        assert isinstance(announce, LsSetTimeout)
        assert announce.timeout_ms == REQUESTED_TIMEOUT_MS
        assert announce.hdr.pid == PID
        assert service.kernel_timeout_ms == REQUESTED_TIMEOUT_MS
        slow = encode_ls_resolve_request(1, "mlx5_0", 1, PathUse.GMP, dgid=SGID, sgid=DGID)
        await kernel.send(slow)
        await kernel.send(spec_request())
        with trio.fail_after(2):
            first = decode_ls_message(await kernel.recv(4096))
            second = decode_ls_message(await kernel.recv(4096))
        nursery.cancel_scope.cancel()
    assert [first.hdr.seq, second.hdr.seq] == [42, 1]  # the fast one did not wait
    assert slow_ids == {1}


@pytest.mark.trio
async def test_this_kernel_has_no_rdma_netlink_and_says_so() -> None:
    try:
        sock = open_ls_socket()
    except OSError as exc:
        assert exc.errno == errno.EPROTONOSUPPORT  # a warning for the daemon, not a failure
        return
    sock.close()
    not_applicable("this kernel has NETLINK_RDMA")


@pytest.mark.trio
async def test_an_inherited_socket_is_adopted() -> None:
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    adopted = open_ls_socket(ours)
    try:
        assert adopted.fileno() == ours.fileno()
        kernel.send(b"x")
        assert await adopted.recv(10) == b"x"
    finally:
        adopted.close()
        kernel.close()

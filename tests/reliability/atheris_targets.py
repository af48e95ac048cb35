"""Coverage-guided fuzz targets (atheris) for the pure decoders, the config parsers and the
provider's MAD handler (``acmp_handler``: see ``mad_handler_target``).

Each target takes one ``bytes`` input, feeds it to one decoder the way the daemon (or a tool)
does, and lets through only the errors that decoder documents: ``WireError`` and its
subclasses for the wire codecs, ``AdminProtocolError`` for the admin protocol, nothing at all
for the config parsers ("never raises for bad content"). Any other exception is a crash. Where
a cheap second opinion exists, the target also checks it (framing in one piece or in chunks
gives the same frames; a table decodes like its 64-byte slices; ...), so a wrong answer is a
crash too.

``seeds(name)`` gives a target's starting corpus: the real client captures beside the
repository (when present) and what the codecs' own encoders produce. This module needs
neither atheris nor pytest; ``tests.reliability.atheris_fuzz`` runs the targets.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ibacm.config.addr_file import parse_addr_file
from ibacm.config.hosts_file import parse_hosts_file
from ibacm.config.option_file import parse_options
from ibacm.config.opts_template import render_opts_file
from ibacm.config.route_file import parse_route_file
from ibacm.core.dispatch import Dispatcher
from ibacm.fabric.api import IpAddress
from ibacm.provider.api import Counters
from ibacm.wire import admin
from ibacm.wire.acm_mad import AcmMad, acm_request, acm_response, mgid_for
from ibacm.wire.client import (
    HDR_LEN,
    AcmHdr,
    AcmMessage,
    AcmOp,
    AcmStatus,
    ClientFramer,
    EpAddr,
    EpConfig,
    EpFlag,
    FramingError,
    FramingFault,
    decode_ep_reply,
    decode_ep_request,
    decode_perf_reply,
    decode_perf_request,
    decode_resolve_pair,
    encode_ep_reply,
    encode_ep_request,
    encode_perf_reply,
    encode_perf_request,
    encode_resolve_reply,
)
from ibacm.wire.erf import (
    ErfRecord,
    UdPacket,
    erf_infiniband_record,
    erf_timestamp,
    parse_pcap,
    pcap_file_header,
    ud_packet,
)
from ibacm.wire.errors import WireError
from ibacm.wire.mad import (
    MAD_SIZE,
    MC_MEMBER_RECORD_LEN,
    McMemberRecord,
    RmppReassembler,
    SaMad,
    build_mc_join,
    build_path_get,
    build_path_get_table,
    build_sa_response,
    split_rmpp,
)
from ibacm.wire.netlink import (
    LsOp,
    LsRequestError,
    NlMsgHdr,
    decode_ls_message,
    encode_ls_error_reply,
    encode_ls_ip_resolve_reply,
    encode_ls_ip_resolve_request,
    encode_ls_path_reply,
    encode_ls_resolve_request,
    encode_ls_set_timeout,
    ls_type,
    walk_attrs,
)
from ibacm.wire.path_record import PATH_RECORD_LEN, PathRecord
from tests.reliability.mad_handler_target import HandlerRig, handler_seeds

T = TypeVar("T")
Target = Callable[[bytes], None]

REPO = Path(__file__).resolve().parents[2]
CAPTURES = REPO.parent / "shared" / "captures" / "client-requests"
CONTRIB = REPO / "contrib"
CLIENT = "fuzz"
GID_A = bytes.fromhex("fe800000000000000008f10500200001")
GID_B = bytes.fromhex("fe800000000000000008f10500200011")


class FuzzFailure(AssertionError):
    """A decoder answered, but wrongly (the second opinion disagrees)."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise FuzzFailure(message)


def text_of(data: bytes) -> str:
    """How the daemon turns a file's bytes into text."""
    return data.decode("utf-8", "surrogateescape")


# -- client protocol -------------------------------------------------------------------------


def _frames(pieces: Iterable[bytes], replies: bool) -> tuple[list[bytes], FramingFault | None]:
    """Frame a stream that arrives in ``pieces``: the frames and the fault, if any."""
    framer = ClientFramer(replies=replies)
    frames: list[bytes] = []
    try:
        for piece in pieces:
            framer.feed(piece)
            while (frame := framer.next_frame()) is not None:
                frames.append(frame)
    except FramingError as exc:
        return frames, exc.fault
    return frames, None


def _cut(data: bytes) -> list[bytes]:
    """``data`` in up to five pieces, cut where its first bytes say."""
    if len(data) < 2:
        return [data]
    cuts = sorted({byte * len(data) // 256 for byte in data[:4]} | {0, len(data)})
    return [data[start:end] for start, end in itertools.pairwise(cuts)]


def client_framer(data: bytes) -> None:
    """Both framers (server and client side): whole or in pieces, the same frames."""
    pieces = _cut(data)
    for replies in (False, True):
        whole = _frames([data], replies)
        check(whole == _frames(pieces, replies), f"pieces frame differently ({replies=})")
        frames, _ = whole
        check(sum(map(len, frames)) <= len(data), "frames hold more bytes than were fed")
        for frame in frames:
            AcmHdr.decode(frame)


def client_message(data: bytes) -> None:
    """AcmMessage.decode and the fast two-entry decoder agree."""
    pair = decode_resolve_pair(data)
    try:
        message = AcmMessage.decode(data)
    except WireError:
        return
    if pair is not None and message.hdr.length == len(data):
        check(tuple(message.entries) == pair, "decode_resolve_pair disagrees with AcmMessage")
    for entry in message.entries:
        with contextlib.suppress(WireError):
            entry.path()
        with contextlib.suppress(WireError):
            entry.address_text()


def perf_request(data: bytes) -> None:
    with contextlib.suppress(WireError):
        request = decode_perf_request(data)
        request.scope  # noqa: B018 - the property reads the decoded SOURCE entry


def ep_request(data: bytes) -> None:
    with contextlib.suppress(WireError):
        decode_ep_request(data)


def client_replies(data: bytes) -> None:
    """What ib_acme and librdmacm decode from the daemon."""
    with contextlib.suppress(WireError):
        decode_perf_reply(data)
    with contextlib.suppress(WireError):
        decode_ep_reply(data)
    with contextlib.suppress(WireError):
        EpConfig.decode(data)


def _run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine that must not wait: no port is up, so nothing can block."""
    try:
        coro.send(None)
    except StopIteration as done:
        result: T = done.value
        return result
    coro.close()
    raise FuzzFailure("the dispatcher waited although no port is up")


async def _no_route(dest: IpAddress, scope_id: int) -> IpAddress:
    """Source-selection probe without sockets: the kernel knows no route."""
    raise OSError(errno.ENETUNREACH, "Network is unreachable")


def _check_reply(request_head: bytes, reply: bytes) -> None:
    """A reply is one whole frame for a client, with the request's tid."""
    frames, fault = _frames([reply], replies=True)
    check(fault is None and len(frames) == 1, f"reply does not frame: {reply[:32].hex()}")
    tid = AcmHdr.decode(request_head.ljust(HDR_LEN, b"\0")).tid
    check(AcmHdr.decode(reply).tid == tid, "reply tid differs from the request's")


def make_dispatcher_target() -> Target:
    """The daemon's answer to a client stream, as the client loop and ``ClientServer`` give
    it, from a real ``Dispatcher`` on a node whose ports are not up yet (no provider, no I/O)."""
    dispatcher = Dispatcher([], Counters(), _no_route)

    def answer(frame: bytes) -> None:
        try:
            reply = dispatcher.answer_now(frame)
            if reply is None:
                reply = _run_sync(dispatcher.resolve(frame, CLIENT))
        except WireError:
            return  # framed but not decodable: the daemon closes the connection
        _check_reply(frame, reply)

    def target(data: bytes) -> None:
        framer = ClientFramer()
        try:
            framer.feed(data)
            while (frame := framer.next_frame()) is not None:
                answer(frame)
        except FramingError as exc:
            if exc.fault is FramingFault.BAD_LENGTH:
                head = framer.head(HDR_LEN)
                reply = dispatcher.undersized_resolve(head)
                if reply is not None:
                    _check_reply(head, reply)

    return target


# -- MADs --------------------------------------------------------------------------------------


def sa_mad(data: bytes) -> None:
    """An SA answer read as the provider reads it: PathRecord table or MCMemberRecord."""
    try:
        reply = SaMad.decode(data)
    except WireError:
        return
    with contextlib.suppress(WireError):
        stride, count = reply.record_layout(PATH_RECORD_LEN)
        PathRecord.decode_table(reply.data, stride, count)
    with contextlib.suppress(WireError):
        McMemberRecord.decode(reply.data[:MC_MEMBER_RECORD_LEN])


def rmpp(data: bytes) -> None:
    """Segments (256-byte slices, the last padded) through one reassembler."""
    reassembler = RmppReassembler()
    for start in range(0, len(data), MAD_SIZE):
        segment = data[start : start + MAD_SIZE].ljust(MAD_SIZE, b"\0")
        try:
            whole = reassembler.feed(segment)
        except WireError:
            check(not reassembler.in_progress, "a refused segment left a transfer open")
            continue
        if whole is not None:
            sa_mad(whole)


def acm_mad(data: bytes) -> None:
    """ACM MADs: a decoded MAD encodes to the same 256 bytes."""
    try:
        mad = AcmMad.decode(data)
    except WireError:
        return
    with contextlib.suppress(WireError):
        again = mad.encode()
        check(AcmMad.decode(again) == mad, "an ACM MAD changes over encode/decode")


def path_record(data: bytes) -> None:
    """One record round-trips; a table decodes like its slices."""
    with contextlib.suppress(WireError):
        record = PathRecord.decode(data[:PATH_RECORD_LEN])
        check(record.encode() == data[:PATH_RECORD_LEN], "a PathRecord changes over decode")
    stride = PATH_RECORD_LEN + 8 * (data[0] % 4 if data else 0)
    count = len(data) // stride if data else 0
    try:
        table = PathRecord.decode_table(data, stride, count)
    except WireError:
        return
    for index, record in enumerate(table):
        start = index * stride
        alone = PathRecord.decode(data[start : start + PATH_RECORD_LEN])
        check(record == alone, f"table record {index} differs from its slice")


# -- netlink, ERF, admin -------------------------------------------------------------------


def netlink(data: bytes) -> None:
    """A kernel datagram as the LS service reads it; a refused request still gets its
    error reply."""
    with contextlib.suppress(WireError):
        walk_attrs(data)
    try:
        message = decode_ls_message(data)
    except LsRequestError as exc:
        encode_ls_error_reply(exc.hdr, 1)
        return
    except WireError:
        return
    to_path = getattr(message, "to_path", None)
    if to_path is not None:
        try:
            to_path()
        except LsRequestError as exc:
            encode_ls_error_reply(exc.hdr, 1)
    with contextlib.suppress(WireError):
        getattr(message, "address", None)


def erf(data: bytes) -> None:
    """pcap files, ERF records and the IB packets in them (with and without CRC checks)."""
    with contextlib.suppress(WireError):
        parse_pcap(data)
    with contextlib.suppress(WireError):
        record = ErfRecord.decode(data)
        check(record.encode() == data, "an ERF record changes over decode/encode")
    for verify in (True, False):
        with contextlib.suppress(WireError):
            UdPacket.decode(data, verify_crcs=verify)


def admin_protocol(data: bytes) -> None:
    """Lines as the admin server and its clients split and parse them."""
    lines = admin.LineBuffer(admin.MAX_REQUEST_LINE).feed(data)
    for line in lines:
        if isinstance(line, admin.LineTooLong):
            continue
        with contextlib.suppress(admin.AdminProtocolError):
            admin.encode_request(admin.parse_request(line))
        with contextlib.suppress(admin.AdminProtocolError):
            admin.parse_server_message(line)


# -- config files (never raise) ----------------------------------------------------------------


def options_file(data: bytes) -> None:
    options, _ = parse_options(text_of(data), "fuzz.cfg")
    options.summary("fuzz.cfg", "addr.cfg")
    again, _ = parse_options(render_opts_file(options), "rendered.cfg")
    check(again.timeout == options.timeout, "the rendered option file reads differently")


def addr_file(data: bytes) -> None:
    for support_ips in (False, True):
        entries, _ = parse_addr_file(text_of(data), "addr.cfg", support_ips)
        check(all(1 <= entry.port <= 255 for entry in entries), "address entry port range")


def hosts_file(data: bytes) -> None:
    hosts, _ = parse_hosts_file(text_of(data), "hosts.data")
    check(all(len(host.gid) == 16 for host in hosts), "a hosts entry without a 16-byte GID")


def route_file(data: bytes) -> None:
    dump, _ = parse_route_file(text_of(data), "route.data")
    dump.section_for(0x0008F10500200001, 2)
    for section in dump.sections:
        check(all(0 < path.dlid < 0xC000 for path in section.paths), "route DLID range")


# -- the provider's MAD handler ------------------------------------------------------------------


def make_acmp_handler_target() -> Target:
    """Received MADs through a live provider (mad_handler_target): ACM MADs through
    ``AcmpEndpoint.receive_mad``, SA MADs as the SA's answer to its route query or GetTable."""
    return HandlerRig().feed


def acmp_handler_seeds() -> list[bytes]:
    rig = HandlerRig()
    try:
        return handler_seeds(rig)
    finally:
        rig.close()


# -- registry and seeds ------------------------------------------------------------------------


@dataclass(frozen=True)
class FuzzTarget:
    make: Callable[[], Target]
    """Builds the target (fresh state per fuzzing process)."""
    seeds: Callable[[], list[bytes]]


def captured() -> list[bytes]:
    """The real client requests (ib_acme, librdmacm) kept beside the repository, if any."""
    if not CAPTURES.is_dir():
        return []
    return [data for path in sorted(CAPTURES.glob("*.bin")) if (data := path.read_bytes())]


def client_seeds() -> list[bytes]:
    resolve = AcmMessage(
        hdr=AcmHdr(opcode=AcmOp.RESOLVE, tid=7),
        entries=[EpAddr.from_name("node1", EpFlag.SOURCE), EpAddr.from_name("node2", EpFlag.DEST)],
    ).encode()
    path_form = AcmMessage(
        hdr=AcmHdr(opcode=AcmOp.RESOLVE),
        entries=[EpAddr.from_path(PathRecord(dgid=GID_B, sgid=GID_A, dlid=3, slid=2), 0)],
    ).encode()
    generated = [
        resolve,
        path_form,
        encode_perf_request(),
        encode_perf_request(1, tid=3),
        encode_perf_request(source=EpAddr.from_name("node1", EpFlag.SOURCE)),
        encode_ep_request(1),
        encode_ep_request(2, 1, tid=9),
    ]
    return [*captured(), *generated, b"".join(generated)]


def reply_seeds() -> list[bytes]:
    hdr = AcmHdr(opcode=AcmOp.PERF_QUERY, tid=5)
    config = EpConfig(0x0008F10500200001, 1, 1, 0xFFFF, "ibacmp", ["node1", "192.168.10.1"])
    return [
        encode_perf_reply(hdr, AcmStatus.SUCCESS, list(range(7))),
        encode_ep_reply(AcmHdr(opcode=AcmOp.EP_QUERY), AcmStatus.SUCCESS, config),
        encode_resolve_reply(AcmHdr(opcode=AcmOp.RESOLVE), AcmStatus.SUCCESS, [sample_path()]),
        config.encode(),
    ]


def sample_path() -> PathRecord:
    return PathRecord(
        dgid=GID_B, sgid=GID_A, dlid=3, slid=2, reversible=True, numb_path=1, pkey=0xFFFF,
        mtu_selector=2, mtu=5, rate_selector=2, rate=16, packet_life_selector=2, packet_life=18,
    )  # fmt: skip


def mad_seeds() -> list[bytes]:
    path = sample_path()
    table_request = SaMad.decode(build_path_get_table(11, path))
    table = build_sa_response(table_request, 0, b"".join(path.encode() for _ in range(6)))
    single = build_sa_response(SaMad.decode(build_path_get(12, path)), 0, path.encode())
    join = build_mc_join(13, McMemberRecord(mgid=mgid_for(0xFFFF, 16, 5), port_gid=GID_A))
    return [*split_rmpp(table), single, join, build_sa_response(SaMad.decode(join), 0, b"")]


def rmpp_seeds() -> list[bytes]:
    segments = mad_seeds()
    return [b"".join(segments[:-3]), *segments[-3:]]


def acm_mad_seeds() -> list[bytes]:
    mgid = mgid_for(0xFFFF, 16, 5)
    return [
        acm_request(7, 1, b"node1", 1, b"node3", [mgid]).encode(),
        acm_request(8, 2, bytes(range(4)), 3, GID_A, [mgid, mgid]).encode(),
        acm_response(9, mgid).encode(),
        acm_response(10, mgid, 3).encode(),
    ]


def path_record_seeds() -> list[bytes]:
    record = sample_path().encode()
    return [record, b"\0" + record[1:] + record]


def netlink_seeds() -> list[bytes]:
    path = sample_path()
    request = encode_ls_resolve_request(
        1, "mlx5_0", 1, 0, service_id=0x10, dgid=GID_B, sgid=GID_A, tclass=0, pkey=0xFFFF,
        qos_class=2, timeout_ms=2000, pid=0,
    )  # fmt: skip
    hdr = NlMsgHdr(type=ls_type(LsOp.RESOLVE), seq=1)
    return [
        request,
        encode_ls_resolve_request(2, "mlx5_0", 1, 1, dgid=GID_B),
        encode_ls_ip_resolve_request(3, 2, "192.168.10.2"),
        encode_ls_ip_resolve_request(4, 2, "fd00:10::2"),
        encode_ls_path_reply(hdr, [(1, path)], 0),
        encode_ls_error_reply(hdr, 0),
        encode_ls_set_timeout(5, 2000, 0),
        encode_ls_ip_resolve_reply(hdr, [GID_B], 0),
    ]


def erf_seeds() -> list[bytes]:
    mad = acm_mad_seeds()[0]
    packet = ud_packet(mad, slid=2, dlid=3, dest_qp=1, src_qp=1, qkey=0x80010000, pkey=0xFFFF)
    record = ErfRecord(erf_timestamp(1.5), packet).encode()
    return [packet, record, pcap_file_header() + erf_infiniband_record(2.25, packet)]


def admin_seeds() -> list[bytes]:
    requests = [
        admin.Request(admin.Command.HELLO, 1, {"versions": [1]}),
        admin.Request(admin.Command.SNAPSHOT, "a", {}),
    ]
    replies = [
        admin.encode_reply(admin.ok_reply(1, {"version": 1})),
        admin.encode_reply(admin.error_reply(2, "no", admin.ErrorCode.BAD_REQUEST)),
    ]
    return [b"".join(admin.encode_request(request) for request in requests), *replies]


def text_seeds(*names: str) -> Callable[[], list[bytes]]:
    def read() -> list[bytes]:
        return [path.read_bytes() for name in names if (path := CONTRIB / name).is_file()]

    return read


TARGETS: dict[str, FuzzTarget] = {
    "client_framer": FuzzTarget(lambda: client_framer, client_seeds),
    "client_message": FuzzTarget(lambda: client_message, client_seeds),
    "perf_request": FuzzTarget(lambda: perf_request, client_seeds),
    "ep_request": FuzzTarget(lambda: ep_request, client_seeds),
    "client_replies": FuzzTarget(lambda: client_replies, reply_seeds),
    "dispatcher": FuzzTarget(make_dispatcher_target, client_seeds),
    "sa_mad": FuzzTarget(lambda: sa_mad, mad_seeds),
    "rmpp": FuzzTarget(lambda: rmpp, rmpp_seeds),
    "acm_mad": FuzzTarget(lambda: acm_mad, acm_mad_seeds),
    "acmp_handler": FuzzTarget(make_acmp_handler_target, acmp_handler_seeds),
    "path_record": FuzzTarget(lambda: path_record, path_record_seeds),
    "netlink": FuzzTarget(lambda: netlink, netlink_seeds),
    "erf": FuzzTarget(lambda: erf, erf_seeds),
    "admin": FuzzTarget(lambda: admin_protocol, admin_seeds),
    "options": FuzzTarget(lambda: options_file, text_seeds("ibacm_opts.cfg")),
    "addr_file": FuzzTarget(lambda: addr_file, text_seeds("ibacm_addr.cfg")),
    "hosts_file": FuzzTarget(lambda: hosts_file, text_seeds("ibacm_hosts.data")),
    "route_file": FuzzTarget(lambda: route_file, text_seeds("ibacm_route.data")),
}


def seeds(name: str) -> list[bytes]:
    return TARGETS[name].seeds()


def iter_targets() -> Iterator[tuple[str, Target]]:
    """Every target, freshly built (for in-process checks)."""
    for name, entry in TARGETS.items():
        yield name, entry.make()

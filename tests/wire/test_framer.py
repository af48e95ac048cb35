"""ClientFramer: fragmented and pipelined streams, and a dead framer after bad input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.wire.client import (
    AcmHdr,
    AcmMessage,
    AcmOp,
    ClientFramer,
    EpAddr,
    EpConfig,
    EpFlag,
    FramingError,
    FramingFault,
    encode_ep_reply,
    encode_ep_request,
    encode_perf_reply,
    encode_perf_request,
    encode_resolve_reply,
)
from ibacm.wire.path_record import PathRecord
from tests.wire.strategies import acm_messages


def resolve_request(*names: str) -> bytes:
    entries = [EpAddr.from_name(name, EpFlag.DEST) for name in names]
    return AcmMessage(hdr=AcmHdr(opcode=AcmOp.RESOLVE), entries=entries).encode()


requests = st.one_of(
    acm_messages.map(lambda message: message.encode()).filter(lambda raw: raw[1] == 0x01),
    st.integers(0, 255).map(lambda index: encode_perf_request(index)),
    st.just(encode_perf_request(0, EpAddr.from_ip("10.0.0.1", EpFlag.SOURCE))),
    st.tuples(st.integers(0, 255), st.integers(0, 255)).map(
        lambda pair: encode_ep_request(pair[0], pair[1])
    ),
)


def frames_of(framer: ClientFramer) -> list[bytes]:
    frames = []
    while (frame := framer.next_frame()) is not None:
        frames.append(frame)
    return frames


@given(st.lists(requests, min_size=1, max_size=6), st.data())
@settings(max_examples=200)
def test_random_fragmentation_of_pipelined_requests(
    messages: list[bytes], data: st.DataObject
) -> None:
    stream = b"".join(messages)
    cuts = sorted(data.draw(st.sets(st.integers(1, len(stream) - 1), max_size=20)))
    framer = ClientFramer()
    received: list[bytes] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        framer.feed(stream[start:end])
        received.extend(frames_of(framer))
    assert received == messages
    assert framer.buffered == 0


def test_one_byte_at_a_time() -> None:
    stream = resolve_request("node1") + encode_perf_request() + encode_ep_request(1, 1)
    framer = ClientFramer()
    received = []
    for byte in stream:
        framer.feed(bytes((byte,)))
        received.extend(frames_of(framer))
    assert received == [resolve_request("node1"), encode_perf_request(), encode_ep_request(1, 1)]


def test_partial_message_stays_buffered() -> None:
    framer = ClientFramer()
    framer.feed(resolve_request("a", "b")[:100])
    assert framer.next_frame() is None and framer.buffered == 100


@pytest.mark.parametrize(
    ("stream", "fault", "reason"),
    [
        (b"\x02", FramingFault.BAD_VERSION, "version 2, expected 1"),
        (b"\x01\x04", FramingFault.BAD_OPCODE, "opcode 0x04: operation 4 is not 1, 2 or 3"),
        (b"\x01\x80", FramingFault.BAD_OPCODE, "operation 0"),
        (bytes.fromhex("0101000000000800"), FramingFault.BAD_LENGTH, "length 8 is not valid"),
        (bytes.fromhex("0101000000005802"), FramingFault.BAD_LENGTH, "length 600 is not valid"),
        # A PERF/EP request with a little-endian length reads as 4096 on the server.
        (
            bytes.fromhex("0102000000001000"),
            FramingFault.BAD_LENGTH,
            "4096 is not valid for a PERF",
        ),
        (bytes.fromhex("010200000000000f"), FramingFault.BAD_LENGTH, "length 15"),
        (bytes.fromhex("0103000000000251"), FramingFault.BAD_LENGTH, "EP_QUERY request"),
        # 0x81 is framed big-endian by the server: 0x5800 bytes is far too long.
        (bytes.fromhex("0181000000005800"), FramingFault.BAD_LENGTH, "length 22528"),
    ],
)
def test_bad_headers_kill_the_framer(stream: bytes, fault: FramingFault, reason: str) -> None:
    framer = ClientFramer()
    framer.feed(stream)
    with pytest.raises(FramingError, match=reason) as caught:
        framer.next_frame()
    assert caught.value.fault is fault and reason in caught.value.reason
    with pytest.raises(FramingError):
        framer.feed(resolve_request("ok"))
    with pytest.raises(FramingError):
        framer.next_frame()


def test_good_message_before_a_bad_one_is_delivered() -> None:
    framer = ClientFramer()
    framer.feed(encode_perf_request() + b"\x07")
    assert framer.next_frame() == encode_perf_request()
    with pytest.raises(FramingError):
        framer.next_frame()
    assert framer.error is not None and framer.error.fault is FramingFault.BAD_VERSION


def test_0x81_request_is_framed_with_a_big_endian_length() -> None:
    raw = bytes.fromhex("0181000000000058") + bytes(80)
    framer = ClientFramer()
    framer.feed(raw)
    assert framer.next_frame() == raw


def test_reply_mode_frames_large_ep_replies_and_resolve_replies() -> None:
    config = EpConfig(1, 1, 1, 0xFFFF, "ibacmp", [f"name{i}" for i in range(20)])
    ep_reply = encode_ep_reply(AcmHdr(opcode=3, data0=1), 0, config)
    resolve_reply = encode_resolve_reply(AcmHdr(opcode=1), 0, [PathRecord(dlid=1)], ack=True)
    perf_reply = encode_perf_reply(AcmHdr(opcode=2), 0, [1] * 7)
    assert len(ep_reply) > 592
    framer = ClientFramer(replies=True)
    framer.feed(ep_reply + resolve_reply + perf_reply)
    assert frames_of(framer) == [ep_reply, resolve_reply, perf_reply]
    bad = ClientFramer(replies=True)
    bad.feed(bytes.fromhex("0182000000000014"))
    with pytest.raises(FramingError, match="length 20 is not valid for a PERF_QUERY reply"):
        bad.next_frame()


@pytest.mark.parametrize(("op", "length"), [(2, 40), (2, 48), (3, 88), (3, 592)])
def test_perf_and_ep_queries_of_any_whole_length_are_framed(op: int, length: int) -> None:
    """rdma-core's server answers them (it reads what it needs of a whole message)."""
    request = bytes([1, op, 0, 0, 1, 0]) + length.to_bytes(2, "big") + bytes(length - 8)
    framer = ClientFramer()
    framer.feed(request + request)
    assert framer.next_frame() == request and framer.next_frame() == request


@settings(max_examples=300)
@given(st.one_of(requests, st.binary(max_size=700), requests.map(lambda raw: raw + b"\x01")))
def test_a_whole_request_is_taken_as_it_is_and_anything_else_as_fed(data: bytes) -> None:
    """``whole`` (the client loop's shortcut) returns exactly what feeding would frame alone:
    the bytes themselves when they are one valid request, else None with nothing taken."""
    fed = ClientFramer()
    try:
        fed.feed(data)
        frames = []
        while (frame := fed.next_frame()) is not None:
            frames.append(frame)
    except FramingError:
        frames = []
    alone = frames == [data] and not fed.buffered
    shortcut = ClientFramer()
    assert (shortcut.whole(data) == data) is alone
    assert shortcut.buffered == 0  # nothing was taken either way
    assert ClientFramer(replies=True).whole(data) is None  # requests only

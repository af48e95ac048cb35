"""Bad input of any kind: truncations raise TruncatedError, random bytes only WireError."""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ibacm.wire.acm_mad import AcmMad
from ibacm.wire.client import (
    AcmHdr,
    AcmMessage,
    ClientFramer,
    EpAddr,
    EpConfig,
    EpFlag,
    FramingError,
    decode_ep_reply,
    decode_ep_request,
    decode_perf_reply,
    decode_perf_request,
    encode_ep_reply,
)
from ibacm.wire.errors import TruncatedError, WireError
from ibacm.wire.mad import McMemberRecord, RmppReassembler, SaMad
from ibacm.wire.netlink import (
    LsResolveRequest,
    NetlinkLengthError,
    PathUse,
    decode_ls_message,
    encode_ls_resolve_request,
)
from ibacm.wire.path_record import PathRecord
from tests.wire.strategies import acm_mads, acm_messages, gids, sa_mads

CLIENT_DECODERS: list[Callable[[bytes], object]] = [
    AcmHdr.decode,
    AcmMessage.decode,
    EpAddr.decode,
    PathRecord.decode,
    decode_perf_request,
    decode_perf_reply,
    decode_ep_request,
    decode_ep_reply,
    EpConfig.decode,
]


@given(st.binary(max_size=700))
@settings(max_examples=300)
def test_client_decoders_raise_only_wire_errors(data: bytes) -> None:
    for decode in CLIENT_DECODERS:
        with contextlib.suppress(WireError):
            decode(data)


@given(st.binary(min_size=1, max_size=40).map(lambda head: b"\x01" + head) | st.binary(max_size=40))
@settings(max_examples=300)
def test_framer_on_random_bytes(data: bytes) -> None:
    framer = ClientFramer()
    framer.feed(data)
    try:
        while (frame := framer.next_frame()) is not None:
            assert len(frame) >= 16
    except FramingError as error:
        assert error.reason


@given(st.binary(min_size=256, max_size=256))
@settings(max_examples=300)
def test_mad_decoders_raise_only_wire_errors(data: bytes) -> None:
    for decode in (AcmMad.decode, SaMad.decode, RmppReassembler().feed):
        with contextlib.suppress(WireError):
            decode(data)
    try:
        McMemberRecord.decode(data[:56])
        SaMad.decode(data).records(64)
    except WireError:
        pass


@given(st.binary(max_size=300), st.binary(min_size=16, max_size=16))
@settings(max_examples=300)
def test_netlink_decoder_raises_only_wire_errors(tail: bytes, head: bytes) -> None:
    # Half the cases get a plausible LS header so the deeper validation runs too.
    for data in (tail, head[:4] + b"\x00\x10\x01\x00" + head[8:] + tail):
        data = (len(data)).to_bytes(4, "little") + data[4:] if len(data) >= 16 else data
        try:
            message = decode_ls_message(data)
        except WireError:
            continue
        if isinstance(message, LsResolveRequest):
            message.to_path()


@given(acm_messages, st.data())
@settings(max_examples=200)
def test_truncated_resolve_message(message: AcmMessage, data: st.DataObject) -> None:
    raw = message.encode()
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(TruncatedError):
        AcmMessage.decode(raw[:cut])


@given(acm_mads, st.data())
@settings(max_examples=100)
def test_truncated_acm_mad(mad: AcmMad, data: st.DataObject) -> None:
    raw = mad.encode()
    with pytest.raises(TruncatedError):
        AcmMad.decode(raw[: data.draw(st.integers(0, 255))])


@given(sa_mads, st.data())
@settings(max_examples=100)
def test_truncated_sa_mad(mad: SaMad, data: st.DataObject) -> None:
    with pytest.raises(TruncatedError):
        SaMad.decode(mad.encode()[: data.draw(st.integers(0, 255))])


@given(st.lists(st.text(min_size=1, max_size=20).filter(lambda t: "\0" not in t), max_size=5))
@settings(max_examples=100)
def test_truncated_ep_reply(addrs: list[str]) -> None:
    raw = encode_ep_reply(AcmHdr(opcode=3, data0=1), 0, EpConfig(1, 1, 1, 1, "ibacmp", addrs))
    assert decode_ep_reply(raw)[1] == EpConfig(1, 1, 1, 1, "ibacmp", addrs)
    for cut in (0, 15, 16, len(raw) - 1):
        with pytest.raises(TruncatedError):
            decode_ep_reply(raw[:cut])


@given(gids, st.data())
@settings(max_examples=100)
def test_truncated_netlink_request(dgid: bytes, data: st.DataObject) -> None:
    raw = encode_ls_resolve_request(1, "mlx5_0", 1, PathUse.ALL, dgid=dgid)
    with pytest.raises(NetlinkLengthError):
        decode_ls_message(raw[: data.draw(st.integers(0, len(raw) - 1))])


def test_entry_flags_survive_any_value() -> None:
    entry = EpAddr.from_ip("10.0.0.1", EpFlag.SOURCE | EpFlag.QUERY_SA | 0x1000)
    assert EpAddr.decode(entry.encode()).flags == 0x80001001

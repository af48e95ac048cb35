"""Frames between a simulator hub and the daemons (or ``ibacm-sim``) using it; pure codec.

Every frame is a 4-byte big-endian length (of what follows), a 1-byte type and a body. MADs
travel as raw bytes behind a small binary header; only control and attribute messages are
JSON. ``FrameDecoder`` turns a byte stream into frames (sans-I/O: feed bytes, get frames);
the ``encode_*`` / ``decode_*`` functions build and read each body.

Client -> hub: CALL (id + JSON request), UD_SEND (id, QP handle, remote QPN, address vector,
MAD), UD_POST (QP handle, remote QPN, address vector, MAD: no id), SA_POST (device index,
port, SM LID/SL, P_Key index, MAD: no id), STAT (JSON counts).
Hub -> client: REPLY (id + JSON result or error), OK (id), UD_RECV (QP handle, GRH and
completion fields, MAD), SA_RECV (device index, port, MAD), EVENT (device index, port,
event code), IP_EVENT (JSON), POST_ERROR (QP handle + UTF-8 message), SA_POST_ERROR (device
index, port, the MAD's 64-bit TID + UTF-8 message).

A UD_SEND is answered, OK or an error REPLY, so its sender can wait for the completion. A
UD_POST is ``ibv_post_send``: a success is not answered at all (no round trip per MAD), a
failure (unknown QP, port down, bad destination) is answered with a POST_ERROR naming the
QP, which the client counts as a completion error of that QP. An SA_POST is ``umad_send``
of one SA MAD, answered likewise only when the hub cannot send it (unknown device or port,
port down, P_Key index not in the table): the SA_POST_ERROR names the port and the TID the
MAD carried, which the client matches (upper half = its umad agent, lower half = an
outstanding request) to end that request with the error; one it cannot match (a posted
ReportResp, a request already ended) it counts. A malformed frame of any kind is reported
on the hub's stderr and skipped, as every malformed frame is.
"""

from __future__ import annotations

import enum
import ipaddress
import json
import struct
from dataclasses import dataclass
from typing import Any

from ibacm.fabric.api import (
    AddressVector,
    InterfaceAddress,
    LinkLayer,
    PortAttributes,
    PortEventType,
    PortState,
    ReceivedMad,
)

PROTOCOL_VERSION = 1
MAX_FRAME = 1 << 20
"""Largest accepted frame body (a JSON status of a big fabric fits easily)."""
MAD_LEN = 256


class HubProtocolError(ValueError):
    """A frame is malformed; the connection cannot continue."""


class FrameType(enum.IntEnum):
    CALL = 0x01
    UD_SEND = 0x02
    STAT = 0x04
    UD_POST = 0x05
    SA_POST = 0x06
    REPLY = 0x81
    UD_RECV = 0x82
    OK = 0x83
    SA_RECV = 0x84
    EVENT = 0x85
    IP_EVENT = 0x86
    POST_ERROR = 0x87
    SA_POST_ERROR = 0x88


EVENT_CODES: tuple[PortEventType, ...] = tuple(PortEventType)

_HEAD = struct.Struct(">IB")
_ID = struct.Struct(">I")
_AV = struct.Struct(">HBBBBBBI16s")
_UD_POST = struct.Struct(">II")
_SA_POST = struct.Struct(">BBHBH")
_SA_POST_ERROR = struct.Struct(">BBQ")
_UD_RECV = struct.Struct(">IHIBH16s16s")
_DEV_PORT = struct.Struct(">BB")
_EVENT = struct.Struct(">BBB")


@dataclass(frozen=True, slots=True)
class Frame:
    type: int
    body: bytes


def frame(kind: FrameType, body: bytes) -> bytes:
    if len(body) + 1 > MAX_FRAME:
        raise HubProtocolError(f"frame of {len(body)} bytes exceeds {MAX_FRAME}")
    return _HEAD.pack(len(body) + 1, kind) + body


class FrameDecoder:
    """Accumulates stream bytes and returns complete frames."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes | bytearray) -> list[Frame]:
        self._buffer += data
        frames = []
        buffer = self._buffer
        offset = 0
        while len(buffer) - offset >= 4:
            (length,) = _ID.unpack_from(buffer, offset)
            if not 1 <= length <= MAX_FRAME:
                raise HubProtocolError(f"frame length {length} outside 1..{MAX_FRAME}")
            if len(buffer) - offset - 4 < length:
                break
            start = offset + 4
            frames.append(Frame(buffer[start], bytes(buffer[start + 1 : start + length])))
            offset = start + length
        del buffer[:offset]
        return frames

    @property
    def pending(self) -> int:
        return len(self._buffer)


# -- JSON calls and replies ---------------------------------------------------------------


def encode_call(call_id: int, request: dict[str, Any]) -> bytes:
    return frame(FrameType.CALL, _ID.pack(call_id) + json.dumps(request).encode())


def encode_reply(call_id: int, result: Any = None, error: BaseException | None = None) -> bytes:
    if error is not None:
        payload: dict[str, Any] = {"error": {"type": type(error).__name__, "message": str(error)}}
    else:
        payload = {"ok": result}
    return frame(FrameType.REPLY, _ID.pack(call_id) + json.dumps(payload).encode())


def encode_ok(call_id: int) -> bytes:
    return frame(FrameType.OK, _ID.pack(call_id))


def decode_json_body(body: bytes) -> tuple[int, Any]:
    """(call id, decoded JSON) of a CALL or REPLY body."""
    if len(body) < 4:
        raise HubProtocolError("call/reply body shorter than its 4-byte id")
    (call_id,) = _ID.unpack_from(body)
    try:
        return call_id, json.loads(body[4:])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HubProtocolError(f"bad JSON in frame: {exc}") from exc


def decode_ok(body: bytes) -> int:
    if len(body) != 4:
        raise HubProtocolError(f"OK frame of {len(body)} bytes, expected 4")
    return int(_ID.unpack(body)[0])


def encode_json(kind: FrameType, payload: Any) -> bytes:
    return frame(kind, json.dumps(payload).encode())


def decode_json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise HubProtocolError(f"bad JSON in frame: {exc}") from exc


# -- MADs ---------------------------------------------------------------------------------


def _check_mad(mad: bytes) -> bytes:
    if len(mad) != MAD_LEN:
        raise HubProtocolError(f"MAD of {len(mad)} bytes, expected {MAD_LEN}")
    return mad


def _ud_body(handle: int, remote_qpn: int, av: AddressVector, mad: bytes) -> bytes:
    """QP handle, remote QPN, address vector and MAD: the body of UD_POST, UD_SEND's after
    its id."""
    if len(av.dgid) != 16:
        raise HubProtocolError(f"DGID of {len(av.dgid)} bytes")
    try:
        packed_av = _AV.pack(
            av.dlid,
            av.sl,
            av.src_path_bits,
            av.static_rate,
            av.sgid_index,
            av.hop_limit,
            av.traffic_class,
            av.flow_label,
            av.dgid,
        )
        head = _UD_POST.pack(handle, remote_qpn)
    except struct.error as exc:
        raise HubProtocolError(f"address vector field out of range: {exc}") from exc
    return head + packed_av + _check_mad(mad)


def _decode_ud_body(name: str, body: bytes, offset: int) -> tuple[int, int, AddressVector, bytes]:
    """What ``_ud_body`` packed, at ``offset`` of a frame body that must end with it."""
    expected = offset + _UD_POST.size + _AV.size + MAD_LEN
    if len(body) != expected:
        raise HubProtocolError(f"{name} of {len(body)} bytes, expected {expected}")
    handle, remote_qpn = _UD_POST.unpack_from(body, offset)
    offset += _UD_POST.size
    dlid, sl, bits, rate, sgid_index, hop, tclass, flow, dgid = _AV.unpack_from(body, offset)
    av = AddressVector(dlid, dgid, sl, bits, rate, sgid_index, flow, hop, tclass)
    return handle, remote_qpn, av, body[offset + _AV.size :]


def encode_ud_send(
    call_id: int, handle: int, remote_qpn: int, av: AddressVector, mad: bytes
) -> bytes:
    if not 0 <= call_id <= 0xFFFFFFFF:
        raise HubProtocolError(f"call id {call_id} out of range")
    return frame(FrameType.UD_SEND, _ID.pack(call_id) + _ud_body(handle, remote_qpn, av, mad))


def decode_ud_send(body: bytes) -> tuple[int, int, int, AddressVector, bytes]:
    """(call id, QP handle, remote QPN, address vector, MAD)."""
    handle, remote_qpn, av, mad = _decode_ud_body("UD_SEND", body, _ID.size)
    return int(_ID.unpack_from(body)[0]), handle, remote_qpn, av, mad


def encode_ud_post(handle: int, remote_qpn: int, av: AddressVector, mad: bytes) -> bytes:
    return frame(FrameType.UD_POST, _ud_body(handle, remote_qpn, av, mad))


def decode_ud_post(body: bytes) -> tuple[int, int, AddressVector, bytes]:
    """(QP handle, remote QPN, address vector, MAD)."""
    return _decode_ud_body("UD_POST", body, 0)


def encode_post_error(handle: int, message: str) -> bytes:
    return frame(FrameType.POST_ERROR, _ID.pack(handle) + message.encode())


def decode_post_error(body: bytes) -> tuple[int, str]:
    """(QP handle, message) of a failed UD_POST."""
    if len(body) < _ID.size:
        raise HubProtocolError(f"POST_ERROR of {len(body)} bytes")
    (handle,) = _ID.unpack_from(body)
    return int(handle), body[_ID.size :].decode(errors="replace")


def encode_sa_post(
    device: int, port: int, sm_lid: int, sm_sl: int, pkey_index: int, mad: bytes
) -> bytes:
    try:
        head = _SA_POST.pack(device, port, sm_lid, sm_sl, pkey_index)
    except struct.error as exc:
        raise HubProtocolError(f"SA destination field out of range: {exc}") from exc
    return frame(FrameType.SA_POST, head + _check_mad(mad))


def decode_sa_post(body: bytes) -> tuple[int, int, int, int, int, bytes]:
    """(device index, port, SM LID, SM SL, P_Key index, MAD)."""
    if len(body) != _SA_POST.size + MAD_LEN:
        raise HubProtocolError(f"SA_POST of {len(body)} bytes")
    device, port, sm_lid, sm_sl, pkey_index = _SA_POST.unpack_from(body)
    return device, port, sm_lid, sm_sl, pkey_index, body[_SA_POST.size :]


def encode_sa_post_error(device: int, port: int, tid: int, message: str) -> bytes:
    return frame(FrameType.SA_POST_ERROR, _SA_POST_ERROR.pack(device, port, tid) + message.encode())


def decode_sa_post_error(body: bytes) -> tuple[int, int, int, str]:
    """(device index, port, TID, message) of a failed SA_POST."""
    if len(body) < _SA_POST_ERROR.size:
        raise HubProtocolError(f"SA_POST_ERROR of {len(body)} bytes")
    device, port, tid = _SA_POST_ERROR.unpack_from(body)
    return device, port, tid, body[_SA_POST_ERROR.size :].decode(errors="replace")


def encode_ud_recv(handle: int, received: ReceivedMad) -> bytes:
    head = _UD_RECV.pack(
        handle,
        received.slid,
        received.src_qp,
        received.dlid_path_bits,
        received.pkey_index,
        received.sgid,
        received.dgid,
    )
    return frame(FrameType.UD_RECV, head + _check_mad(received.mad))


def decode_ud_recv(body: bytes) -> tuple[int, ReceivedMad]:
    if len(body) != _UD_RECV.size + MAD_LEN:
        raise HubProtocolError(f"UD_RECV of {len(body)} bytes")
    handle, slid, src_qp, bits, pkey_index, sgid, dgid = _UD_RECV.unpack_from(body)
    mad = body[_UD_RECV.size :]
    return handle, ReceivedMad(mad, sgid, dgid, slid, src_qp, bits, pkey_index)


def encode_sa_recv(device: int, port: int, mad: bytes) -> bytes:
    return frame(FrameType.SA_RECV, _DEV_PORT.pack(device, port) + _check_mad(mad))


def decode_sa_recv(body: bytes) -> tuple[int, int, bytes]:
    if len(body) != _DEV_PORT.size + MAD_LEN:
        raise HubProtocolError(f"SA_RECV of {len(body)} bytes")
    device, port = _DEV_PORT.unpack_from(body)
    return device, port, body[_DEV_PORT.size :]


def encode_event(device: int, port: int, kind: PortEventType) -> bytes:
    return frame(FrameType.EVENT, _EVENT.pack(device, port, EVENT_CODES.index(kind)))


def decode_event(body: bytes) -> tuple[int, int, PortEventType]:
    if len(body) != _EVENT.size:
        raise HubProtocolError(f"EVENT of {len(body)} bytes")
    device, port, code = _EVENT.unpack(body)
    if code >= len(EVENT_CODES):
        raise HubProtocolError(f"unknown event code {code}")
    return device, port, EVENT_CODES[code]


# -- JSON bodies --------------------------------------------------------------------------


def attrs_to_json(attrs: PortAttributes) -> dict[str, Any]:
    """Port attributes as a JSON object (the ``query`` reply)."""
    return {
        "port_num": attrs.port_num,
        "state": int(attrs.state),
        "lid": attrs.lid,
        "lmc": attrs.lmc,
        "sm_lid": attrs.sm_lid,
        "sm_sl": attrs.sm_sl,
        "subnet_timeout": attrs.subnet_timeout,
        "active_mtu": attrs.active_mtu,
        "active_width": attrs.active_width,
        "active_speed": attrs.active_speed,
        "gids": [g.hex() for g in attrs.gids],
        "pkeys": list(attrs.pkeys),
        "link_layer": int(attrs.link_layer),
    }


def attrs_from_json(raw: dict[str, Any]) -> PortAttributes:
    """The inverse of ``attrs_to_json``; KeyError/ValueError on a malformed object."""
    return PortAttributes(
        port_num=int(raw["port_num"]),
        state=PortState(int(raw["state"])),
        lid=int(raw["lid"]),
        lmc=int(raw["lmc"]),
        sm_lid=int(raw["sm_lid"]),
        sm_sl=int(raw["sm_sl"]),
        subnet_timeout=int(raw["subnet_timeout"]),
        active_mtu=int(raw["active_mtu"]),
        active_width=int(raw["active_width"]),
        active_speed=int(raw["active_speed"]),
        gids=tuple(bytes.fromhex(g) for g in raw["gids"]),
        pkeys=tuple(int(p) for p in raw["pkeys"]),
        link_layer=LinkLayer(int(raw["link_layer"])),
    )


def address_to_json(entry: InterfaceAddress) -> dict[str, Any]:
    """An IPoIB address as a JSON object (``addresses`` reply, IP_EVENT frames)."""
    return {
        "ifname": entry.ifname,
        "address": str(entry.address),
        "prefixlen": entry.prefixlen,
        "gid": entry.gid.hex(),
        "pkey": entry.pkey,
    }


def address_from_json(raw: dict[str, Any]) -> InterfaceAddress:
    return InterfaceAddress(
        str(raw["ifname"]),
        ipaddress.ip_address(raw["address"]),
        int(raw["prefixlen"]),
        bytes.fromhex(raw["gid"]),
        int(raw["pkey"]),
    )

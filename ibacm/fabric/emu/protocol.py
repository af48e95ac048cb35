"""Messages between ``libibacm_emu.so`` and the emulated device process; a pure codec.

The C side is ``emu_protocol.h`` beside this file: the same layouts, native byte order, one
SOCK_SEQPACKET message each. A request is ``emu_req`` (op, device, a, b, c, d) and a payload;
a reply is ``emu_rep`` (status 0 or -errno, a, b, c) and a payload. The umad port connection
instead carries the kernel's umad ABI: ``struct ib_user_mad`` (64 bytes) then the MAD.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from ibacm.fabric.api import AddressVector, PortAttributes, PortState

SOCKET_ENV = "IBACM_EMU_SOCKET"
NAME_LEN = 64


class EmuProtocolError(ValueError):
    """A message does not have the layout its op needs."""


class Op(enum.IntEnum):
    LIST = 1
    OPEN = 2
    ASYNC = 3
    QUERY_PORT = 4
    QUERY_GID = 5
    QUERY_PKEY = 6
    CHANNEL = 7
    CREATE_CQ = 8
    CQ_DATA = 9
    ARM_CQ = 10
    DESTROY_CQ = 11
    CREATE_QP = 12
    MODIFY_QP = 13
    DESTROY_QP = 14
    POST_SEND = 15
    POST_RECV = 16
    ATTACH = 17
    DETACH = 18
    UMAD_OPEN = 19
    UMAD_REGISTER = 20
    UMAD_UNREGISTER = 21


NO_REPLY = frozenset({Op.ARM_CQ, Op.POST_SEND, Op.POST_RECV})
STREAM_OPS = frozenset({Op.ASYNC, Op.CHANNEL, Op.CQ_DATA, Op.UMAD_OPEN})
"""Ops that turn their connection into a stream the device writes records to."""

REQ = struct.Struct("=6I")
REP = struct.Struct("=i3I")
DEV_INFO = struct.Struct(f"={NAME_LEN}s{NAME_LEN}s8s8s4I")
PORT_ATTR = struct.Struct("=18I")
QP_MOD = struct.Struct("=4I")
SEND = struct.Struct("=Q10I16s")
WC = struct.Struct("=Q10I40s")
ASYNC_EVENT = struct.Struct("=2I")
CQ_EVENT = struct.Struct("=I")
UMAD_HEAD = struct.Struct("=5I")
UMAD_ADDR = struct.Struct(">IIHBBBBBB16sI")
UMAD_TAIL = struct.Struct("=H6x")
UMAD_SIZE = UMAD_HEAD.size + UMAD_ADDR.size + UMAD_TAIL.size
"""``struct ib_user_mad`` (64 bytes): agent, status, timeout, retries and length in host order,
then ``ib_mad_addr`` (big-endian QPN, Q_Key, LID, flow label; host-order P_Key index)."""

# enum ibv_qp_state, ibv_wc_status, ibv_wc_opcode, IBV_QP_* attribute mask bits
QPS_RESET, QPS_INIT, QPS_RTR, QPS_RTS, QPS_SQD, QPS_SQE, QPS_ERR = range(7)
IBV_QP_STATE = 1 << 0
IBV_QP_PKEY_INDEX = 1 << 4
IBV_QP_PORT = 1 << 5
IBV_QP_QKEY = 1 << 6
WC_SUCCESS = 0
WC_LOC_LEN_ERR = 1
WC_LOC_QP_OP_ERR = 2
WC_GENERAL_ERR = 21
IBV_QPT_UD = 4
PHYS_LINK_UP = 5
PHYS_DISABLED = 3
IBV_MTU_4096 = 5


@dataclass(frozen=True, slots=True)
class Request:
    op: int
    dev: int
    a: int
    b: int
    c: int
    d: int
    payload: bytes


def decode_request(message: bytes) -> Request:
    if len(message) < REQ.size:
        raise EmuProtocolError(f"request of {len(message)} bytes, shorter than its header")
    op, dev, a, b, c, d = REQ.unpack_from(message)
    return Request(op, dev, a, b, c, d, bytes(message[REQ.size :]))


def encode_request(
    op: int, dev: int = 0, a: int = 0, b: int = 0, c: int = 0, d: int = 0, payload: bytes = b""
) -> bytes:
    return REQ.pack(op, dev, a, b, c, d) + payload


def encode_reply(
    status: int = 0, a: int = 0, b: int = 0, c: int = 0, payload: bytes = b""
) -> bytes:
    return REP.pack(status, a, b, c) + payload


def decode_reply(message: bytes) -> tuple[int, int, int, int, bytes]:
    if len(message) < REP.size:
        raise EmuProtocolError(f"reply of {len(message)} bytes, shorter than its header")
    status, a, b, c = REP.unpack_from(message)
    return status, a, b, c, bytes(message[REP.size :])


def encode_device_info(name: str, node_guid: int, ports: int) -> bytes:
    guid = node_guid.to_bytes(8, "big")
    return DEV_INFO.pack(
        name.encode()[: NAME_LEN - 1],
        b"1.0.0 (ibacm emulated)",
        guid,
        guid,
        ports,
        0x02C9,
        0x1003,
        1,
    )


def rate_gbps(width: int, speed: int) -> int:
    """What sysfs/libibumad report as the port rate (Gb/s) for an IB width and speed code."""
    lanes = {1: 1, 2: 4, 4: 8, 8: 12, 16: 2}.get(width, 1)
    per_lane = {1: 2.5, 2: 5.0, 4: 10.0, 8: 10.0, 16: 14.0, 32: 25.0, 64: 50.0}.get(speed, 2.5)
    return int(lanes * per_lane)


def encode_port_attr(attrs: PortAttributes) -> bytes:
    active = attrs.state == PortState.ACTIVE
    return PORT_ATTR.pack(
        int(attrs.state),
        IBV_MTU_4096,
        attrs.active_mtu,
        max(len(attrs.gids), 1),
        0,
        0x80000000,
        max(len(attrs.pkeys), 1),
        attrs.lid,
        attrs.sm_lid,
        attrs.lmc,
        4,
        attrs.sm_sl,
        attrs.subnet_timeout,
        attrs.active_width,
        attrs.active_speed,
        PHYS_LINK_UP if active else PHYS_DISABLED,
        int(attrs.link_layer),
        rate_gbps(attrs.active_width, attrs.active_speed),
    )


@dataclass(frozen=True, slots=True)
class PostSend:
    wr_id: int
    av: AddressVector
    data: bytes


def decode_post_send(payload: bytes) -> PostSend:
    if len(payload) < SEND.size:
        raise EmuProtocolError(f"POST_SEND payload of {len(payload)} bytes")
    (wr_id, dlid, sl, bits, rate, is_global, flow, sgid_index, hop, tclass, length, dgid) = (
        SEND.unpack_from(payload)
    )
    data = payload[SEND.size :]
    if len(data) != length:
        raise EmuProtocolError(f"POST_SEND says {length} bytes and carries {len(data)}")
    av = AddressVector(
        dlid, dgid if is_global else bytes(16), sl, bits, rate, sgid_index, flow, hop, tclass
    )
    return PostSend(wr_id, av, data)


def encode_post_send(wr_id: int, av: AddressVector, data: bytes) -> bytes:
    return (
        SEND.pack(
            wr_id,
            av.dlid,
            av.sl,
            av.src_path_bits,
            av.static_rate,
            1,
            av.flow_label,
            av.sgid_index,
            av.hop_limit,
            av.traffic_class,
            len(data),
            av.dgid,
        )
        + data
    )


def grh(
    tclass: int, flow: int, hop_limit: int, sgid: bytes, dgid: bytes, payload_len: int
) -> bytes:
    """The 40-byte GRH an HCA writes in front of a UD receive (IBA 8.3)."""
    word0 = (6 << 28) | ((tclass & 0xFF) << 20) | (flow & 0xFFFFF)
    # PayLen counts BTH (12) + DETH (8) + payload + ICRC (4); next header 0x1B (IBA transport).
    return struct.pack(">IHBB16s16s", word0, payload_len + 24, 0x1B, hop_limit, sgid, dgid)


def encode_send_completion(qp_id: int, wr_id: int, status: int) -> bytes:
    return WC.pack(wr_id, 0, qp_id, status, 0, 0, 0, 0, 0, 0, 0, bytes(40))


def encode_recv_completion(
    qp_id: int,
    *,
    src_qp: int,
    slid: int,
    path_bits: int,
    pkey_index: int,
    grh_bytes: bytes | None,
    payload: bytes,
) -> bytes:
    return (
        WC.pack(
            0,
            1,
            qp_id,
            WC_SUCCESS,
            len(payload),
            src_qp,
            slid,
            0,
            path_bits,
            pkey_index,
            grh_bytes is not None,
            grh_bytes or bytes(40),
        )
        + payload
    )


@dataclass(frozen=True, slots=True)
class Completion:
    kind: int
    qp_id: int
    wr_id: int
    status: int
    src_qp: int
    slid: int
    pkey_index: int
    grh_present: bool
    grh: bytes
    payload: bytes


def decode_completion(message: bytes) -> Completion:
    if len(message) < WC.size:
        raise EmuProtocolError(f"completion of {len(message)} bytes")
    (
        wr_id,
        kind,
        qp_id,
        status,
        byte_len,
        src_qp,
        slid,
        _sl,
        _bits,
        pkey_index,
        grh_present,
        grh_bytes,
    ) = WC.unpack_from(message)
    payload = bytes(message[WC.size : WC.size + byte_len])
    return Completion(
        kind, qp_id, wr_id, status, src_qp, slid, pkey_index, bool(grh_present), grh_bytes, payload
    )


@dataclass(frozen=True, slots=True)
class UmadHeader:
    agent_id: int
    status: int
    timeout_ms: int
    retries: int
    length: int
    qpn: int
    qkey: int
    lid: int
    sl: int
    path_bits: int
    grh_present: int
    gid_index: int
    hop_limit: int
    traffic_class: int
    gid: bytes
    flow_label: int
    pkey_index: int


def decode_umad(message: bytes) -> tuple[UmadHeader, bytes]:
    if len(message) < UMAD_SIZE:
        raise EmuProtocolError(f"umad message of {len(message)} bytes, shorter than its header")
    agent, status, timeout_ms, retries, length = UMAD_HEAD.unpack_from(message)
    qpn, qkey, lid, sl, bits, grh_present, gid_index, hop, tclass, gid, flow = (
        UMAD_ADDR.unpack_from(message, UMAD_HEAD.size)
    )
    (pkey_index,) = UMAD_TAIL.unpack_from(message, UMAD_HEAD.size + UMAD_ADDR.size)
    header = UmadHeader(
        agent, status, timeout_ms, retries, length, qpn, qkey, lid, sl, bits, grh_present,
        gid_index, hop, tclass, gid, flow, pkey_index,
    )  # fmt: skip
    return header, bytes(message[UMAD_SIZE:])


def encode_umad(header: UmadHeader, mad: bytes) -> bytes:
    """A umad record as the kernel returns it from read(); ``length`` counts header and MAD."""
    h = header
    return (
        UMAD_HEAD.pack(h.agent_id, h.status, h.timeout_ms, h.retries, UMAD_SIZE + len(mad))
        + UMAD_ADDR.pack(
            h.qpn,
            h.qkey,
            h.lid,
            h.sl,
            h.path_bits,
            h.grh_present,
            h.gid_index,
            h.hop_limit,
            h.traffic_class,
            h.gid,
            h.flow_label,
        )
        + UMAD_TAIL.pack(h.pkey_index)
        + mad
    )

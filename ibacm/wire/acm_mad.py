"""The ACM peer protocol MAD (class 0x2C), pure codec (mad-protocol.md §2-§4).

256 bytes: a 16-byte header without attribute fields, then the resolve record: types and
lengths of the destination and source addresses, the MGIDs of the requester's groups (lowest
preference first), the two 64-byte addresses and up to six 16-byte MGIDs. Only six MGIDs fit,
although C declares ten and trusts ``gid_cnt`` up to ten (defect #38): we reject more than six.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

from ibacm.wire.buffer import Buffer
from ibacm.wire.client import ADDR_LEN, pad_address
from ibacm.wire.errors import (
    BadOpcodeError,
    BadVersionError,
    FieldRangeError,
    GidCountError,
    check_bytes,
    check_exact_length,
    check_uint,
)
from ibacm.wire.mad import MAD_SIZE
from ibacm.wire.path_record import GID_LEN

ACM_MGMT_CLASS = 0x2C
ACM_BASE_VERSION = 1
ACM_CLASS_VERSION = 1
ACM_CTRL_RESOLVE = 0x0001
ACM_CTRL_ACK = 0x8000  # defined by C, never sent
ACM_METHOD_RESOLVE = 0x01
ACM_METHOD_RESP = 0x81
MAX_GIDS_IN_MAD = 6
ACM_HDR_LEN = 16
_GID_OFFSET = 152  # MAD offset of gid[0]
_FIXED = struct.Struct(">BBBBHHQBBBBBBBB64s64s")
"""Everything before the MGIDs (152 bytes): one unpack per received MAD (the hot path)."""


@dataclass(slots=True)
class AcmMad:
    """An ACM resolve request or response; ``gid_cnt`` on the wire is ``len(gids)``."""

    method: int
    status: int = 0  # 16-bit; the ACM status is the high byte
    control: int = ACM_CTRL_RESOLVE
    tid: int = 0
    dest_type: int = 0
    dest_length: int = 0
    src_type: int = 0
    src_length: int = 0
    resp_resources: int = 0
    init_depth: int = 0
    reserved: int = 0
    dest: bytes = bytes(ADDR_LEN)
    src: bytes = bytes(ADDR_LEN)
    gids: list[bytes] = field(default_factory=list)

    @property
    def is_response(self) -> bool:
        return bool(self.method & 0x80)

    @property
    def acm_status(self) -> int:
        """The ACM status carried in the high byte of ``status``."""
        return (self.status >> 8) & 0xFF

    def encode(self) -> bytes:
        if len(self.gids) > MAX_GIDS_IN_MAD:
            raise GidCountError(
                f"gid_cnt: {len(self.gids)} MGIDs, at most {MAX_GIDS_IN_MAD} fit in a MAD"
            )
        gids = self.gids
        fits = len(self.dest) == ADDR_LEN and len(self.src) == ADDR_LEN
        if fits and all(len(gid) == GID_LEN for gid in gids):
            try:
                fixed = _FIXED.pack(
                    ACM_BASE_VERSION,
                    ACM_MGMT_CLASS,
                    ACM_CLASS_VERSION,
                    self.method,
                    self.status,
                    self.control,
                    self.tid,
                    self.dest_type,
                    self.dest_length,
                    self.src_type,
                    self.src_length,
                    len(gids),
                    self.resp_resources,
                    self.init_depth,
                    self.reserved,
                    self.dest,
                    self.src,
                )
                return (fixed + b"".join(gids)).ljust(MAD_SIZE, b"\0")
            except (struct.error, TypeError):
                pass  # the field-by-field path names what does not fit
        return self._encode_checked()

    def _encode_checked(self) -> bytes:
        buf = Buffer(capacity=MAD_SIZE)
        buf.push_uint8(ACM_BASE_VERSION, "base_version")
        buf.push_uint8(ACM_MGMT_CLASS, "mgmt_class")
        buf.push_uint8(ACM_CLASS_VERSION, "class_version")
        buf.push_uint8(self.method, "method")
        buf.push_uint16(self.status, "status")
        buf.push_uint16(self.control, "control")
        buf.push_uint64(self.tid, "tid")
        buf.push_uint8(self.dest_type, "dest_type")
        buf.push_uint8(self.dest_length, "dest_length")
        buf.push_uint8(self.src_type, "src_type")
        buf.push_uint8(self.src_length, "src_length")
        buf.push_uint8(len(self.gids), "gid_cnt")
        buf.push_uint8(self.resp_resources, "resp_resources")
        buf.push_uint8(self.init_depth, "init_depth")
        buf.push_uint8(self.reserved, "reserved")
        buf.push_bytes(check_bytes("dest", self.dest, ADDR_LEN))
        buf.push_bytes(check_bytes("src", self.src, ADDR_LEN))
        for index, gid in enumerate(self.gids):
            buf.push_bytes(check_bytes(f"gid[{index}]", gid, GID_LEN))
        buf.push_zeros(MAD_SIZE - buf.tell())
        return buf.data

    @classmethod
    def decode(cls, data: bytes) -> AcmMad:
        """Decode and validate exactly 256 bytes, as the C receiver does plus the gid clamp."""
        if len(data) != MAD_SIZE:
            check_exact_length("ACM MAD", data, MAD_SIZE)  # says which way it is wrong
        (
            base_version,
            mgmt_class,
            class_version,
            method,
            status,
            control,
            tid,
            dest_type,
            dest_length,
            src_type,
            src_length,
            gid_cnt,
            resp_resources,
            init_depth,
            reserved,
            dest,
            src,
        ) = _FIXED.unpack_from(data)
        if mgmt_class != ACM_MGMT_CLASS:
            raise BadOpcodeError(
                f"mgmt_class: 0x{mgmt_class:02x} is not the ACM class 0x{ACM_MGMT_CLASS:02x}"
            )
        if base_version != ACM_BASE_VERSION:
            raise BadVersionError(f"base_version: {base_version}, expected {ACM_BASE_VERSION}")
        if class_version != ACM_CLASS_VERSION:
            raise BadVersionError(f"class_version: {class_version}, expected {ACM_CLASS_VERSION}")
        if control != ACM_CTRL_RESOLVE:
            raise FieldRangeError(
                f"control: 0x{control:04x}, expected 0x{ACM_CTRL_RESOLVE:04x} (resolve)"
            )
        if gid_cnt > MAX_GIDS_IN_MAD:
            raise GidCountError(
                f"gid_cnt: {gid_cnt} MGIDs claimed, at most {MAX_GIDS_IN_MAD} fit in a MAD"
            )
        raw = data if type(data) is bytes else bytes(data)
        gids = [
            raw[offset : offset + GID_LEN]
            for offset in range(_GID_OFFSET, _GID_OFFSET + GID_LEN * gid_cnt, GID_LEN)
        ]
        return cls(
            method,
            status,
            control,
            tid,
            dest_type,
            dest_length,
            src_type,
            src_length,
            resp_resources,
            init_depth,
            reserved,
            dest,
            src,
            gids,
        )


def acm_request(
    tid: int,
    dest_type: int,
    dest: bytes,
    src_type: int,
    src: bytes,
    mgids: Sequence[bytes],
) -> AcmMad:
    """A resolve request as ibacmp builds it: lengths 64, addresses zero padded (§6.1)."""
    return AcmMad(
        method=ACM_METHOD_RESOLVE,
        tid=tid,
        dest_type=dest_type,
        dest_length=ADDR_LEN,
        src_type=src_type,
        src_length=ADDR_LEN,
        dest=pad_address(dest_type, dest),
        src=pad_address(src_type, src),
        gids=[check_bytes("mgid", mgid, GID_LEN) for mgid in mgids],
    )


def acm_response(tid: int, mgid: bytes, status: int = 0) -> AcmMad:
    """A resolve response: everything zero but ``gid[0]`` = the chosen MGID (§6.3).

    ``status`` is an ACM status; it travels in the high byte of the MAD status.
    """
    return AcmMad(
        method=ACM_METHOD_RESP,
        status=check_uint("status", status, 8) << 8,
        tid=tid,
        gids=[check_bytes("mgid", mgid, GID_LEN)],
    )


def mgid_for(pkey: int, rate: int, mtu: int, tos: int = 0) -> bytes:
    """The ACM group MGID ff15:4001:<pkey|0x8000>:<tos><rate>:<mtu>00:: (§4.1)."""
    full_pkey = check_uint("pkey", pkey, 16) | 0x8000
    return bytes(
        (
            0xFF,
            0x15,
            0x40,
            0x01,
            full_pkey >> 8,
            full_pkey & 0xFF,
            check_uint("tos", tos, 8),
            check_uint("rate", rate, 8),
            check_uint("mtu", mtu, 8),
        )
    ).ljust(GID_LEN, b"\0")

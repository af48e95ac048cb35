"""Pure translations between the fabric interface and pyverbs attribute objects.

Everything that builds a pyverbs object from our types (address handles with a GRH, the UD
QP's creation and state attributes, work requests) or turns pyverbs results into our types
(port attributes, received MADs, async events) lives here, without touching a device, so the
tests can run it against the real pyverbs classes on a machine without an HCA.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from ibacm.fabric.api import (
    ACM_QKEY,
    MAD_SIZE,
    AddressVector,
    LinkLayer,
    PortAttributes,
    PortEventType,
    PortState,
    ReceivedMad,
)
from ibacm.fabric.hw.pyverbs_loader import Pyverbs

GRH_LEN = 40
RECV_SIZE = GRH_LEN + MAD_SIZE
"""296: each receive buffer holds the 40-byte GRH area, then the MAD (mad-protocol.md §1)."""

IBV_EVENT_DEVICE_FATAL = 8
PORT_EVENTS: dict[int, PortEventType] = {
    9: PortEventType.PORT_ACTIVE,
    10: PortEventType.PORT_ERR,
    11: PortEventType.LID_CHANGE,
    12: PortEventType.PKEY_CHANGE,
    13: PortEventType.SM_CHANGE,
    17: PortEventType.CLIENT_REREGISTER,
    18: PortEventType.GID_CHANGE,
}
"""``enum ibv_event_type`` values of the port events the daemon reacts to."""
EVENT_CODES: dict[PortEventType, int] = {kind: code for code, kind in PORT_EVENTS.items()}
"""The other way round: what a port event is called in ``enum ibv_event_type``."""


def gid_text(gid: bytes) -> str:
    """The ``xxxx:xxxx:...`` (8 groups) form pyverbs' GID class parses."""
    if len(gid) != 16:
        raise ValueError(f"a GID is 16 bytes, got {len(gid)}")
    text = gid.hex()
    return ":".join(text[i : i + 4] for i in range(0, 32, 4))


def gid_from_pyverbs(gid: Any) -> bytes:
    """16 bytes from a pyverbs ``GID`` (whose text form is 8 groups of 4 hex digits)."""
    digits = str(gid).replace(":", "")
    if len(digits) != 32:
        raise ValueError(f"unexpected GID text {gid}")
    return bytes.fromhex(digits)


def pkey_from_verbs(raw: int) -> int:
    """``ibv_query_pkey`` stores the P_Key big-endian; pyverbs returns the raw u16."""
    return int.from_bytes(raw.to_bytes(2, sys.byteorder), "big")


def link_layer(value: int) -> LinkLayer:
    try:
        return LinkLayer(value)
    except ValueError:
        return LinkLayer.UNSPECIFIED


def port_attributes(
    port_num: int, attr: Any, gids: Sequence[bytes], pkeys: Sequence[int]
) -> PortAttributes:
    """Our ``PortAttributes`` from a pyverbs ``PortAttr`` plus the GID and P_Key tables."""
    try:
        state = PortState(attr.state)
    except ValueError:
        state = PortState.NOP
    return PortAttributes(
        port_num=port_num,
        state=state,
        lid=attr.lid,
        lmc=attr.lmc,
        sm_lid=attr.sm_lid,
        sm_sl=attr.sm_sl,
        subnet_timeout=attr.subnet_timeout,
        active_mtu=attr.active_mtu,
        active_width=attr.active_width,
        active_speed=attr.active_speed,
        gids=tuple(gids),
        pkeys=tuple(pkeys),
        link_layer=link_layer(attr.link_layer),
    )


def ah_attr(pv: Pyverbs, av: AddressVector, port_num: int) -> Any:
    """An ``AHAttr`` with a GRH: every ACM send carries one (mad-protocol.md §1)."""
    route = pv.addr.GlobalRoute(
        dgid=pv.addr.GID(gid_text(av.dgid)),
        flow_label=av.flow_label,
        sgid_index=av.sgid_index,
        hop_limit=av.hop_limit,
        traffic_class=av.traffic_class,
    )
    return pv.addr.AHAttr(
        dlid=av.dlid,
        sl=av.sl,
        src_path_bits=av.src_path_bits,
        static_rate=av.static_rate,
        is_global=1,
        port_num=port_num,
        gr=route,
    )


def qp_init_attr(pv: Pyverbs, cq: Any, *, send_depth: int, recv_depth: int) -> Any:
    """UD QP, one CQ for both directions, one SGE each, every send signalled."""
    cap = pv.qp.QPCap(
        max_send_wr=send_depth, max_recv_wr=recv_depth, max_send_sge=1, max_recv_sge=1
    )
    return pv.qp.QPInitAttr(qp_type=pv.enums.IBV_QPT_UD, scq=cq, rcq=cq, cap=cap, sq_sig_all=1)


def ud_qp_attr(pv: Pyverbs, *, port_num: int, pkey_index: int) -> Any:
    """Attributes for RESET -> INIT -> RTR -> RTS: port, P_Key index, Q_Key, SQ PSN 0."""
    attr = pv.qp.QPAttr(port_num=port_num)
    attr.pkey_index = pkey_index
    attr.qkey = ACM_QKEY
    attr.sq_psn = 0
    return attr


def recv_wr(pv: Pyverbs, *, wr_id: int, address: int, lkey: int) -> Any:
    sge = pv.wr.SGE(address, RECV_SIZE, lkey)
    return pv.wr.RecvWR(wr_id=wr_id, num_sge=1, sg=[sge])


def send_wr(pv: Pyverbs, *, wr_id: int, address: int, lkey: int) -> Any:
    """A signalled SEND of one MAD; the UD address is set with ``set_wr_ud``."""
    sge = pv.wr.SGE(address, MAD_SIZE, lkey)
    return pv.wr.SendWR(
        wr_id=wr_id,
        opcode=pv.enums.IBV_WR_SEND,
        num_sge=1,
        sg=[sge],
        send_flags=pv.enums.IBV_SEND_SIGNALED,
    )


def received_mad(
    buffer: bytes,
    *,
    byte_len: int,
    grh_present: bool,
    slid: int,
    src_qp: int,
    dlid_path_bits: int,
    pkey_index: int,
) -> ReceivedMad | None:
    """Our ``ReceivedMad`` from a 296-byte receive buffer, or None when it holds no MAD.

    ``byte_len`` counts the GRH area (40 bytes, filled only when a GRH was received).
    """
    if byte_len < GRH_LEN + 24 or len(buffer) < GRH_LEN + 24:
        return None
    end = min(byte_len, len(buffer))
    mad = bytes(buffer[GRH_LEN:end]).ljust(MAD_SIZE, b"\0")[:MAD_SIZE]
    sgid = bytes(buffer[8:24]) if grh_present else bytes(16)
    dgid = bytes(buffer[24:40]) if grh_present else bytes(16)
    return ReceivedMad(
        mad=mad,
        sgid=sgid,
        dgid=dgid,
        slid=slid,
        src_qp=src_qp,
        dlid_path_bits=dlid_path_bits,
        pkey_index=pkey_index,
    )


def port_events(event_type: int, element: int, port_count: int) -> list[tuple[int, PortEventType]]:
    """The (port, event) pairs one async event means; empty for events of other objects.

    A fatal device error takes every port down.
    """
    if event_type == IBV_EVENT_DEVICE_FATAL:
        return [(port, PortEventType.PORT_ERR) for port in range(1, port_count + 1)]
    kind = PORT_EVENTS.get(event_type)
    if kind is None or not 1 <= element <= port_count:
        return []
    return [(element, kind)]

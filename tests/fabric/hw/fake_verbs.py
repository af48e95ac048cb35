"""A stand-in for pyverbs and an HCA, to run the UD QP and device logic without hardware.

Only the calls the backend makes exist. The completion channel and the async-event "fd" are
real socketpairs, so trio really waits on them; ``FakeHca`` plays the hardware: it fills
receive buffers, queues work completions and signals the channel when the CQ is armed.
Argument names follow pyverbs, so a call that would fail against pyverbs fails here too.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from ibacm.fabric.hw.pyverbs_loader import Pyverbs
from ibacm.fabric.hw.verbs_handles import AsyncEventRecord, ContextHandle

ENUMS = SimpleNamespace(
    IBV_QPT_UD=4,
    IBV_WR_SEND=2,
    IBV_SEND_SIGNALED=2,
    IBV_ACCESS_LOCAL_WRITE=1,
    IBV_WC_SUCCESS=0,
    IBV_WC_GENERAL_ERR=4,
    IBV_WC_WR_FLUSH_ERR=5,
    IBV_WC_GRH=1,
)


class FakeError(Exception):
    """Plays pyverbs' PyverbsError."""


class Closable:
    def __init__(self, hca: FakeHca) -> None:
        self.hca = hca
        self.closed = False

    def close(self) -> None:
        self.closed = True
        self.hca.closed.append(type(self).__name__)


class CompChannel(Closable):
    def __init__(self, context: Any) -> None:
        super().__init__(context.hca)
        self.reader, self.writer = socket.socketpair()
        self.reader.setblocking(False)
        self.hca.channels.append(self)

    def get_cq_event(self, expected_cq: Any) -> None:
        self.reader.recv(1)
        expected_cq.events += 1

    def close(self) -> None:
        super().close()
        self.reader.close()
        self.writer.close()


class CQ(Closable):
    def __init__(self, context: Any, cqe: int, cq_context: Any, channel: Any, comp_vector: int):
        super().__init__(context.hca)
        self.cqe, self.channel = cqe, channel
        self.entries: list[SimpleNamespace] = []
        self.armed = False
        self.events = 0
        self.acked = 0
        self.unacked_at_close: int | None = None
        self.hca.cq = self

    def req_notify(self, solicited_only: int = 0) -> None:
        self.armed = True

    def close(self) -> None:
        # ibv_destroy_cq waits until every event the CQ raised is acknowledged.
        self.unacked_at_close = self.events - self.acked
        super().close()

    def ack_events(self, num_events: int) -> None:
        self.acked += num_events

    def poll(self, num_entries: int = 1) -> tuple[int, list[SimpleNamespace]]:
        taken, self.entries = self.entries[:num_entries], self.entries[num_entries:]
        return len(taken), taken

    def add(self, wc: SimpleNamespace) -> None:
        self.entries.append(wc)
        if self.armed:  # one event per arming, as the hardware does
            self.armed = False
            self.channel.writer.send(b"!")


class MR(Closable):
    BASE = 0x7F0000000000

    def __init__(self, pd: Any, length: int, access: int) -> None:
        super().__init__(pd.hca)
        self.memory = bytearray(length)
        self.buf = self.BASE
        self.lkey = 0x1111
        self.access = access
        self.hca.mr = self

    def write(self, data: bytes, length: int, offset: int = 0) -> None:
        self.memory[offset : offset + length] = data[:length]

    def read(self, length: int, offset: int) -> bytes:
        return bytes(self.memory[offset : offset + length])


@dataclass
class SGE:
    addr: int
    length: int
    lkey: int

    def close(self) -> None:
        pass


class RecvWR:
    def __init__(self, wr_id: int = 0, num_sge: int = 0, sg: Any = None, next_wr: Any = None):
        self.wr_id, self.num_sge, self.sg = wr_id, num_sge, sg


class SendWR:
    def __init__(
        self,
        wr_id: int = 0,
        opcode: int = 2,
        num_sge: int = 0,
        imm_data: int = 0,
        sg: Any = None,
        send_flags: int = 2,
        next_wr: Any = None,
    ):
        self.wr_id, self.opcode, self.num_sge, self.sg = wr_id, opcode, num_sge, sg
        self.send_flags = send_flags
        self.ud: tuple[Any, int, int] | None = None

    def set_wr_ud(self, ah: Any, rqpn: int, rqkey: int) -> None:
        self.ud = (ah, rqpn, rqkey)


class QPCap:
    def __init__(
        self,
        max_send_wr: int = 1,
        max_recv_wr: int = 10,
        max_send_sge: int = 1,
        max_recv_sge: int = 1,
        max_inline_data: int = 0,
    ) -> None:
        self.max_send_wr, self.max_recv_wr = max_send_wr, max_recv_wr
        self.max_send_sge, self.max_recv_sge = max_send_sge, max_recv_sge


class QPInitAttr:
    def __init__(
        self,
        qp_type: int = 4,
        qp_context: Any = None,
        scq: Any = None,
        rcq: Any = None,
        srq: Any = None,
        cap: Any = None,
        sq_sig_all: int = 1,
    ) -> None:
        self.qp_type, self.scq, self.rcq = qp_type, scq, rcq
        self.cap, self.sq_sig_all = cap, sq_sig_all


class QPAttr:
    def __init__(
        self, qp_state: int = 1, cur_qp_state: int = 0, port_num: int = 1, path_mtu: int = 3
    ) -> None:
        self.port_num = port_num
        self.pkey_index = 0
        self.qkey = 0
        self.sq_psn = -1


class QP(Closable):
    def __init__(self, creator: Any, init_attr: Any, qp_attr: Any = None) -> None:
        super().__init__(creator.hca)
        if self.hca.fail_qp:
            raise FakeError("Failed to create QP")
        self.init_attr, self.qp_attr = init_attr, qp_attr
        self.qp_num = 0x48
        self.recvs: list[RecvWR] = []
        self.sends: list[SendWR] = []
        self.outstanding: set[int] = set()
        """wr_ids posted and not completed: a work request posted again before its
        completion would be the QP's bug (its buffer still the HCA's)."""
        self.hca.qp = self

    def _take(self, wr_id: int) -> None:
        assert wr_id not in self.outstanding, f"wr_id {wr_id:#x} posted again before its completion"
        self.outstanding.add(wr_id)

    def post_recv(self, wr: RecvWR, bad_wr: Any = None) -> None:
        self._take(wr.wr_id)
        self.recvs.append(wr)

    def post_send(self, wr: SendWR, bad_wr: Any = None) -> None:
        if self.hca.fail_send:
            raise FakeError("Failed to post send")
        self._take(wr.wr_id)
        self.sends.append(wr)


class GID:
    def __init__(self, val: str | None = None) -> None:
        self.text = val

    def __str__(self) -> str:
        return str(self.text)


class GlobalRoute:
    def __init__(
        self,
        dgid: Any = None,
        flow_label: int = 0,
        sgid_index: int = 0,
        hop_limit: int = 1,
        traffic_class: int = 0,
    ) -> None:
        self.dgid = str(dgid)
        self.flow_label, self.sgid_index = flow_label, sgid_index
        self.hop_limit, self.traffic_class = hop_limit, traffic_class


class AHAttr:
    def __init__(
        self,
        dlid: int = 0,
        sl: int = 0,
        src_path_bits: int = 0,
        static_rate: int = 0,
        is_global: int = 0,
        port_num: int = 1,
        gr: Any = None,
    ) -> None:
        self.dlid, self.sl, self.is_global = dlid, sl, is_global
        self.port_num, self.gr = port_num, gr


class AH(Closable):
    def __init__(self, pd: Any, **kwargs: Any) -> None:
        super().__init__(pd.hca)
        self.attr = kwargs["attr"]
        self.hca.ahs.append(self)


class PD(Closable):
    def __init__(self, creator: Any) -> None:
        super().__init__(creator.hca)


@dataclass
class PortState:
    state: int = 4
    lid: int = 3
    lmc: int = 0
    sm_lid: int = 1
    sm_sl: int = 0
    subnet_timeout: int = 18
    active_mtu: int = 5
    active_width: int = 2
    active_speed: int = 32
    link_layer: int = 1
    gids: list[str] = field(default_factory=lambda: ["fe80:0000:0000:0000:0002:c903:0001:0003"])
    pkeys_be: list[int] = field(default_factory=lambda: [0xFFFF, 0x0180])  # 0x8001 big-endian

    @property
    def gid_tbl_len(self) -> int:
        return 4

    @property
    def pkey_tbl_len(self) -> int:
        return len(self.pkeys_be)


class Context(Closable):
    def __init__(self, hca: FakeHca, name: str) -> None:
        super().__init__(hca)
        self.name = name
        self.cmd_fd = 5
        self.num_comp_vectors = 1

    def query_device(self) -> SimpleNamespace:
        ports = len(self.hca.ports)
        return SimpleNamespace(node_guid=self.hca.node_guid_native, phys_port_cnt=ports)

    def query_port(self, port_num: int) -> PortState:
        try:
            return self.hca.ports[port_num - 1]
        except IndexError:
            raise FakeError(f"Failed to query port {port_num}") from None

    def query_gid(self, port_num: int, index: int) -> GID:
        gids = self.query_port(port_num).gids
        return GID(gids[index] if index < len(gids) else "0000:0000:0000:0000:0000:0000:0000:0000")

    def query_pkey(self, port_num: int, index: int) -> int:
        return self.query_port(port_num).pkeys_be[index]


class FakeHca:
    """The device side: what the backend created and what the "hardware" reports."""

    def __init__(self) -> None:
        self.closed: list[str] = []
        self.channels: list[CompChannel] = []
        self.ahs: list[AH] = []
        self.cq: CQ | None = None
        self.mr: MR | None = None
        self.qp: QP | None = None
        self.fail_qp = False
        self.fail_send = False
        self.ports = [PortState()]
        self.node_guid_native = int.from_bytes((0x0002C90300010000).to_bytes(8, "big"), "little")
        self.async_reader, self.async_writer = socket.socketpair()
        self.async_reader.setblocking(False)
        self.async_events: list[AsyncEventRecord] = []
        self.attached: list[tuple[str, int, bytes, int]] = []

    def pyverbs(self) -> Pyverbs:
        module = SimpleNamespace
        return Pyverbs(
            base=module(PyverbsCM=object),
            device=module(Context=lambda name: Context(self, name), get_device_list=lambda: []),
            enums=ENUMS,
            addr=module(GID=GID, GlobalRoute=GlobalRoute, AHAttr=AHAttr, AH=AH),
            cq=module(CompChannel=CompChannel, CQ=CQ),
            pd=module(PD=PD),
            mr=module(MR=MR),
            qp=module(QPCap=QPCap, QPInitAttr=QPInitAttr, QPAttr=QPAttr, QP=QP),
            wr=module(SGE=SGE, RecvWR=RecvWR, SendWR=SendWR),
            pyverbs_error=module(PyverbsError=FakeError),
        )

    def context(self, name: str = "mlx5_0") -> Context:
        return Context(self, name)

    # -- the "hardware" -------------------------------------------------------------------
    def complete(self, wr_id: int, *, status: int = 0, **fields: Any) -> None:
        assert self.cq is not None
        if self.qp is not None:
            self.qp.outstanding.discard(wr_id)
        wc = SimpleNamespace(
            wr_id=wr_id,
            status=status,
            byte_len=0,
            wc_flags=0,
            slid=0,
            src_qp=0,
            dlid_path_bits=0,
            pkey_index=0,
        )
        for name, value in fields.items():
            setattr(wc, name, value)
        self.cq.add(wc)

    def deliver(self, slot: int, grh: bytes, mad: bytes, **fields: Any) -> None:
        """A MAD arrives in receive buffer ``slot`` (GRH area, then the MAD)."""
        assert self.mr is not None
        self.mr.write(grh + mad, len(grh) + len(mad), slot * 296)
        self.complete(slot, byte_len=40 + len(mad), wc_flags=ENUMS.IBV_WC_GRH, **fields)

    def raise_async(self, event_type: int, element: int) -> None:
        self.async_events.append(AsyncEventRecord(event_type, element))
        self.async_writer.send(b"!")


class FakeHandles:
    def __init__(self, hca: FakeHca) -> None:
        self.hca = hca

    def context(self, ctx: Any) -> ContextHandle:
        return ContextHandle(0xC0, ctx.cmd_fd, self.hca.async_reader.fileno())

    def comp_channel_fd(self, channel: CompChannel, context: ContextHandle) -> int:
        return channel.reader.fileno()

    def qp(self, qp: Any, context: ContextHandle) -> int:
        return 0xABC


class FakeLibVerbs:
    def __init__(self, hca: FakeHca) -> None:
        self.hca = hca

    def get_async_event(self, context: ContextHandle) -> AsyncEventRecord:
        self.hca.async_reader.recv(1)
        return self.hca.async_events.pop(0)

    def attach_mcast(self, qp_pointer: int, mgid: bytes, mlid: int) -> None:
        self.hca.attached.append(("attach", qp_pointer, mgid, mlid))

    def detach_mcast(self, qp_pointer: int, mgid: bytes, mlid: int) -> None:
        self.hca.attached.append(("detach", qp_pointer, mgid, mlid))

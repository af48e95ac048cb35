"""An in-memory stand-in for libibumad with the kernel's observable behaviour.

Like the kernel it rewrites the upper 32 bits of every sent TID (replies carry them back),
hands out packets from a thread-safe queue to a blocking ``recv`` with a timeout, and can
return a send with status ETIMEDOUT. A ``responder`` callback plays the SA. With
``pollable`` it offers a descriptor that polls readable while a packet is queued, as a
kernel umad device does; without, it is like ibsim's preload (no descriptor to poll).
"""

from __future__ import annotations

import errno
import queue
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ibacm.fabric.api import PortState
from ibacm.fabric.hw.umad import UmadCaInfo, UmadError, UmadPacket, UmadPortInfo, UmadSendAddress

KERNEL_HI_TID = 0x5A5A0000


@dataclass
class SentMad:
    agent_id: int
    mad: bytes
    addr: UmadSendAddress
    timeout_ms: int
    retries: int


Responder = Callable[["FakeUmad", SentMad], None]


@dataclass
class FakeUmad:
    responder: Responder | None = None
    ports: dict[tuple[str, int], UmadPortInfo] = field(default_factory=dict)
    fail_send: bool = False
    sent: list[SentMad] = field(default_factory=list)
    opened: dict[int, tuple[str, int]] = field(default_factory=dict)
    closed: list[int] = field(default_factory=list)
    registered: list[tuple[int, int, int, int]] = field(default_factory=list)
    unregistered: list[tuple[int, int]] = field(default_factory=list)
    methods: tuple[int, ...] = ()
    recv_calls: int = 0
    pollable: bool = False

    def __post_init__(self) -> None:
        self.inbox: queue.Queue[UmadPacket] = queue.Queue()
        self._lock = threading.Lock()
        self._next_port = 1024  # like the simulator's fake fds
        # One byte in the socket pair per queued packet: the read end polls like a device.
        self._bell: tuple[socket.socket, socket.socket] | None = (
            socket.socketpair() if self.pollable else None
        )

    def poll_fd(self, portid: int) -> int | None:
        return self._bell[0].fileno() if self._bell is not None else None

    def release(self) -> None:
        if self._bell is not None:
            for end in self._bell:
                end.close()

    # -- discovery -----------------------------------------------------------------------
    def ca_names(self) -> list[str]:
        return sorted({ca for ca, _ in self.ports})

    def ca(self, name: str) -> UmadCaInfo:
        ports = tuple(info for (ca, _), info in sorted(self.ports.items()) if ca == name)
        if not ports:
            raise UmadError(f"no CA {name}")
        return UmadCaInfo(name, 1, 0x1000 + len(name), len(ports), ports)

    def port(self, ca_name: str, port_num: int) -> UmadPortInfo:
        try:
            return self.ports[(ca_name, port_num)]
        except KeyError:
            raise UmadError(f"no port {ca_name}:{port_num}") from None

    # -- agents --------------------------------------------------------------------------
    def open_port(self, ca_name: str, port_num: int) -> int:
        with self._lock:
            portid = self._next_port
            self._next_port += 1
        self.opened[portid] = (ca_name, port_num)
        return portid

    def close_port(self, portid: int) -> None:
        self.closed.append(portid)

    def register(
        self,
        portid: int,
        mgmt_class: int,
        class_version: int,
        rmpp_version: int,
        methods: Sequence[int] = (),
    ) -> int:
        self.registered.append((portid, mgmt_class, class_version, rmpp_version))
        self.methods = tuple(methods)
        return 7

    def unregister(self, portid: int, agent_id: int) -> None:
        self.unregistered.append((portid, agent_id))

    def send(
        self,
        portid: int,
        agent_id: int,
        mad: bytes,
        addr: UmadSendAddress,
        *,
        timeout_ms: int,
        retries: int,
    ) -> None:
        if self.fail_send:
            raise UmadError("umad_send failed: EIO (5)")
        rewritten = mad[:8] + (KERNEL_HI_TID | (agent_id & 0xFF)).to_bytes(4, "big") + mad[12:]
        record = SentMad(agent_id, rewritten, addr, timeout_ms, retries)
        self.sent.append(record)
        if self.responder is not None:
            self.responder(self, record)

    def recv(self, portid: int, timeout_ms: int) -> UmadPacket | None:
        self.recv_calls += 1
        try:
            packet = (
                self.inbox.get(timeout=timeout_ms / 1000) if timeout_ms else self.inbox.get_nowait()
            )
        except queue.Empty:
            return None
        if self._bell is not None:
            self._bell[0].recv(1)
        return packet

    # -- helpers for tests -----------------------------------------------------------------
    def deliver(self, mad: bytes, *, status: int = 0, agent_id: int = 7) -> None:
        self.inbox.put(UmadPacket(agent_id=agent_id, status=status, mad=mad))
        if self._bell is not None:
            self._bell[1].send(b"\1")

    def time_out(self, sent: SentMad) -> None:
        """What the kernel does after the last retry: the send comes back, status ETIMEDOUT."""
        self.deliver(sent.mad, status=errno.ETIMEDOUT)


def port_info(
    ca: str = "mlx5_0",
    port_num: int = 1,
    *,
    lid: int = 3,
    state: PortState = PortState.ACTIVE,
    sm_lid: int = 1,
    rate: int = 100,
    pkeys: tuple[int, ...] = (0xFFFF, 0x8001),
) -> UmadPortInfo:
    return UmadPortInfo(
        ca_name=ca,
        port_num=port_num,
        base_lid=lid,
        lmc=0,
        sm_lid=sm_lid,
        sm_sl=0,
        state=state,
        phys_state=5,
        rate=rate,
        gid_prefix=0xFE80000000000000,
        port_guid=0x0002C90300010000 + lid,
        pkeys=pkeys,
        link_layer="InfiniBand",
    )

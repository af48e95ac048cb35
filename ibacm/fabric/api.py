"""The port interface every fabric backend implements.

Two backends implement it: ``ibacm.fabric.sim`` (the simulated fabric, used for tests, demos
and benchmarks) and ``ibacm.fabric.hw`` (pyverbs UD QPs plus the kernel umad interface).
Everything above this module (core, providers) sees only these types, so the same MAD bytes
flow on both. All waits are trio waits and therefore cancellable; all timing comes from
trio's clock.

Shape of the interface, mirroring what the C daemon uses from verbs/umad:

* ``Fabric.open()`` -> the devices (HCAs) that have at least one InfiniBand port.
* ``Device``: name, node GUID, port count, ``port(n)``, ``wait_event()`` for async events.
* ``Port``: ``query()`` attributes; ``sa_send()`` one SA MAD to the SM with umad semantics
  (kernel-level timeout and retries, reply matched on the low 32 bits of the TID);
  ``sa_report()`` the SA's unsolicited Reports and ``sa_post()`` their unanswered acks;
  ``open_ud()`` the ACM UD QP of an endpoint.
* ``UdQp``: unicast/multicast sends with an address vector (GRH always present), receives
  with the source taken from the GRH and the work completion, multicast attach/detach.
  ``post`` sends without waiting (as ``ibv_post_send``) and ``serve`` hands received MADs to
  a handler in the round that reads them: a MAD in and the MAD it causes out need no trip
  through trio's scheduler (issue 28: a daemon's own time in a first resolution).
"""

from __future__ import annotations

import abc
import enum
import ipaddress
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import trio

from ibacm.log import get_logger

log = get_logger("ibacm.fabric")

ACM_QKEY = 0x80010000
"""Q_Key of every ACM UD QP and of SA MADs (the IBA well-known GSI Q_Key)."""

MULTICAST_QPN = 0xFFFFFF
"""Remote QPN used for multicast sends."""

SA_QPN = 1
MAD_SIZE = 256
ZERO_GID = bytes(16)


class FabricError(Exception):
    """Base class of fabric backend failures."""


class NoDevicesError(FabricError):
    """No device with an InfiniBand port could be opened."""


class SaTimeout(FabricError):
    """An SA MAD got no matching reply within timeout x (retries + 1) (umad status ETIMEDOUT)."""


class SaSendError(FabricError):
    """The SA MAD could not be sent at all (umad_send failure, port down)."""


class PortDownError(FabricError):
    """The operation needs an ACTIVE port."""


class SendQueueFull(FabricError):
    """Every send slot of the QP is in flight: ``post`` can take the MAD again after a
    completion (``send`` waits for one)."""


class PortState(enum.IntEnum):
    """``enum ibv_port_state``."""

    NOP = 0
    DOWN = 1
    INIT = 2
    ARMED = 3
    ACTIVE = 4
    ACTIVE_DEFER = 5


class LinkLayer(enum.IntEnum):
    """``IBV_LINK_LAYER_*``."""

    UNSPECIFIED = 0
    INFINIBAND = 1
    ETHERNET = 2


@dataclass(frozen=True, slots=True)
class PortAttributes:
    """What ``ibv_query_port`` plus the GID and P_Key tables tell about a port."""

    port_num: int
    state: PortState
    lid: int
    lmc: int
    sm_lid: int
    sm_sl: int
    subnet_timeout: int
    """Raw PortInfo:SubnetTimeout (the timeout is 4.096 us * 2**value)."""
    active_mtu: int
    """IBA MTU enum, 1 = 256 .. 5 = 4096."""
    active_width: int
    """IBA width code: 1 = 1x, 2 = 4x, 4 = 8x, 8 = 12x, 16 = 2x."""
    active_speed: int
    """IBA speed code: 1 SDR, 2 DDR, 4 QDR, 8 FDR10, 16 FDR, 32 EDR, 64 HDR, 128 NDR, 256 XDR."""
    gids: tuple[bytes, ...]
    """Valid GIDs in table order; ``gids[0]`` = subnet prefix + port GUID."""
    pkeys: tuple[int, ...]
    """P_Key table in order (including 0 entries), membership bit as stored."""
    link_layer: LinkLayer = LinkLayer.INFINIBAND

    @property
    def active(self) -> bool:
        return self.state == PortState.ACTIVE

    @property
    def lid_mask(self) -> int:
        return 0xFFFF - ((1 << self.lmc) - 1)

    @property
    def subnet_prefix(self) -> int:
        return int.from_bytes(self.gids[0][:8], "big") if self.gids else 0

    @property
    def port_guid(self) -> int:
        return int.from_bytes(self.gids[0][8:], "big") if self.gids else 0

    def sa_pkey_index(self) -> int:
        """Index used for SA MADs: first 0xFFFF, else last 0x7FFF, else 0 (mad-protocol §9.7)."""
        if 0xFFFF in self.pkeys:
            return self.pkeys.index(0xFFFF)
        for index in range(len(self.pkeys) - 1, -1, -1):
            if self.pkeys[index] == 0x7FFF:
                return index
        return 0

    def gid_index(self, gid: bytes) -> int | None:
        try:
            return self.gids.index(gid)
        except ValueError:
            return None


class PortEventType(enum.Enum):
    """Async events the daemon reacts to (``IBV_EVENT_*``)."""

    PORT_ACTIVE = "port_active"
    PORT_ERR = "port_err"
    LID_CHANGE = "lid_change"
    GID_CHANGE = "gid_change"
    PKEY_CHANGE = "pkey_change"
    CLIENT_REREGISTER = "client_reregister"
    SM_CHANGE = "sm_change"


@dataclass(frozen=True, slots=True)
class PortEvent:
    port_num: int
    type: PortEventType


@dataclass(frozen=True, slots=True)
class AddressVector:
    """Where a UD send goes. A GRH is always present (ACM peers take the sender GID from it)."""

    dlid: int
    dgid: bytes = ZERO_GID
    sl: int = 0
    src_path_bits: int = 0
    static_rate: int = 0
    sgid_index: int = 0
    flow_label: int = 0
    hop_limit: int = 0
    traffic_class: int = 0


@dataclass(frozen=True, slots=True)
class ReceivedMad:
    """One MAD received on a UD QP, with the source taken from the GRH and the completion."""

    mad: bytes
    sgid: bytes
    """GRH source GID (bytes 8..23 of the 40-byte GRH area)."""
    dgid: bytes
    """GRH destination GID (the MGID for multicast deliveries)."""
    slid: int
    src_qp: int
    dlid_path_bits: int = 0
    pkey_index: int = 0


@dataclass(frozen=True, slots=True)
class SaDestination:
    """umad address of the SA: the SM LID/SL captured at port up and the P_Key index."""

    sm_lid: int
    sm_sl: int
    pkey_index: int


RECEIVE_BATCH = 256
"""MADs one ``serve`` handler call takes at most: a job start's burst costs one call per
batch."""

MadHandler = Callable[[list[ReceivedMad]], None]
"""What ``UdQp.serve`` hands received MADs to (see there)."""


def deliver_batch(handler: MadHandler, batch: list[ReceivedMad]) -> None:
    """``handler(batch)`` for a backend's reader: what the handler raises is logged, and the
    reader (which may be serving other QPs, SA replies, events) goes on."""
    try:
        handler(batch)
    except Exception:
        log.exception("received MADs could not be handled; dropped", mads=len(batch))


class SaCall:
    """One SA request on its way (``Port.sa_start``): ended once, by its reply or its failure.

    The backend ends it (``end``) in the round that reads the reply, so what waits on
    ``when_ended`` runs there (a resolution's route, its client's reply: no scheduler pass
    after the MAD in). What a umad layer does after the send (retransmissions, time-outs,
    RMPP segments) is in ``drive``, run by the caller's task through ``wait``, which returns
    the reply or raises ``SaTimeout``/``SaSendError`` once the call ended."""

    __slots__ = ("_drive", "_enders", "abandoned", "error", "reply")

    def __init__(self, drive: Callable[[SaCall], Awaitable[None]]) -> None:
        self._drive = drive
        self._enders: list[Callable[[SaCall], None]] = []
        self.reply: bytes | None = None
        self.error: FabricError | None = None
        self.abandoned = False
        """Ended because the task in ``wait`` was cancelled first (nobody reads it)."""

    @property
    def ended(self) -> bool:
        return self.reply is not None or self.error is not None

    def when_ended(self, ender: Callable[[SaCall], None]) -> None:
        """Call ``ender(self)`` when the call ends (at once if it has)."""
        if self.ended:
            ender(self)
        else:
            self._enders.append(ender)

    def end(self, reply: bytes | None, error: FabricError | None = None) -> None:
        """(The backend.) The reply, or the failure; the first end counts."""
        if self.ended:
            return
        if reply is None and error is None:
            error = SaSendError("an SA call ended with neither a reply nor an error")
        self.reply, self.error = reply, error
        enders, self._enders = self._enders, []
        for ender in enders:
            try:
                ender(self)
            except Exception:
                # One waiter's bug must not keep the others (the credit's return) from it.
                log.exception("an SA call's waiter failed")

    def result(self) -> bytes:
        if self.reply is not None:
            return self.reply
        raise self.error or SaSendError("the SA call has not ended")

    async def wait(self) -> bytes:
        """Drive the call to its end; its reply, or its failure raised. When the task is
        cancelled first, the call ends with SaTimeout (nobody will read its reply)."""
        try:
            if not self.ended:
                await self._drive(self)
        finally:
            if not self.ended:
                self.abandoned = True
                self.end(None, SaTimeout("the SA call was abandoned"))
        return self.result()


class UdQp(abc.ABC):
    """The UD QP of one endpoint (Q_Key 0x80010000)."""

    @property
    @abc.abstractmethod
    def qpn(self) -> int: ...

    @abc.abstractmethod
    async def send(self, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        """Post one 256-byte MAD; returns at its send completion.

        ``remote_qpn`` is ``MULTICAST_QPN`` for a multicast send (``av.dlid`` = MLID and
        ``av.dgid`` = MGID of an attached group). Raises FabricError on a completion error.
        """

    @abc.abstractmethod
    def post(self, mad: bytes, av: AddressVector, remote_qpn: int) -> None:
        """Post one 256-byte MAD without waiting for it, as ``ibv_post_send``: on its way
        (handed to the HCA, or to the fabric's transport) when this returns, never blocking.
        Its completion is reaped by the backend; a completion error is logged and counted
        there (``completion_errors``), the poster has moved on.

        Raises SendQueueFull when every send slot is in flight, FabricError when it cannot
        be posted at all (QP closed, port down, a malformed MAD or address vector).
        """

    completion_errors: int = 0
    """Posted sends whose completion reported an error (a backend that has them counts)."""

    async def serve(self, handler: MadHandler, limit: int = RECEIVE_BATCH) -> None:
        """Hand every received MAD to ``handler``, at most ``limit`` per call, until the QP is
        closed (then return). A backend whose receives are read by whichever task waits
        calls ``handler`` from the round that read them, not after a wake-up of this task.
        ``handler`` runs synchronously: it must not raise (what it raises is logged and the
        MADs are lost) and may ``post``."""
        while True:
            try:
                batch = await self.receive_many(limit)
            except trio.ClosedResourceError:
                return
            except FabricError as exc:
                # A receive completion error costs one buffer, not the endpoint (defect 46).
                self.completion_errors += 1
                log.debug("receive error", qpn=self.qpn, error=str(exc))
                await trio.lowlevel.checkpoint()  # a backend failing at once cannot spin us
                continue
            deliver_batch(handler, batch)

    @abc.abstractmethod
    async def receive(self) -> ReceivedMad:
        """Wait for the next received MAD (the receive buffer is re-posted by the backend)."""

    async def receive_many(self, limit: int) -> list[ReceivedMad]:
        """Wait for received MADs; return those queued already, at least one, at most
        ``limit``. A job start brings every peer's request in one burst: one call per burst
        instead of one per MAD. Backends with a queue override this."""
        return [await self.receive()]

    @abc.abstractmethod
    async def attach_mcast(self, mgid: bytes, mlid: int) -> None: ...

    @abc.abstractmethod
    async def detach_mcast(self, mgid: bytes, mlid: int) -> None: ...

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Destroy the QP; pending ``receive`` calls raise ``trio.ClosedResourceError``."""


class Port(abc.ABC):
    """One physical port of a device."""

    @property
    @abc.abstractmethod
    def port_num(self) -> int: ...

    @abc.abstractmethod
    async def query(self) -> PortAttributes:
        """Current attributes (state, LID, SM, GID and P_Key tables, MTU/rate/width)."""

    async def sa_send(
        self, mad: bytes, dest: SaDestination, *, timeout_ms: int, retries: int
    ) -> bytes:
        """Send one SA MAD to the SM (QP1, Q_Key 0x80010000) and return its response.

        umad semantics: the backend retransmits ``retries`` times, each attempt waiting
        ``timeout_ms``; the response is matched on the low 32 bits of the TID (the upper
        32 bits may be rewritten, as the kernel does). Responses longer than one MAD
        (RMPP, GetTable) are returned reassembled: MAD header + SA header + all records.
        Raises SaTimeout or SaSendError. This is ``sa_start``'s call, waited for.
        """
        await trio.lowlevel.checkpoint()
        call = self.sa_start(mad, dest, timeout_ms=timeout_ms, retries=retries)
        if call is None:
            raise SaSendError(f"{type(self).__name__} cannot send SA MADs")
        return await call.wait()

    def sa_start(
        self, mad: bytes, dest: SaDestination, *, timeout_ms: int, retries: int
    ) -> SaCall | None:
        """``sa_send`` without waiting: the MAD is sent before this returns and the call
        ends in the round that reads its reply (``SaCall``); its retransmissions and time-out
        are driven by ``SaCall.wait``, which the caller runs in a task. None: this backend
        cannot send without waiting (use ``sa_send``). Raises SaSendError as ``sa_send``."""
        return None

    async def sa_report(self) -> bytes:
        """Wait for the next SubnAdmReport the SA sent to this port's QP1 (the events the
        port subscribed to with InformInfo). A backend that cannot receive unsolicited SA
        MADs says so with ``SaSendError``."""
        raise SaSendError(f"{type(self).__name__} does not receive SA reports")

    async def sa_post(self, mad: bytes, dest: SaDestination) -> None:
        """Send one SA MAD that gets no answer (a SubnAdmReportResp), its TID unchanged."""
        raise SaSendError(f"{type(self).__name__} cannot send unanswered SA MADs")

    @abc.abstractmethod
    async def open_ud(self, pkey_index: int, *, recv_depth: int) -> UdQp:
        """Create the ACM UD QP on this port (INIT -> RTR -> RTS, Q_Key 0x80010000)."""


class Device(abc.ABC):
    """One HCA."""

    @property
    def verbs_context(self) -> int | None:
        """Its ``struct ibv_context *`` when it is a libibverbs device (C providers need one)."""
        return None

    @property
    @abc.abstractmethod
    def name(self) -> str: ...

    @property
    @abc.abstractmethod
    def node_guid(self) -> int: ...

    @property
    @abc.abstractmethod
    def phys_port_cnt(self) -> int: ...

    @abc.abstractmethod
    def port(self, port_num: int) -> Port: ...

    @abc.abstractmethod
    async def wait_event(self) -> PortEvent:
        """Wait for the next async event of this device."""


PortT = TypeVar("PortT", bound=Port)


class PortTableDevice(Device, Generic[PortT]):
    """A device whose name and GUID are fixed when opened and whose ports sit in a table.

    Backends fill ``ports`` (port number -> port) in their constructor.
    """

    def __init__(self, name: str, node_guid: int) -> None:
        self._name = name
        self._node_guid = node_guid
        self.ports: dict[int, PortT] = {}

    @property
    def name(self) -> str:
        return self._name

    @property
    def node_guid(self) -> int:
        return self._node_guid

    @property
    def phys_port_cnt(self) -> int:
        return max(self.ports, default=0)

    def port(self, port_num: int) -> PortT:
        try:
            return self.ports[port_num]
        except KeyError:
            known = ", ".join(str(num) for num in sorted(self.ports)) or "none"
            raise FabricError(f"{self._name} has no port {port_num} (ports: {known})") from None


IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class InterfaceAddress:
    """An IP address of an IPoIB interface, tied to the port GID and P_Key it runs on."""

    ifname: str
    address: IpAddress
    prefixlen: int
    gid: bytes
    """Port GID of the interface (bytes 4..19 of its 20-byte hardware address)."""
    pkey: int
    """Interface P_Key (always with the full-member bit 0x8000 set)."""

    @property
    def display(self) -> str:
        """Start-up display form, ``a.b.c.d/prefixlen`` (behavior.md §5.3)."""
        return f"{self.address}/{self.prefixlen}"


@dataclass(frozen=True, slots=True)
class IpEvent:
    """An address appeared (``added``) or disappeared on an IPoIB interface."""

    added: bool
    address: InterfaceAddress


class Fabric(abc.ABC):
    """A backend: opens the devices of this node and reports its IPoIB addresses."""

    offers_verbs: bool = False
    """Its devices are libibverbs devices (``Device.verbs_context``), so providers built for
    rdma-core's ibacm can run on them."""

    @abc.abstractmethod
    async def open(self) -> Sequence[Device]:
        """Devices in enumeration order; raises NoDevicesError when there is none."""

    @abc.abstractmethod
    async def interface_addresses(self) -> Sequence[InterfaceAddress]:
        """Every IPv4/IPv6 address of every IPoIB interface of this node."""

    @abc.abstractmethod
    async def wait_ip_event(self) -> IpEvent:
        """Wait for the next address change (RTM_NEWADDR/RTM_DELADDR for IPv4 and IPv6)."""

    @property
    @abc.abstractmethod
    def hostname(self) -> str:
        """This node's host name (used for generated address files)."""

    @abc.abstractmethod
    async def aclose(self) -> None: ...

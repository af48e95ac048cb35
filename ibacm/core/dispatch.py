"""Client request dispatch: one framed request in, the reply bytes out (or None = close).

The rules are client-protocol.md §5-§8 and behavior.md §7/§14/§15, with the C defects fixed
where the wire allows:

* RESOLVE address form: the §5.3 validation order exactly; 8 entries and no SOURCE is EINVAL
  (C wrote a 9th entry past its buffer, defect 7); source selection errors are ACM statuses
  (defect 6);
* path form: ``data[0..2]`` of the request are never used (defect 8); the first endpoint
  WITH an address of a qualifying port serves it (defect 11);
* PERF_QUERY by index N = the N-th endpoint overall in §3.6 order (C also used N as a port
  filter, defect 10);
* bytes beyond a request's length read as zero (defect 9).

Counters: the global RESOLVE counter counts every RESOLVE message (QUERY_SA included, before
validation); ERROR/NODATA count RESOLVE replies with a status other than success/ENODATA or
equal to ENODATA, except QUERY_SA replies (behavior.md §14).

Only automatic source selection does I/O (a UDP ``connect``), through an injectable probe, so
the dispatcher runs in unit tests without sockets.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ibacm.core.model import (
    AddressSlot,
    DeviceState,
    EndpointState,
    all_addresses,
    endpoint_by_index,
    find_address,
    find_path_source,
)
from ibacm.core.srcaddr import (
    LocalIp,
    Probe,
    SourceSelectionError,
    kernel_probe,
    select_source,
)
from ibacm.fabric.api import FabricError, SaTimeout
from ibacm.log import get_logger
from ibacm.provider.api import Counter, Counters, ResolveRequest, ResolveResult
from ibacm.wire.client import (
    EP_LEN,
    HDR_LEN,
    MAX_EPS,
    MSG_MAX,
    OP_MASK,
    AcmHdr,
    AcmMessage,
    AcmOp,
    AcmStatus,
    AddrType,
    EpAddr,
    EpConfig,
    EpFlag,
    PerfScope,
    decode_ep_request,
    decode_perf_request,
    encode_ep_reply,
    encode_perf_reply,
    encode_query_sa_reply,
    encode_resolve_reply,
    is_address_type,
)
from ibacm.wire.counters import COUNTER_MASK
from ibacm.wire.errors import WireError
from ibacm.wire.path_record import PathRecord

log = get_logger("ibacm.dispatch")

QUERY_SA_LENGTH = HDR_LEN + EP_LEN  # 88
# Plain ints: ``int & IntFlag`` goes through enum's slow reflected operator on every request.
_SOURCE = int(EpFlag.SOURCE)
_DEST = int(EpFlag.DEST)
_QUERY_SA = int(EpFlag.QUERY_SA)
_RESOLVE = int(AcmOp.RESOLVE)
_PERF_QUERY = int(AcmOp.PERF_QUERY)
_EP_QUERY = int(AcmOp.EP_QUERY)


class CoreError(Exception):
    """A RESOLVE the core rejects; answered with opcode 0x81 and a bare header."""

    def __init__(self, status: AcmStatus, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True)
class AddressPlan:
    """A validated address-form RESOLVE (client-protocol.md §5.3 steps 1-2)."""

    entries: tuple[EpAddr, ...]
    dst_index: int
    src_index: int | None


def plan_address_form(message: AcmMessage) -> AddressPlan:
    """Validate SOURCE/DEST entries; raises CoreError at the first offending entry."""
    src_index: int | None = None
    dst_index: int | None = None
    for index, entry in enumerate(message.entries):
        if entry.flags & _SOURCE:
            if src_index is not None:
                raise CoreError(AcmStatus.ESRCADDR, f"second SOURCE entry at index {index}")
            if not is_address_type(entry.type):
                raise CoreError(AcmStatus.ESRCTYPE, f"SOURCE entry {index} has type {entry.type}")
            src_index = index
        if entry.flags & _DEST:
            if dst_index is not None:
                raise CoreError(AcmStatus.EDESTADDR, f"second DEST entry at index {index}")
            if not is_address_type(entry.type):
                raise CoreError(AcmStatus.EDESTTYPE, f"DEST entry {index} has type {entry.type}")
            dst_index = index
    if dst_index is None:
        raise CoreError(AcmStatus.EDESTTYPE, "no DEST entry")
    if src_index is None:
        if len(message.entries) >= MAX_EPS:
            raise CoreError(AcmStatus.EINVAL, "8 entries and no SOURCE: no room for the source")
        if message.entries[dst_index].type not in (AddrType.IP, AddrType.IP6, AddrType.NAME):
            raise CoreError(
                AcmStatus.EDESTTYPE, "no SOURCE and the DEST is neither an IP address nor a name"
            )
    return AddressPlan(tuple(message.entries), dst_index, src_index)


def entry_zero(frame: bytes) -> EpAddr:
    """Entry 0 of a RESOLVE as C sees it: bytes beyond the length are zero."""
    if len(frame) >= HDR_LEN + EP_LEN:
        return EpAddr.decode(frame[HDR_LEN : HDR_LEN + EP_LEN])
    padded = frame[:MSG_MAX].ljust(MSG_MAX, b"\0")
    return EpAddr.decode(padded[HDR_LEN : HDR_LEN + EP_LEN])


def ip_of(entry: EpAddr) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    if entry.type == AddrType.IP:
        return ipaddress.IPv4Address(entry.info[:4])
    return ipaddress.IPv6Address(entry.info[:16])


def local_ips(devices: Sequence[DeviceState]) -> list[LocalIp]:
    """The endpoint IP addresses source selection may pick, in §3.6 order."""
    ips = []
    for slot in all_addresses(devices):
        if slot.core.type in (AddrType.IP, AddrType.IP6):
            address = ip_of(EpAddr(0, slot.core.type, slot.core.info))
            ips.append(LocalIp(address, slot.prefixlen, slot.ifname))
    return ips


def ep_config(endpoint: EndpointState) -> EpConfig:
    """The EP_QUERY body of an endpoint (client-protocol.md §4.2)."""
    port = endpoint.port
    device = port.device.core
    provider = port.provider
    return EpConfig(
        dev_guid=device.node_guid,
        port_num=port.port_num,
        phys_port_cnt=device.phys_port_cnt,
        pkey=endpoint.pkey,
        prov_name=provider.name if provider is not None else "none",
        addrs=[slot.core.display for slot in endpoint.addresses()],
    )


def count_reply(counters: Counters, status: int) -> None:
    if status == AcmStatus.ENODATA:
        counters.increment(Counter.NODATA)
    elif status != AcmStatus.SUCCESS:
        counters.increment(Counter.ERROR)


@dataclass(eq=False)
class Dispatcher:
    """Answers client requests from the core's tables and the providers."""

    devices: Sequence[DeviceState]
    counters: Counters
    probe: Probe = kernel_probe
    max_paths: int = field(default=MAX_EPS)

    def answer_now(self, frame: bytes) -> bytes | None:
        """Admit one framed request (``ClientFramer`` checked version, opcode and length).

        PERF_QUERY and EP_QUERY are answered at once, as the C main loop does, so counters
        reflect every request received before; a RESOLVE is counted now and answered later
        by ``resolve`` (None is returned).
        """
        op = frame[1] & OP_MASK
        if op == _RESOLVE:
            self.counters.increment(Counter.RESOLVE)
            return None
        if op == _PERF_QUERY:
            return self.perf_query(frame)
        if op == _EP_QUERY:
            return self.ep_query(frame)
        raise WireError(f"opcode 0x{frame[1]:02x} is not a request this server handles")

    async def handle(self, frame: bytes, client: str) -> bytes:
        """The reply to one framed request (the client loop answered it if it was a cache
        hit; this is everything else)."""
        reply = self.answer_now(frame)
        if reply is not None:
            return reply
        return await self.resolve(frame, client)

    # -- RESOLVE -------------------------------------------------------------------------------
    def begin_resolve(self, frame: bytes, client: str, done: Callable[[bytes], None]) -> bool:
        """An admitted RESOLVE started here and now, without a task: True when the provider
        took it (``done`` gets the reply, exactly once, maybe before this returns); False
        with nothing counted or changed when it is not the common case (address form with
        its SOURCE given, a provider that can: ``Provider.begin_resolve``), and ``resolve``
        answers it. Raises WireError for a request that does not decode, as ``resolve``."""
        message = AcmMessage.decode(frame)
        if entry_zero(frame).type == AddrType.PATH:
            return False
        try:
            plan = plan_address_form(message)
        except CoreError:
            return False
        if plan.src_index is None:
            return False
        slot, request = self._addressed(plan.entries, plan.src_index, plan.dst_index, client)
        provider = slot.owner.port.provider if slot is not None else None
        if slot is None or provider is None:
            return False
        hdr = message.hdr
        answered = False

        def finished(result: ResolveResult) -> None:
            nonlocal answered
            if answered:
                log.error("provider answered a request twice", client=client)
                return
            answered = True
            count_reply(self.counters, result.status)
            done(self.resolve_reply(hdr, result, None))

        try:
            return provider.begin_resolve(slot.ctx, request, finished)
        except Exception as exc:
            if not answered:
                finished(_failed(exc, client))
            return True

    async def resolve(self, frame: bytes, client: str) -> bytes:
        """Answer an admitted RESOLVE (address form, path form or QUERY_SA)."""
        message = AcmMessage.decode(frame)
        first = entry_zero(frame)
        if first.type == AddrType.PATH and first.flags & _QUERY_SA:
            return await self.query_sa(message, client)
        try:
            if first.type == AddrType.PATH:
                reply, status = await self.resolve_path(message, client)
            else:
                reply, status = await self.resolve_address(message, client)
        except CoreError as exc:
            log.debug("resolve rejected", client=client, status=exc.status.name, reason=exc.reason)
            reply = encode_resolve_reply(message.hdr, exc.status, ack=True)
            status = exc.status
        count_reply(self.counters, status)
        return reply

    async def resolve_address(self, message: AcmMessage, client: str) -> tuple[bytes, int]:
        result, chosen = await self.address_result(message, client)
        return self.resolve_reply(message.hdr, result, chosen), result.status

    async def address_result(
        self, message: AcmMessage, client: str
    ) -> tuple[ResolveResult, EpAddr | None]:
        """Address-form resolution; also returns the source the server chose, if any."""
        plan = plan_address_form(message)
        entries = list(plan.entries)
        chosen: EpAddr | None = None
        src_index = plan.src_index
        if src_index is None:
            chosen = await self.choose_source(entries[plan.dst_index])
            entries.append(chosen)
            src_index = len(entries) - 1
        slot, request = self._addressed(entries, src_index, plan.dst_index, client)
        if slot is None:
            source = request.source
            raise CoreError(AcmStatus.ESRCADDR, f"{source.address_text()} is not a local address")
        return await self.call_resolve(slot, request), chosen

    def _addressed(
        self, entries: Sequence[EpAddr], src_index: int, dst_index: int, client: str
    ) -> tuple[AddressSlot | None, ResolveRequest]:
        """The local address of the request's SOURCE (None: not ours), and the request."""
        source = entries[src_index]
        slot = find_address(self.devices, source.type, source.info)
        return slot, ResolveRequest(tuple(entries), src_index, dst_index, client)

    async def choose_source(self, dest: EpAddr) -> EpAddr:
        if dest.type == AddrType.NAME:
            return self.choose_name_source()
        try:
            address = await select_source(ip_of(dest), local_ips(self.devices), self.probe)
        except SourceSelectionError as exc:
            raise CoreError(exc.status, str(exc)) from exc
        return EpAddr.from_ip(address, EpFlag.SOURCE)

    def choose_name_source(self) -> EpAddr:
        """Beyond C (which needs a SOURCE for a name): this host's first name, in endpoint
        order (behavior.md §3.6), as ``ib_acme -A`` lists it first in the address file."""
        for slot in all_addresses(self.devices):
            if slot.core.type == AddrType.NAME:
                return EpAddr(EpFlag.SOURCE, AddrType.NAME, slot.core.info)
        raise CoreError(AcmStatus.ESRCADDR, "no SOURCE and this host has no name to send from")

    async def resolve_path(self, message: AcmMessage, client: str) -> tuple[bytes, int]:
        if message.hdr.length < QUERY_SA_LENGTH:
            raise CoreError(AcmStatus.EINVAL, f"path request of {message.hdr.length} bytes")
        result = await self.path_result(message.entries[0], client)
        return self.resolve_reply(message.hdr, result, None), result.status

    async def path_result(self, entry: EpAddr, client: str) -> ResolveResult:
        """Path-form resolution of one PATH entry (client socket or kernel netlink)."""
        path = entry.path()
        if path.dlid == 0 and path.dgid == bytes(16):
            raise CoreError(AcmStatus.EDESTADDR, "path request without DLID or DGID")
        slot = find_path_source(self.devices, path)
        if slot is None:
            raise CoreError(AcmStatus.ESRCADDR, "no local endpoint matches the path")
        # Only entry 0 travels on (the header's data[0..2] never do: defect 8).
        request = ResolveRequest((entry,), 0, 0, client)
        return await self.call_resolve(slot, request)

    # -- kernel local SA service (RDMA_NL_LS) ---------------------------------------------------
    async def kernel_path(self, path: PathRecord, flags: EpFlag) -> ResolveResult:
        """A kernel RESOLVE: counted like a client RESOLVE, answered as a result."""
        self.counters.increment(Counter.RESOLVE)
        entry = EpAddr.from_path(path, int(flags) & ~int(EpFlag.NODELAY | EpFlag.QUERY_SA))
        try:
            result = await self.path_result(entry, "netlink")
        except CoreError as exc:
            result = ResolveResult(exc.status)
        count_reply(self.counters, result.status)
        return result

    async def kernel_ip(
        self, address: ipaddress.IPv4Address | ipaddress.IPv6Address
    ) -> ResolveResult:
        """A kernel IP_RESOLVE (C lacks it): address form, the server picks the source."""
        self.counters.increment(Counter.RESOLVE)
        message = AcmMessage(
            hdr=AcmHdr(opcode=AcmOp.RESOLVE), entries=[EpAddr.from_ip(address, EpFlag.DEST)]
        )
        try:
            result, _ = await self.address_result(message, "netlink")
        except CoreError as exc:
            result = ResolveResult(exc.status)
        count_reply(self.counters, result.status)
        return result

    async def call_resolve(self, slot: AddressSlot, request: ResolveRequest) -> ResolveResult:
        provider = slot.owner.port.provider
        if provider is None:
            return ResolveResult(AcmStatus.ENODATA)
        try:
            return await provider.resolve(slot.ctx, request)
        except Exception as exc:
            return _failed(exc, request.client)

    def resolve_reply(self, hdr: AcmHdr, result: ResolveResult, chosen: EpAddr | None) -> bytes:
        status = result.status
        paths = result.paths
        if status == AcmStatus.SUCCESS and not paths:
            log.error("provider reported success without a path record")
            status = AcmStatus.ENODATA
        room = min(self.max_paths, MAX_EPS) - (1 if chosen is not None else 0)
        return encode_resolve_reply(hdr, status, paths[:room], chosen)

    async def query_sa(self, message: AcmMessage, client: str) -> bytes:
        """QUERY_SA (form C): the request echoed with the SA's answer; no ERROR/NODATA count."""
        if message.hdr.length != QUERY_SA_LENGTH:
            return encode_query_sa_reply(message, AcmStatus.EINVAL, None)
        path = message.entries[0].path()
        slot = find_path_source(self.devices, path)
        provider = slot.owner.port.provider if slot is not None else None
        if slot is None or provider is None:
            return encode_query_sa_reply(message, AcmStatus.ESRCADDR, None)
        try:
            status, record = await provider.query(slot.ctx, path)
        except SaTimeout:
            status, record = AcmStatus.ETIMEDOUT, None
        except FabricError as exc:
            log.warning("SA query failed in the fabric", client=client, error=str(exc))
            status, record = AcmStatus.ETIMEDOUT, None
        except Exception:
            log.exception("provider query failed", client=client)
            status, record = AcmStatus.ENOMEM, None
        return encode_query_sa_reply(message, status & 0xFF, record)

    def undersized_resolve(self, head: bytes) -> bytes | None:
        """The reply to a RESOLVE whose length field is below 16 (client-protocol.md §8:
        EINVAL), or None when ``head`` is not such a request. The connection is closed
        afterwards because the stream can no longer be framed."""
        if len(head) < 8 or head[1] & OP_MASK != AcmOp.RESOLVE:
            return None
        hdr = AcmHdr.decode(head[:HDR_LEN].ljust(HDR_LEN, b"\0"))
        if hdr.length >= HDR_LEN:
            return None
        self.counters.increment(Counter.RESOLVE)
        count_reply(self.counters, AcmStatus.EINVAL)
        return encode_resolve_reply(hdr, AcmStatus.EINVAL, ack=True)

    # -- PERF_QUERY / EP_QUERY -----------------------------------------------------------------
    def perf_query(self, frame: bytes) -> bytes:
        request = decode_perf_request(frame)
        scope = request.scope
        if scope is PerfScope.GLOBAL:
            return encode_perf_reply(request.hdr, AcmStatus.SUCCESS, self.counters.snapshot())
        endpoint: EndpointState | None = None
        if scope is PerfScope.INDEX:
            endpoint = endpoint_by_index(self.devices, request.index)
        elif request.source is not None:
            slot = find_address(self.devices, request.source.type, request.source.info)
            endpoint = slot.owner if slot is not None else None
        provider = endpoint.port.provider if endpoint is not None else None
        if endpoint is None or provider is None:
            return encode_perf_reply(request.hdr, AcmStatus.ESRCADDR, ())
        values = [int(value) & COUNTER_MASK for value in provider.query_perf(endpoint.ctx)]
        return encode_perf_reply(request.hdr, AcmStatus.SUCCESS, values)

    def ep_query(self, frame: bytes) -> bytes:
        request = decode_ep_request(frame)
        endpoint = endpoint_by_index(self.devices, request.index, request.port)
        if endpoint is None:
            return encode_ep_reply(request.hdr, AcmStatus.EINVAL, None)
        return encode_ep_reply(request.hdr, AcmStatus.SUCCESS, ep_config(endpoint))


def _failed(exc: Exception, client: str) -> ResolveResult:
    """What a provider's failure to resolve answers the client (``resolve`` or
    ``begin_resolve``)."""
    if isinstance(exc, SaTimeout):
        return ResolveResult(AcmStatus.ETIMEDOUT)
    if isinstance(exc, FabricError):
        log.warning("resolve failed in the fabric", client=client, error=str(exc))
        return ResolveResult(AcmStatus.ENODATA)
    # A provider bug costs this one request, answered like C's internal failures.
    log.error("provider resolve failed", client=client, exc_info=exc)
    return ResolveResult(AcmStatus.ENOMEM)

"""Providers built for rdma-core's ``ibacm`` (``acm_prov.h``), loaded unchanged into this daemon.

``discover_c_providers(directory, ...)`` loads every ``*.so`` of ``provider_lib_path`` as
rdma-core's core does (``provider_query``, version and structure size checked; a failure is
logged with the path and the file skipped) and wraps each in a ``CProvider``: a ``Provider``
of the Python API whose calls go to the C callbacks.

The C side: ``libibacm_core.so`` (``acm_core.c``, built from the package) exports the core
functions a provider calls back. It is loaded ``RTLD_GLOBAL`` before any provider so their
``acm_*`` references bind to it, and it forwards what needs the daemon to ``CoreBridge``.

Threads: a C provider runs its own threads (completion handler, retry timer) that call the
core back at any time. No callback ever waits for the trio thread: responses, SA MADs and
counters are handed over with ``TrioToken.run_sync_soon``; GID tables and the log are read and
written directly. So the trio thread may call into a provider without a deadlock; calls that
can block on the provider's locks or the fabric (open/close, resolve, query, events) go through
``trio.to_thread`` all the same.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import trio

from ibacm.compiled.clib import CBuildError, ensure_library
from ibacm.fabric.api import FabricError, PortEventType, SaTimeout
from ibacm.fabric.hw.verbs_attrs import EVENT_CODES
from ibacm.log import get_logger
from ibacm.provider.api import (
    CoreAddress,
    CoreDevice,
    CoreEndpoint,
    CorePort,
    CoreServices,
    Counter,
    Provider,
    ResolveRequest,
    ResolveResult,
)
from ibacm.provider.cprov import abi
from ibacm.wire.client import (
    HDR_LEN,
    AcmHdr,
    AcmMessage,
    AcmOp,
    AcmStatus,
    AddrType,
    EpAddr,
    EpFlag,
    reply_length,
)
from ibacm.wire.counters import ACM_MAX_COUNTER
from ibacm.wire.errors import WireError
from ibacm.wire.path_record import PathRecord

log = get_logger("ibacm.provider.cprov")

HERE = Path(__file__).resolve().parent
CORE_SOURCES = (HERE / "acm_core.c", Path("/usr/include/infiniband/acm_prov.h"))
SA_MAD_SIZE = 256


class CProviderError(FabricError):
    """A C provider refused a call (its return code) or cannot be used where asked."""


@dataclass(eq=False)
class _Waiter:
    done: trio.Event = field(default_factory=trio.Event)
    reply: bytes = b""


class CoreBridge:
    """The daemon's side of ``libibacm_core.so``: one per process (the C library is)."""

    def __init__(self, core: CoreServices, token: trio.lowlevel.TrioToken, opts_file: str) -> None:
        self.core = core
        self.token = token
        self.waiters: dict[int, _Waiter] = {}
        self.ports: dict[int, CorePort] = {}
        """``struct acm_port *`` -> the port, for GID lookups."""
        self.endpoints: dict[int, CoreEndpoint] = {}
        """``struct acm_endpoint *`` -> the endpoint, for SA MADs."""
        self._next_id = 1
        self.library = ctypes.CDLL(str(core_library()), mode=ctypes.RTLD_GLOBAL)
        self.library.cprov_sa_packet_offset.restype = ctypes.c_size_t
        self.sa_offset = int(self.library.cprov_sa_packet_offset())
        self.library.cprov_sa_done.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_size_t,
        ]
        self._callbacks = abi.Callbacks(
            abi.LOG_CB(self._log),
            abi.RESPONSE_CB(self._response),
            abi.RESPONSE_CB(self._response),
            abi.SEND_SA_CB(self._send_sa),
            abi.GET_GID_CB(self._get_gid),
            abi.COUNT_CB(self._count),
        )
        level = int(getattr(core.options, "log_level", 0))
        self.library.cprov_init(ctypes.byref(self._callbacks), opts_file.encode(), level)

    def new_request(self) -> tuple[int, _Waiter]:
        request_id, self._next_id = self._next_id, self._next_id + 1
        waiter = self.waiters[request_id] = _Waiter()
        return request_id, waiter

    # -- callbacks (any thread) ------------------------------------------------------------
    def _log(self, level: int, text: bytes) -> None:
        line = text.decode(errors="replace").rstrip("\n")
        if level == 0:
            log.warning(line) if "ERROR" in line.upper() else log.info(line)
        elif level == 1:
            log.info(line)
        else:
            log.debug(line)

    def _response(self, request_id: int, msg: int) -> int:
        head = ctypes.string_at(msg, HDR_LEN)
        length = min(max(reply_length(head), HDR_LEN), abi.MSG_SIZE)
        reply = ctypes.string_at(msg, length)

        def deliver() -> None:
            waiter = self.waiters.pop(request_id, None)
            if waiter is not None:  # else the client went away meanwhile
                waiter.reply = reply
                waiter.done.set()

        self._soon(deliver)
        return 0

    def _send_sa(self, mad: int, endpoint: int) -> int:
        target = self.endpoints.get(endpoint)
        if target is None:
            return -errno.EINVAL
        request = ctypes.string_at(mad + self.sa_offset, SA_MAD_SIZE)
        self._soon(lambda: target.port.nursery.start_soon(self._sa, target.port, mad, request))
        return 0

    def _get_gid(self, port: int, index: int, gid: Any) -> int:
        target = self.ports.get(port)
        if target is None or not 0 <= index < len(target.attrs.gids):
            return -1
        ctypes.memmove(gid, target.attrs.gids[index], 16)
        return 0

    def _count(self, kind: int) -> None:
        if 0 <= kind < ACM_MAX_COUNTER:
            self._soon(lambda: self.core.counters.increment(Counter(kind)))

    def _soon(self, function: Callable[[], None]) -> None:
        # After the daemon's run ends a provider thread may still call: nothing to do then.
        with contextlib.suppress(trio.RunFinishedError):
            self.token.run_sync_soon(function)

    # -- SA MADs ---------------------------------------------------------------------------
    async def _sa(self, port: CorePort, mad: int, request: bytes) -> None:
        status, reply = 0, b""
        try:
            reply = await self.core.sa_request(port, request)
        except SaTimeout:
            status = errno.ETIMEDOUT
        except FabricError as exc:
            log.info("SA MAD of a C provider not sent", error=str(exc))
            status = errno.EIO
        finally:
            # Even when the port goes down the provider gets its MAD back (with a status).
            with trio.CancelScope(shield=True):
                if not reply and status == 0:
                    status = errno.ECANCELED
                answer = reply[:SA_MAD_SIZE] if reply else None
                await trio.to_thread.run_sync(
                    self.library.cprov_sa_done, mad, status, answer, len(answer or b"")
                )


def core_library() -> Path:
    try:
        return ensure_library("libibacm_core", CORE_SOURCES)
    except CBuildError as exc:
        raise CProviderError(str(exc).splitlines()[0]) from exc


@dataclass(eq=False)
class _Device:
    struct: abi.AcmDevice
    ctx: int


@dataclass(eq=False)
class _Port:
    struct: abi.AcmPort
    ctx: int
    device: _Device


@dataclass(eq=False)
class _Endpoint:
    struct: abi.AcmEndpoint
    ctx: int
    port: _Port
    core: CoreEndpoint


@dataclass(eq=False)
class _Address:
    struct: abi.AcmAddress
    ctx: int
    endpoint: _Endpoint
    id_string: ctypes.Array[ctypes.c_char]


class CProvider(Provider):
    """A ``struct acm_provider`` behind the Python provider API (see the module docstring).

    One subclass per loaded library (``discover_c_providers``) carries its name, path and
    the C structure."""

    library_path: ClassVar[str] = ""
    struct: ClassVar[Any] = None
    handle: ClassVar[Any] = None
    """The loaded library (kept so it stays mapped while the class lives)."""
    shared_bridge: ClassVar[CoreBridge | None] = None

    def __init__(self, core: CoreServices) -> None:
        super().__init__(core)
        bridge = type(self).shared_bridge
        if bridge is None:
            raise CProviderError(f"{self.library_path}: loaded without the core library")
        self.bridge = bridge

    async def _call(self, what: str, function: Callable[..., int], *args: Any) -> None:
        rc = await trio.to_thread.run_sync(function, *args)
        if rc:
            raise CProviderError(f"{self.name} ({self.library_path}): {what} failed ({rc})")

    # -- lifecycle -------------------------------------------------------------------------
    async def open_device(self, device: CoreDevice) -> object:
        verbs = getattr(device.device, "verbs_context", None)
        if not verbs:
            raise CProviderError(
                f"{self.name} ({self.library_path}) needs a verbs device: run ibacm --fabric hw"
            )
        guid = int.from_bytes(device.node_guid.to_bytes(8, "big"), sys.byteorder)
        held = _Device(abi.AcmDevice(verbs, guid), 0)
        ctx = ctypes.c_void_p()
        await self._call(
            "open_device", self.struct.open_device, ctypes.byref(held.struct), ctypes.byref(ctx)
        )
        held.ctx = ctx.value or 0
        return held

    async def close_device(self, dev_ctx: object) -> None:
        assert isinstance(dev_ctx, _Device)
        await trio.to_thread.run_sync(self.struct.close_device, dev_ctx.ctx)

    async def open_port(self, port: CorePort, dev_ctx: object) -> object:
        assert isinstance(dev_ctx, _Device)
        held = _Port(abi.AcmPort(ctypes.pointer(dev_ctx.struct), port.port_num), 0, dev_ctx)
        self.bridge.ports[ctypes.addressof(held.struct)] = port
        ctx = ctypes.c_void_p()
        try:
            await self._call(
                "open_port",
                self.struct.open_port,
                ctypes.byref(held.struct),
                dev_ctx.ctx,
                ctypes.byref(ctx),
            )
        except BaseException:
            del self.bridge.ports[ctypes.addressof(held.struct)]
            raise
        held.ctx = ctx.value or 0
        return held

    async def close_port(self, port_ctx: object) -> None:
        assert isinstance(port_ctx, _Port)
        await trio.to_thread.run_sync(self.struct.close_port, port_ctx.ctx)
        self.bridge.ports.pop(ctypes.addressof(port_ctx.struct), None)

    async def open_endpoint(self, endpoint: CoreEndpoint, port_ctx: object) -> object:
        assert isinstance(port_ctx, _Port)
        struct = abi.AcmEndpoint(ctypes.pointer(port_ctx.struct), endpoint.pkey)
        held = _Endpoint(struct, 0, port_ctx, endpoint)
        self.bridge.endpoints[ctypes.addressof(struct)] = endpoint
        ctx = ctypes.c_void_p()
        try:
            await self._call(
                "open_endpoint",
                self.struct.open_endpoint,
                ctypes.byref(struct),
                port_ctx.ctx,
                ctypes.byref(ctx),
            )
        except BaseException:
            del self.bridge.endpoints[ctypes.addressof(struct)]
            raise
        held.ctx = ctx.value or 0
        return held

    async def close_endpoint(self, ep_ctx: object) -> None:
        assert isinstance(ep_ctx, _Endpoint)
        await trio.to_thread.run_sync(self.struct.close_endpoint, ep_ctx.ctx)
        self.bridge.endpoints.pop(ctypes.addressof(ep_ctx.struct), None)

    def add_address(self, address: CoreAddress, ep_ctx: object) -> object:
        # Called on the trio thread: safe, no callback waits for it (module docstring).
        assert isinstance(ep_ctx, _Endpoint)
        text = ctypes.create_string_buffer(address.display.encode()[:255])
        info = (ctypes.c_uint8 * 64).from_buffer_copy(address.info.ljust(64, b"\0")[:64])
        struct = abi.AcmAddress(
            ctypes.pointer(ep_ctx.struct),
            info,
            ctypes.cast(text, ctypes.c_char_p),
            int(address.type),
        )
        ctx = ctypes.c_void_p()
        rc = self.struct.add_address(ctypes.byref(struct), ep_ctx.ctx, ctypes.byref(ctx))
        if rc:
            raise CProviderError(f"{self.name}: add_address({address.display}) failed ({rc})")
        return _Address(struct, ctx.value or 0, ep_ctx, text)

    def remove_address(self, addr_ctx: object) -> None:
        assert isinstance(addr_ctx, _Address)
        self.struct.remove_address(addr_ctx.ctx)

    # -- requests --------------------------------------------------------------------------
    async def _request(self, call: Any, addr_ctx: object, message: bytes) -> bytes:
        assert isinstance(addr_ctx, _Address)
        buffer = ctypes.create_string_buffer(message.ljust(abi.MSG_SIZE, b"\0"), abi.MSG_SIZE)
        request_id, waiter = self.bridge.new_request()
        try:
            rc = await trio.to_thread.run_sync(call, addr_ctx.ctx, buffer, request_id)
            if rc:
                return b""
            await waiter.done.wait()
            return waiter.reply
        finally:
            self.bridge.waiters.pop(request_id, None)

    async def resolve(self, addr_ctx: object, request: ResolveRequest) -> ResolveResult:
        body = b"".join(entry.encode() for entry in request.entries)
        # rdma-core's core hands the provider the SOURCE and DEST positions in hdr.data.
        head = AcmHdr(
            opcode=AcmOp.RESOLVE,
            data1=request.src_index,
            data2=request.dst_index,
            length=HDR_LEN + len(body),
        ).encode()
        reply = await self._request(self.struct.resolve, addr_ctx, head + body)
        if not reply:
            return ResolveResult(AcmStatus.EINVAL)  # the provider refused the request
        return _resolve_result(reply)

    async def query(self, addr_ctx: object, path: PathRecord) -> tuple[int, PathRecord | None]:
        entry = EpAddr(EpFlag.QUERY_SA, AddrType.PATH, path.encode()).encode()
        head = AcmHdr(opcode=AcmOp.RESOLVE, length=HDR_LEN + len(entry)).encode()
        reply = await self._request(self.struct.query, addr_ctx, head + entry)
        if not reply:
            return AcmStatus.EINVAL, None
        try:
            message = AcmMessage.decode(reply)
        except WireError:
            return AcmStatus.EINVAL, None
        record = next((e.path() for e in message.entries if e.type == AddrType.PATH), None)
        return message.hdr.status, record

    async def handle_event(self, port_ctx: object, event: PortEventType) -> None:
        assert isinstance(port_ctx, _Port)
        code = EVENT_CODES.get(event)
        if code is not None:
            await trio.to_thread.run_sync(self.struct.handle_event, port_ctx.ctx, code)

    def query_perf(self, ep_ctx: object) -> Sequence[int]:
        assert isinstance(ep_ctx, _Endpoint)
        values = (ctypes.c_uint64 * ACM_MAX_COUNTER)()
        count = ctypes.c_uint8(ACM_MAX_COUNTER)
        self.struct.query_perf(ep_ctx.ctx, values, ctypes.byref(count))
        # Network byte order, as rdma-core's core copies them into a PERF_QUERY reply.
        got = [_be64(value) for value in list(values)[: min(count.value, ACM_MAX_COUNTER)]]
        # A C provider knows the header's counters only; ours it does not count read 0.
        return got + [0] * (len(Counter) - len(got))

    def describe_endpoint(self, ep_ctx: object) -> dict[str, Any]:
        return {"provider_library": self.library_path}


def _be64(value: int) -> int:
    return int.from_bytes(value.to_bytes(8, sys.byteorder), "big")


def _resolve_result(reply: bytes) -> ResolveResult:
    try:
        message = AcmMessage.decode(reply)
    except WireError:
        return ResolveResult(AcmStatus.EINVAL)
    status = (
        AcmStatus(message.hdr.status)
        if message.hdr.status in AcmStatus._value2member_map_
        else AcmStatus.EINVAL
    )
    if status != AcmStatus.SUCCESS:
        return ResolveResult(status)
    paths = tuple(entry.path() for entry in message.entries if entry.type == AddrType.PATH)
    return ResolveResult(status, paths) if paths else ResolveResult(AcmStatus.ENODATA)


@dataclass(frozen=True, slots=True)
class LoadedLibrary:
    """A provider library that passed rdma-core's checks."""

    name: str
    path: Path
    cls: type[CProvider]


@dataclass(frozen=True, slots=True)
class RejectedLibrary:
    path: Path
    reason: str


def discover_c_providers(
    directory: Path, bridge: CoreBridge
) -> tuple[list[LoadedLibrary], list[RejectedLibrary]]:
    """Every ``*.so`` regular file of ``directory`` (symbolic links are skipped, as rdma-core's
    core skips them), checked like rdma-core checks them. The core library must be loaded (and
    told the options file) first: a provider's constructor may already read its options."""
    loaded: list[LoadedLibrary] = []
    rejected: list[RejectedLibrary] = []
    try:
        candidates = sorted(p for p in directory.iterdir() if p.name.endswith(".so"))
    except OSError as exc:
        log.error("could not open provider lib dir", path=str(directory), error=str(exc))
        return loaded, rejected
    for path in candidates:
        if path.is_symlink() or not path.is_file():
            continue
        try:
            loaded.append(_load(path, bridge))
        except CProviderError as exc:
            rejected.append(RejectedLibrary(path, str(exc)))
            log.error("provider library skipped", path=str(path), reason=str(exc))
    return loaded, rejected


def _load(path: Path, bridge: CoreBridge) -> LoadedLibrary:
    try:
        handle = ctypes.CDLL(str(path), mode=ctypes.RTLD_LOCAL)
    except OSError as exc:
        raise CProviderError(f"could not load: {exc}") from exc
    try:
        query = abi.PROVIDER_QUERY(("provider_query", handle))
    except AttributeError as exc:
        raise CProviderError("provider_query not found") from exc
    pointer = ctypes.POINTER(abi.AcmProvider)()
    version = ctypes.c_uint32()
    if query(ctypes.byref(pointer), ctypes.byref(version)) or not pointer:
        raise CProviderError("provider_query failed")
    struct = pointer.contents
    if version.value != abi.ACM_PROV_VERSION or struct.size != ctypes.sizeof(abi.AcmProvider):
        raise CProviderError(
            f"unmatched provider version {version.value:#010x} (size {struct.size}), core "
            f"{abi.ACM_PROV_VERSION:#010x} (size {ctypes.sizeof(abi.AcmProvider)})"
        )
    raw_name = struct.name or b""
    name = raw_name.decode(errors="replace")
    if not name or len(raw_name) > 63:
        raise CProviderError(f"provider name {name!r} is not 1..63 bytes")
    attributes = {
        "name": name,
        "library_path": str(path),
        "struct": struct,
        "handle": handle,
        "shared_bridge": bridge,
    }
    cls = type(f"CProvider_{name}", (CProvider,), attributes)
    log.info("provider library loaded", provider=name, path=str(path))
    return LoadedLibrary(name, path, cls)

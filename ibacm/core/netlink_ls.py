"""The kernel local SA service: answering RDMA_NL_LS netlink requests (behavior.md §16).

When some socket listens on the RDMA netlink group LS, the kernel's SA client (rdma_cm, IPoIB)
asks it for PathRecords before it queries the SA. ``LsService`` turns one datagram into the
reply datagrams (sans-I/O apart from awaiting the resolver the core supplies);
``serve_netlink`` reads a socket and answers every request concurrently.

Beyond C (defects 49-51):

* RESOLVE, plus IP_RESOLVE (IP -> GID, answered with a DGID attribute) and SET_TIMEOUT: the
  service tells the kernel at start how long it may take (``SET_TIMEOUT``), and adopts a
  timeout another service set on the shared group.
* Every answer is sent within the kernel's timeout: a resolution still running when the
  deadline comes is answered with an error reply, so the kernel asks the SA itself at once
  instead of ignoring a late answer.
* All path records of a result are returned (the first as the primary path).
* Messages up to 64 KiB are read (C dropped anything over 592 bytes).

The core counts (global RESOLVE per accepted request) in the resolver it passes in.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Awaitable, Callable

import trio

from ibacm.log import get_logger
from ibacm.provider.api import ResolveResult
from ibacm.wire.client import AcmStatus, EpFlag
from ibacm.wire.errors import WireError
from ibacm.wire.netlink import (
    LS_TIMEOUT_DEFAULT_MS,
    NETLINK_RDMA,
    RDMA_NL_LS_GROUP_MASK,
    IbPathFlag,
    LsIpResolveRequest,
    LsRequestError,
    LsResolveRequest,
    LsSetTimeout,
    NetlinkClientError,
    NetlinkLengthError,
    NlMsgHdr,
    PathUse,
    clamp_timeout,
    decode_ls_message,
    encode_ls_error_reply,
    encode_ls_ip_resolve_reply,
    encode_ls_path_reply,
    encode_ls_set_timeout,
    reply_path_flags,
)
from ibacm.wire.path_record import PathRecord

log = get_logger("ibacm.netlink")

PathResolver = Callable[[PathRecord, EpFlag], Awaitable[ResolveResult]]
"""The core's path-form resolution (client id 0, never NODELAY)."""
IpResolver = Callable[[ipaddress.IPv4Address | ipaddress.IPv6Address], Awaitable[ResolveResult]]
"""The core's address-form resolution of an IP; the GID is the result's ``dgid``."""

RECV_SIZE = 1 << 16
KERNEL_ADDRESS = (0, RDMA_NL_LS_GROUP_MASK)
"""Replies go to the kernel (pid 0) on the LS group (behavior.md §16.1)."""
REQUESTED_TIMEOUT_MS = 15000
"""What the service asks the kernel to wait: two full ACM + SA rounds with default options
(3 x 2 s each), plus queueing."""
ANSWER_MARGIN = 0.1
"""Fraction of the kernel's timeout kept in reserve so an answer is never late."""
MIN_MARGIN_MS = 50


class LsService:
    """Answers RESOLVE / IP_RESOLVE requests and follows the kernel's LS timeout."""

    def __init__(
        self,
        resolve_path: PathResolver,
        *,
        resolve_ip: IpResolver | None = None,
        pid: int | None = None,
        requested_timeout_ms: int = REQUESTED_TIMEOUT_MS,
    ) -> None:
        self._resolve_path = resolve_path
        self._resolve_ip = resolve_ip
        self.pid = os.getpid() if pid is None else pid
        self.requested_timeout_ms = clamp_timeout(requested_timeout_ms)
        self.kernel_timeout_ms = LS_TIMEOUT_DEFAULT_MS
        """The kernel's current wait for an answer; ours once SET_TIMEOUT was sent."""
        self._seq = 0
        self.answered = 0
        self.failed = 0
        self.late = 0
        """Resolutions cut short by the kernel's deadline (answered with an error)."""

    # -- outgoing ----------------------------------------------------------------------------
    def set_timeout_message(self) -> bytes:
        """SET_TIMEOUT asking the kernel to wait ``requested_timeout_ms``."""
        self._seq += 1
        return encode_ls_set_timeout(self._seq, self.requested_timeout_ms, self.pid)

    def timeout_sent(self) -> None:
        """The kernel accepted our SET_TIMEOUT: answers may now take that long."""
        self.kernel_timeout_ms = self.requested_timeout_ms

    # -- incoming ----------------------------------------------------------------------------
    async def handle(self, datagram: bytes) -> list[bytes]:
        """The replies to one received datagram (empty when nothing is to be sent)."""
        received = trio.current_time()
        try:
            message = decode_ls_message(datagram)
        except (NetlinkLengthError, NetlinkClientError) as exc:
            log.debug("netlink message dropped", error=str(exc))
            return []
        except LsRequestError as exc:
            log.info("netlink request refused", error=str(exc), seq=exc.hdr.seq)
            return [self._error(exc.hdr)]
        except WireError as exc:
            log.debug("netlink message not understood", error=str(exc))
            return []
        if isinstance(message, LsResolveRequest):
            return [await self._answer_resolve(message, received)]
        if isinstance(message, LsIpResolveRequest):
            return [await self._answer_ip_resolve(message, received)]
        if isinstance(message, LsSetTimeout):
            # Another local-SA service set the kernel's (global) timeout: follow it.
            self.kernel_timeout_ms = clamp_timeout(message.timeout_ms)
            return []
        return []  # replies to the kernel seen on the group (ours or another service's)

    def deadline(self, received: float) -> float:
        """When an answer to a request received at ``received`` must be sent (trio clock)."""
        margin = max(MIN_MARGIN_MS, self.kernel_timeout_ms * ANSWER_MARGIN)
        return received + (self.kernel_timeout_ms - margin) / 1000

    async def _answer_resolve(self, request: LsResolveRequest, received: float) -> bytes:
        try:
            path, flags = request.to_path()
        except LsRequestError as exc:
            return self._error(exc.hdr)
        result = await self._within_deadline(self._resolve_path(path, flags), received)
        if result is None or result.status != AcmStatus.SUCCESS or not result.paths:
            return self._error(request.hdr)
        self.answered += 1
        return encode_ls_path_reply(
            request.hdr, _reply_paths(request.path_use, result.paths), self.pid
        )

    async def _answer_ip_resolve(self, request: LsIpResolveRequest, received: float) -> bytes:
        if self._resolve_ip is None:
            return self._error(request.hdr)
        result = await self._within_deadline(self._resolve_ip(request.address), received)
        if result is None or result.status != AcmStatus.SUCCESS or not result.paths:
            return self._error(request.hdr)
        gid = result.paths[0].dgid
        if not any(gid):
            return self._error(request.hdr)
        self.answered += 1
        return encode_ls_ip_resolve_reply(request.hdr, [gid], self.pid)

    async def _within_deadline(
        self, resolution: Awaitable[ResolveResult], received: float
    ) -> ResolveResult | None:
        with trio.move_on_at(self.deadline(received)):
            return await resolution
        self.late += 1
        return None

    def _error(self, hdr: NlMsgHdr) -> bytes:
        self.failed += 1
        return encode_ls_error_reply(hdr, self.pid)


def _reply_paths(path_use: int, paths: tuple[PathRecord, ...]) -> list[tuple[int, PathRecord]]:
    """The primary path with ibacm's flags (§16.4), further paths as alternates."""
    primary = reply_path_flags(path_use)
    direction = (
        IbPathFlag.OUTBOUND
        if path_use == PathUse.UNIDIRECTIONAL
        else IbPathFlag.GMP | IbPathFlag.BIDIRECTIONAL
    )
    alternate = int(IbPathFlag.ALTERNATE | direction)
    return [(primary, paths[0])] + [(alternate, path) for path in paths[1:]]


def open_ls_socket(inherited: socket.socket | None = None) -> trio.socket.SocketType:
    """The LS socket: the one systemd passed (``ListenNetlink=rdma 4``) or a new one bound
    to the LS group. Raises OSError when the kernel has no RDMA netlink (EPROTONOSUPPORT)."""
    if inherited is not None:
        inherited.setblocking(False)
        return trio.socket.from_stdlib_socket(inherited)
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, NETLINK_RDMA)
    try:
        sock.bind((os.getpid(), RDMA_NL_LS_GROUP_MASK))
    except BaseException:
        sock.close()
        raise
    return trio.socket.from_stdlib_socket(sock)


async def serve_netlink(
    sock: trio.socket.SocketType,
    service: LsService,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Announce our timeout, then answer every request until cancelled.

    On a netlink socket replies go to the kernel's address on the LS group; on any other
    socket (a connected stand-in for the kernel in tests) they are simply sent back.
    """
    try:
        await _send(sock, service.set_timeout_message())
    except OSError as exc:  # e.g. no CAP_NET_ADMIN: the kernel keeps its default timeout
        log.warning("cannot set the kernel's local SA timeout", error=str(exc))
    else:
        service.timeout_sent()
    task_status.started()
    async with trio.open_nursery() as nursery:
        while True:
            datagram = await sock.recv(RECV_SIZE)
            # Each request in its own task: a slow resolution must not delay the others.
            nursery.start_soon(_answer, sock, service, datagram)


async def _answer(sock: trio.socket.SocketType, service: LsService, datagram: bytes) -> None:
    for reply in await service.handle(datagram):
        try:
            await _send(sock, reply)
        except OSError as exc:
            log.warning("netlink reply not sent", error=str(exc))


async def _send(sock: trio.socket.SocketType, data: bytes) -> None:
    if sock.family == socket.AF_NETLINK:
        await sock.sendto(data, KERNEL_ADDRESS)
    else:
        await sock.send(data)

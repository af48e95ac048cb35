"""The ibacm client library ``ib_acme`` uses (rdma-core's libacm), over blocking sockets.

One ``AcmClient`` is one connection to one daemon: a unix socket path (a service name that
starts with ``/``) or TCP to a host name or address on the port from the port file
(client-protocol.md §1.4). Requests are built and replies decoded with ``ibacm.wire.client``;
this module only moves bytes and judges the answers.

The C library trusts its daemon; this one does not (C defect #16): every wait has a timeout,
and an answer that is missing, cut short or malformed raises ``AcmProtocolError`` with a
sentence saying what arrived, where the C tool reported success, aborted or died of SIGPIPE.
A daemon's failure status raises ``AcmStatusError`` whose text is ``strerror`` of the errno
libacm maps the status to, so ``ib_acme`` prints exactly what the C tool prints.
"""

from __future__ import annotations

import contextlib
import errno
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ibacm.config.paths import RUNDIR, TCP_PORT_FILE_NAME, UNIX_SOCKET_NAME
from ibacm.wire.client import (
    MSG_MAX,
    AcmHdr,
    AcmMessage,
    AcmOp,
    AddrType,
    ClientFramer,
    EpAddr,
    EpConfig,
    EpFlag,
    FramingError,
    decode_ep_reply,
    decode_perf_reply,
    encode_ep_request,
    encode_perf_request,
    pad_address,
    status_errno,
)
from ibacm.wire.errors import WireError
from ibacm.wire.path_record import PathRecord

DEFAULT_RUNDIR = Path(RUNDIR)
DEFAULT_TCP_PORT = 6125
DEFAULT_TIMEOUT = 30.0
"""Seconds to wait for one answer: well above the ~12 s a cold resolution can take."""
SUN_PATH_MAX = 108  # sizeof(sockaddr_un.sun_path), NUL included
EP_READ_MAX = 65535


def default_service(rundir: Path = DEFAULT_RUNDIR) -> str:
    """``ib_acme``'s default ``-S``: the daemon's unix socket in ``rundir``."""
    return str(rundir / UNIX_SOCKET_NAME)


# -- errors -------------------------------------------------------------------------------


class AcmError(Exception):
    """A library call failed. ``errno`` is the errno libacm would leave behind."""

    def __init__(self, err: int, message: str) -> None:
        super().__init__(message)
        self.errno = err
        self.message = message

    def __str__(self) -> str:
        return self.message


class AcmConnectError(AcmError):
    """The service could not be contacted. ``ret`` is what C's ``ib_acm_connect`` returns.

    A unix socket gives the positive errno; TCP gives the negative getaddrinfo code, the errno
    of a failed ``socket()``, or -1 when ``connect()`` fails (ib_acme.md §4).
    """

    def __init__(self, err: int, message: str, ret: int) -> None:
        super().__init__(err, message)
        self.ret = ret


class AcmRequestError(AcmError):
    """The request could not be built (e.g. a name longer than 63 bytes); nothing was sent."""

    def __init__(self, message: str) -> None:
        super().__init__(errno.EINVAL, message)


class AcmStatusError(AcmError):
    """The daemon answered with a failure status (client-protocol.md §3.2)."""

    def __init__(self, status: int) -> None:
        err = status_errno(status)
        super().__init__(err, os.strerror(err))
        self.status = status


class AcmProtocolError(AcmError):
    """No usable answer: the connection closed, timed out, or the bytes make no sense."""


class PortFileError(ValueError):
    """The TCP port file exists but holds no port number."""


# -- connecting ---------------------------------------------------------------------------


def read_server_port(port_file: Path) -> int:
    """The TCP port in ``port_file``, ``DEFAULT_TCP_PORT`` if the file cannot be opened.

    Like C's ``fscanf("%hu")`` the first word counts; unlike C, a word that is not a port
    number raises ``PortFileError`` instead of being read modulo 65536.
    """
    try:
        text = port_file.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return DEFAULT_TCP_PORT
    words = text.split()
    if not words or not words[0].isdigit() or not 0 < int(words[0]) <= 0xFFFF:
        raise PortFileError(f"{port_file}: {text[:40]!r} is not a TCP port number")
    return int(words[0])


def tcp_port_file(rundir: Path) -> Path:
    return rundir / TCP_PORT_FILE_NAME


def _connect_unix(path: str, timeout: float) -> socket.socket:
    if len(os.fsencode(path)) >= SUN_PATH_MAX:
        err = errno.ENAMETOOLONG
        raise AcmConnectError(err, os.strerror(err), err)
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    except OSError as exc:
        raise _connect_error(exc, positive=True) from exc
    try:
        sock.settimeout(timeout)
        sock.connect(path)
    except OSError as exc:
        sock.close()
        raise _connect_error(exc, positive=True) from exc
    return sock


def _connect_tcp(host: str, port: int, timeout: float) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, None, socket.AF_UNSPEC, 0, socket.IPPROTO_TCP)
    except socket.gaierror as exc:
        code = exc.errno if isinstance(exc.errno, int) else -1
        raise AcmConnectError(errno.EINVAL, str(exc.strerror or exc), code) from exc
    family, kind, proto, _name, address = infos[0]
    try:
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise _connect_error(exc, positive=True) from exc
    try:
        sock.settimeout(timeout)
        sock.connect((address[0], port, *address[2:]))
    except OSError as exc:
        sock.close()
        raise _connect_error(exc, positive=False) from exc
    return sock


def _connect_error(exc: OSError, *, positive: bool) -> AcmConnectError:
    timed_out = isinstance(exc, TimeoutError) or exc.errno is None
    err = errno.ETIMEDOUT if timed_out or exc.errno is None else exc.errno
    return AcmConnectError(err, os.strerror(err), err if positive else -1)


# -- replies ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResolvedPath:
    """One PATH entry of a RESOLVE reply: its ``IBV_PATH_FLAG_*`` word and the record."""

    flags: int
    path: PathRecord


@dataclass(frozen=True, slots=True)
class ResolveReply:
    """A successful RESOLVE answer: the path records and any source the daemon chose."""

    paths: tuple[ResolvedPath, ...]
    sources: tuple[str, ...]
    """Display text of each SOURCE entry (IPv4/IPv6 text or the name), in reply order."""

    @property
    def path(self) -> PathRecord:
        """The primary path (the first PATH entry)."""
        return self.paths[0].path


def source_text(entry: EpAddr) -> str:
    """How libacm prints a SOURCE entry of a reply: ``inet_ntop`` text or the name."""
    if entry.type == AddrType.IP:
        return socket.inet_ntop(socket.AF_INET, entry.info[:4])
    if entry.type == AddrType.IP6:
        return socket.inet_ntop(socket.AF_INET6, entry.info[:16])
    return entry.info.split(b"\0", 1)[0].decode("utf-8", errors="replace")


def _resolve_reply(message: AcmMessage) -> ResolveReply:
    """Judge a successful RESOLVE answer the way libacm does, but never trust it blindly.

    Non-PATH entries must be SOURCE entries of type NAME, IP or IP6 (else the reply is
    rejected, as in C); at least one PATH entry must be present (C would print stale memory).
    """
    paths: list[ResolvedPath] = []
    sources: list[str] = []
    for number, entry in enumerate(message.entries):
        if entry.type == AddrType.PATH:
            paths.append(ResolvedPath(entry.flags, entry.path()))
        elif entry.is_source and entry.type in (AddrType.NAME, AddrType.IP, AddrType.IP6):
            sources.append(source_text(entry))
        else:
            raise AcmProtocolError(
                errno.EPROTO,
                f"the service answered garbage: reply entry {number} has type 0x{entry.type:x} "
                f"and flags 0x{entry.flags:x}, neither a path nor a source address",
            )
    if not paths:
        raise AcmProtocolError(
            errno.EPROTO, "the service reported success but its answer carries no path record"
        )
    return ResolveReply(tuple(paths), tuple(sources))


def _garbage(detail: str) -> AcmProtocolError:
    return AcmProtocolError(errno.EPROTO, f"the service answered garbage: {detail}")


# -- the client ---------------------------------------------------------------------------


class AcmClient:
    """One connection to an ibacm daemon; one request at a time (see the module docstring)."""

    def __init__(self, sock: socket.socket, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self._sock = sock
        self._timeout = timeout
        self._tid = 0  # every real client sends tid 0; replies must echo it
        self._broken: AcmProtocolError | None = None

    @classmethod
    def connect(
        cls, service: str, *, port: int = DEFAULT_TCP_PORT, timeout: float = DEFAULT_TIMEOUT
    ) -> AcmClient:
        """Connect to ``service``: a unix socket path if it starts with ``/``, else TCP."""
        if service.startswith("/"):
            sock = _connect_unix(service, timeout)
        else:
            sock = _connect_tcp(service, port, timeout)
        return cls(sock, timeout=timeout)

    @property
    def broken(self) -> bool:
        """True after a protocol failure: the connection cannot carry another request."""
        return self._broken is not None

    def close(self) -> None:
        with contextlib.suppress(OSError):  # already gone: the daemon hung up first
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def __enter__(self) -> AcmClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- RESOLVE --------------------------------------------------------------------------

    def resolve(self, entries: list[EpAddr]) -> ResolveReply:
        """Send an address-form RESOLVE with ``entries`` and return the judged answer."""
        request = AcmMessage(hdr=AcmHdr(opcode=AcmOp.RESOLVE, tid=self._tid), entries=entries)
        message = self._resolve_exchange(request)
        return _resolve_reply(message)

    def resolve_ip(self, source: bytes | None, dest: bytes, flags: int = 0) -> ResolveReply:
        """Resolve packed IPv4 (4 bytes) or IPv6 (16 bytes) addresses; source optional."""
        addr_type = _ip_type(dest)
        entries = []
        if source is not None:
            if _ip_type(source) != addr_type:
                raise AcmRequestError("source and destination address families don't match")
            entries.append(EpAddr(EpFlag.SOURCE, addr_type, pad_address(addr_type, source)))
        entries.append(EpAddr(EpFlag.DEST | flags, addr_type, pad_address(addr_type, dest)))
        return self.resolve(entries)

    def resolve_name(self, source: str | None, dest: str, flags: int = 0) -> ResolveReply:
        """Resolve host names (each at most 63 bytes); source optional."""
        entries = []
        if source is not None:
            entries.append(_name_entry(source, EpFlag.SOURCE))
        entries.append(_name_entry(dest, EpFlag.DEST | flags))
        return self.resolve(entries)

    def resolve_path(self, path: PathRecord, flags: int = 0) -> PathRecord:
        """Path-form RESOLVE (``flags`` NODELAY) or SA verification (``flags`` QUERY_SA).

        Returns the record of the answer's first entry.
        """
        request = AcmMessage(
            hdr=AcmHdr(opcode=AcmOp.RESOLVE, tid=self._tid),
            entries=[EpAddr.from_path(path, flags)],
        )
        message = self._resolve_exchange(request)
        if not message.entries or message.entries[0].type != AddrType.PATH:
            raise _garbage("a successful path answer must start with a path record entry")
        return message.entries[0].path()

    def _resolve_exchange(self, request: AcmMessage) -> AcmMessage:
        reply = self._exchange(request.encode(), AcmOp.RESOLVE)
        try:
            message = AcmMessage.decode(reply)
        except WireError as exc:
            raise _garbage(str(exc)) from exc
        if message.hdr.status:
            raise AcmStatusError(message.hdr.status)
        return message

    # -- PERF_QUERY -----------------------------------------------------------------------

    def query_perf(self, index: int = 0) -> list[int]:
        """Counters of the daemon (index 0) or of endpoint ``index`` (1..255)."""
        if not 0 <= index <= 0xFF:
            raise AcmRequestError(f"endpoint index {index} is outside 0-255")
        return self._perf_exchange(encode_perf_request(index=index, tid=self._tid))

    def query_perf_ep_addr(self, entry: EpAddr) -> list[int]:
        """Counters of the endpoint owning an address (``entry`` gets the SOURCE flag)."""
        source = EpAddr(EpFlag.SOURCE, entry.type, entry.info)
        return self._perf_exchange(encode_perf_request(source=source, tid=self._tid))

    def _perf_exchange(self, request: bytes) -> list[int]:
        raw = self._exchange(request, AcmOp.PERF_QUERY)
        try:
            reply = decode_perf_reply(raw)
        except WireError as exc:
            raise _garbage(str(exc)) from exc
        if reply.hdr.status:
            raise AcmStatusError(reply.hdr.status)
        if reply.hdr.data0 != len(reply.counters):
            raise _garbage(
                f"the header announces {reply.hdr.data0} counters but {len(reply.counters)} follow"
            )
        if not reply.counters:
            raise _garbage("the performance answer carries no counters")
        return reply.counters

    # -- EP_QUERY -------------------------------------------------------------------------

    def enum_ep(self, index: int, port: int) -> EpConfig:
        """Endpoint ``index`` (1-based) among the endpoints of port ``port`` (0 = any)."""
        if not 0 <= index <= 0xFF or not 0 <= port <= 0xFF:
            raise AcmRequestError(f"endpoint {index} / port {port}: both must be 0-255")
        raw = self._exchange(encode_ep_request(index, port, tid=self._tid), AcmOp.EP_QUERY)
        try:
            hdr, config = decode_ep_reply(raw)
        except WireError as exc:
            raise _garbage(str(exc)) from exc
        if hdr.status:
            raise AcmStatusError(hdr.status)
        if config is None:
            raise _garbage("the endpoint answer reports success but carries no endpoint")
        return config

    # -- transport ------------------------------------------------------------------------

    def _exchange(self, request: bytes, op: AcmOp) -> bytes:
        """Send one request, return exactly one whole reply to it.

        After a protocol failure the stream position is lost, so every later call fails at
        once with the first failure's reason instead of reading a stale answer.
        """
        if self._broken is not None:
            raise AcmProtocolError(
                self._broken.errno, f"not retried after an earlier failure: {self._broken}"
            )
        try:
            return self._exchange_once(request, op)
        except AcmProtocolError as exc:
            self._broken = exc
            raise

    def _exchange_once(self, request: bytes, op: AcmOp) -> bytes:
        deadline = time.monotonic() + self._timeout
        try:
            self._sock.settimeout(self._timeout)
            self._sock.sendall(request)
        except TimeoutError as exc:
            raise self._timed_out() from exc
        except OSError as exc:
            raise AcmProtocolError(
                errno.ENOTCONN,
                f"the service closed the connection: {os.strerror(exc.errno or errno.EPIPE)}",
            ) from exc
        reply = self._receive_frame(deadline)
        self._check_reply_header(reply, op)
        return reply

    def _receive_frame(self, deadline: float) -> bytes:
        framer = ClientFramer(replies=True)
        received = 0
        while True:
            try:
                frame = framer.next_frame()
            except FramingError as exc:
                raise _garbage(exc.reason) from exc
            if frame is not None:
                break
            chunk = self._receive_some(deadline)
            if not chunk:
                raise self._closed(received)
            received += len(chunk)
            try:
                framer.feed(chunk)
            except FramingError as exc:
                raise _garbage(exc.reason) from exc
        if framer.buffered:
            raise _garbage(
                f"{framer.buffered} unexpected bytes follow the {len(frame)}-byte answer"
            )
        return frame

    def _receive_some(self, deadline: float) -> bytes:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self._timed_out()
        try:
            self._sock.settimeout(remaining)
            return self._sock.recv(max(MSG_MAX, EP_READ_MAX))
        except TimeoutError as exc:
            raise self._timed_out() from exc
        except OSError as exc:
            raise AcmProtocolError(
                errno.ENOTCONN,
                f"the connection to the service failed: {os.strerror(exc.errno or errno.EIO)}",
            ) from exc

    def _check_reply_header(self, reply: bytes, op: AcmOp) -> None:
        hdr = AcmHdr.decode(reply)
        if hdr.op != op:
            raise _garbage(f"opcode 0x{hdr.opcode:02x} answers a {op.name} request")
        if hdr.tid != self._tid:
            raise _garbage(f"the answer carries tid {hdr.tid:#x}, the request {self._tid:#x}")

    def _timed_out(self) -> AcmProtocolError:
        return AcmProtocolError(
            errno.ETIMEDOUT, f"no answer from the service within {self._timeout:g} s"
        )

    @staticmethod
    def _closed(received: int) -> AcmProtocolError:
        if received == 0:
            detail = "the service closed the connection without answering"
        else:
            detail = f"the service closed the connection after {received} bytes of its answer"
        return AcmProtocolError(errno.ENOTCONN, detail)


def _ip_type(raw: bytes) -> AddrType:
    if len(raw) == 4:
        return AddrType.IP
    if len(raw) == 16:
        return AddrType.IP6
    raise AcmRequestError(f"an IP address is 4 or 16 bytes, got {len(raw)}")


def _name_entry(name: str, flags: int) -> EpAddr:
    try:
        return EpAddr.from_name(name, flags)
    except WireError as exc:
        raise AcmRequestError(str(exc)) from exc

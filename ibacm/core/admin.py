"""The admin socket: operators and the dashboard watch and steer the daemon over it.

A unix stream socket of its own (not the client socket), mode 0600 from the moment it
exists, speaking the line-delimited JSON protocol of ``ibacm.wire.admin`` (documented in
``docs/admin-protocol.md``). Each connection is a session with its own nursery: a reader that
answers requests in order and, after ``subscribe``, a forwarder that streams bus events. A
bad line gets an error reply; a stuck or hostile client only ever hurts its own session.

The daemon core supplies a ``DaemonControl`` (what the commands act on) and the ``EventBus``.
"""

from __future__ import annotations

import contextlib
import os
import socket as stdlib_socket
import stat
import struct
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from ibacm import __version__
from ibacm.config.errors import ConfigError, invalid_settings
from ibacm.core.events import Event, EventBus, Subscription
from ibacm.log import get_logger
from ibacm.wire import admin as wire

log = get_logger("ibacm.admin")

SOCKET_MODE = 0o600
MAX_CLIENTS = 64
SEND_TIMEOUT = 30.0
"""Seconds a client may leave a reply or event unread before its session is closed."""
STATS_INTERVAL = 1.0
"""Seconds between ``stats`` events (counters) while someone subscribes to them."""
RECEIVE_SIZE = 65536
_UNIX_PATH_MAX = 107


class DaemonControl(Protocol):
    """What the admin commands act on; implemented by the daemon core."""

    def snapshot(self) -> dict[str, Any]:
        """The daemon's state as JSON-able data (schema: ``docs/admin-protocol.md``)."""
        ...

    async def flush(self, endpoint: str | None, dest: str | None) -> int:
        """Drop cache entries: all, those of one endpoint id, and/or the one for ``dest``.

        Returns how many were dropped; raises ``LookupError``/``ValueError`` for an unknown
        endpoint or a destination that does not parse (the message reaches the client).
        """
        ...

    async def reload(self) -> list[str]:
        """Re-read the configuration files (options, addresses) as on SIGHUP; the names of
        the changed options that need a restart."""
        ...

    def set_log_level(self, level: int) -> None:
        """Set ``log_level`` (0..2) for the running daemon."""
        ...

    async def capture(self, action: str, path: str | None) -> dict[str, Any]:
        """Start (to the absolute ``path``), stop or report the MAD capture; returns its status."""
        ...


class AdminSocketError(Exception):
    """The admin socket cannot be created at the configured path."""


# -- the listening socket ----------------------------------------------------------------------


def _check_path(path: str) -> None:
    if not path:
        raise AdminSocketError("admin socket path is empty")
    if len(os.fsencode(path)) > _UNIX_PATH_MAX:
        raise AdminSocketError(
            f"admin socket path {path!r} is longer than {_UNIX_PATH_MAX} bytes (unix socket limit)"
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise AdminSocketError(f"directory {parent!r} of admin socket {path!r} does not exist")


async def _remove_stale(path: str) -> None:
    """Unlink a leftover socket file; refuse to replace a live server or a non-socket."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise AdminSocketError(f"{path!r} exists and is not a socket; not replacing it")
    probe = trio.socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    with probe:
        try:
            with trio.fail_after(1.0):
                await probe.connect(path)
        except (OSError, trio.TooSlowError):
            pass
        else:
            raise AdminSocketError(f"another process is serving admin socket {path!r}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


async def open_admin_listener(path: str) -> tuple[trio.SocketListener, os.stat_result]:
    """Bind ``path`` with mode 0600 and no window in which others could connect.

    The socket is bound inside a fresh 0700 directory next to ``path``, chmod-ed, then
    renamed into place, so it is never reachable with wider permissions.
    """
    _check_path(path)
    await _remove_stale(path)
    parent = os.path.dirname(os.path.abspath(path))
    private = tempfile.mkdtemp(prefix=".a", dir=parent)
    staging = os.path.join(private, "s")
    sock = trio.socket.socket(stdlib_socket.AF_UNIX, stdlib_socket.SOCK_STREAM)
    try:
        if len(os.fsencode(staging)) > _UNIX_PATH_MAX:
            raise AdminSocketError(f"directory of admin socket {path!r} is too deep to bind in")
        await sock.bind(staging)
        os.chmod(staging, SOCKET_MODE)
        os.rename(staging, path)
        sock.listen(16)
        info = os.lstat(path)
    except OSError as exc:
        sock.close()
        raise AdminSocketError(f"cannot create admin socket {path!r}: {exc.strerror}") from exc
    except BaseException:
        sock.close()
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(staging)
        with contextlib.suppress(OSError):
            os.rmdir(private)
    return trio.SocketListener(sock), info


def _unlink_if_ours(path: str, info: os.stat_result) -> None:
    """Remove the socket file unless a newer daemon already replaced it."""
    try:
        now = os.lstat(path)
    except OSError:
        return
    if (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino):
        with contextlib.suppress(OSError):
            os.unlink(path)


def _peer_uid(stream: trio.SocketStream) -> int | None:
    """The connecting process's uid (SO_PEERCRED), or None if the kernel does not say."""
    size = struct.calcsize("3i")
    try:
        raw = stream.socket.getsockopt(stdlib_socket.SOL_SOCKET, stdlib_socket.SO_PEERCRED, size)
    except (OSError, AttributeError):
        return None
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


# -- sessions ----------------------------------------------------------------------------------


class _SessionClosed(Exception):
    """The client went away or stopped reading; end its session quietly."""


@dataclass(eq=False)
class _Server:
    control: DaemonControl
    bus: EventBus
    send_timeout: float
    max_clients: int
    clients: int = 0
    next_session: int = 0

    def command_names(self) -> list[str]:
        return [command.value for command in wire.Command]


@dataclass(eq=False)
class _Session:
    server: _Server
    stream: trio.SocketStream
    number: int
    nursery: trio.Nursery
    lines: wire.LineBuffer = field(default_factory=lambda: wire.LineBuffer(wire.MAX_REQUEST_LINE))
    send_lock: trio.Lock = field(default_factory=trio.Lock)
    subscription: Subscription | None = None
    forwarder: trio.CancelScope | None = None

    async def send(self, line: bytes) -> None:
        async with self.send_lock:
            with trio.move_on_after(self.server.send_timeout) as scope:
                try:
                    await self.stream.send_all(line)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise _SessionClosed("client went away") from exc
            if scope.cancelled_caught:
                raise _SessionClosed(f"client did not read for {self.server.send_timeout} s")

    async def reply(self, reply: wire.Reply) -> None:
        await self.send(wire.encode_reply(reply))

    async def run(self) -> None:
        try:
            while True:
                try:
                    data = await self.stream.receive_some(RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    return
                if not data:
                    return
                for item in self.lines.feed(data):
                    await self.handle_line(item)
        finally:
            self.unsubscribe()

    async def handle_line(self, item: bytes | wire.LineTooLong) -> None:
        if isinstance(item, wire.LineTooLong):
            await self.reply(
                wire.error_reply(
                    None,
                    f"request line of {item.length} bytes exceeds the "
                    f"{wire.MAX_REQUEST_LINE}-byte limit",
                    wire.ErrorCode.LINE_TOO_LONG,
                )
            )
            return
        if not item.strip():
            return  # blank lines are allowed as keep-alives
        try:
            request = wire.parse_request(item)
        except wire.AdminProtocolError as exc:
            await self.reply(wire.error_reply(exc.request_id, exc.message, exc.code))
            return
        await self.reply(await self.execute(request))

    async def execute(self, request: wire.Request) -> wire.Reply:
        log.debug("admin request", session=self.number, cmd=request.cmd.value)
        try:
            return await self._dispatch(request)
        except (LookupError, ValueError) as exc:
            return wire.error_reply(
                request.id, f"{request.cmd.value}: {_describe(exc)}", wire.ErrorCode.BAD_ARGUMENT
            )
        except Exception as exc:  # the control failed; this client hears why, others go on
            log.warning("admin command failed", cmd=request.cmd.value, error=_describe(exc))
            return wire.error_reply(
                request.id, f"{request.cmd.value} failed: {_describe(exc)}", wire.ErrorCode.FAILED
            )

    async def _dispatch(self, request: wire.Request) -> wire.Reply:
        control, args = self.server.control, request.args
        match request.cmd:
            case wire.Command.HELLO:
                return self.hello(request)
            case wire.Command.SNAPSHOT:
                return wire.ok_reply(request.id, control.snapshot())
            case wire.Command.SUBSCRIBE:
                return self.subscribe(request)
            case wire.Command.UNSUBSCRIBE:
                was = self.unsubscribe()
                return wire.ok_reply(request.id, {"subscribed": False, "was_subscribed": was})
            case wire.Command.FLUSH:
                flushed = await control.flush(args["endpoint"], args["dest"])
                log.info("cache flushed", endpoint=args["endpoint"], dest=args["dest"], n=flushed)
                return wire.ok_reply(request.id, {"flushed": flushed})
            case wire.Command.RELOAD:
                try:
                    restart = await control.reload()
                except ConfigError as exc:
                    problems = [str(issue) for issue in exc.issues]
                    summary = (
                        f"reload refused ({invalid_settings(exc.issues)}); configuration unchanged"
                    )
                    return wire.error_reply(
                        request.id,
                        f"{summary}: {'; '.join(problems)}",
                        wire.ErrorCode.INVALID_CONFIG,
                        {"summary": summary, "problems": problems},
                    )
                log.info("configuration reloaded on admin request")
                return wire.ok_reply(request.id, {"reloaded": True, "restart_needed": restart})
            case wire.Command.SET_LOG_LEVEL:
                control.set_log_level(args["level"])
                log.info("log level set", level=args["level"])
                return wire.ok_reply(request.id, {"level": args["level"]})
            case wire.Command.CAPTURE:
                status = await control.capture(args["action"], args["path"])
                log.info("MAD capture", action=args["action"], path=args["path"])
                return wire.ok_reply(request.id, status)
        raise AssertionError(f"unhandled command {request.cmd}")  # pragma: no cover

    def hello(self, request: wire.Request) -> wire.Reply:
        offered: list[int] = request.args["versions"]
        version = wire.negotiate(offered)
        if version is None:
            return wire.error_reply(
                request.id,
                f"no common protocol version: client offers {offered}, "
                f"server speaks {list(wire.SUPPORTED_VERSIONS)}",
                wire.ErrorCode.UNSUPPORTED_VERSION,
                {"versions": list(wire.SUPPORTED_VERSIONS)},
            )
        return wire.ok_reply(
            request.id,
            {
                "version": version,
                "versions": list(wire.SUPPORTED_VERSIONS),
                "server": "ibacm",
                "server_version": __version__,
                "pid": os.getpid(),
                "commands": self.server.command_names(),
                "events": [kind.value for kind in wire.EventKind],
                "max_line": wire.MAX_REQUEST_LINE,
            },
        )

    def subscribe(self, request: wire.Request) -> wire.Reply:
        # A second subscribe replaces the first (e.g. to change the kinds).
        self.unsubscribe()
        kinds: list[str] | None = request.args["kinds"]
        max_queue: int = request.args["max_queue"] or 1000
        replay: int = request.args["replay"]
        subscription = self.server.bus.subscribe(max_queue, kinds=kinds, replay=replay)
        scope = trio.CancelScope()
        self.subscription, self.forwarder = subscription, scope
        # The reply is sent before the forwarder's first event: the forwarder only starts
        # running after this request's reply, because the reader awaits the send first.
        self.nursery.start_soon(self.forward, subscription, scope)
        return wire.ok_reply(
            request.id,
            {
                "subscribed": True,
                "kinds": kinds,
                "max_queue": max_queue,
                "replayed": len(subscription.queue),
            },
        )

    def unsubscribe(self) -> bool:
        subscription, scope = self.subscription, self.forwarder
        self.subscription = self.forwarder = None
        if scope is not None:
            scope.cancel()
        if subscription is None:
            return False
        subscription.close()
        return True

    async def forward(self, subscription: Subscription, scope: trio.CancelScope) -> None:
        with scope:
            async for event in subscription:
                await self.send(_event_line(event))


def _event_line(event: Event) -> bytes:
    return wire.encode_event(wire.EventMessage(event.kind, event.data, event.ts))


def _describe(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    return str(exc) or type(exc).__name__


async def _refuse_busy(stream: trio.SocketStream, limit: int) -> None:
    """Say "busy", then let the client finish writing before closing, so the close does not
    reset the connection (and discard the answer) while its first request is in flight."""
    busy = wire.error_reply(None, f"too many admin clients (limit {limit})", wire.ErrorCode.BUSY)
    with (
        contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError),
        trio.move_on_after(1.0),
    ):
        await stream.send_all(wire.encode_reply(busy))
        await stream.send_eof()
        while await stream.receive_some(RECEIVE_SIZE):
            pass


async def _serve_client(server: _Server, stream: trio.SocketStream) -> None:
    """One connection, start to end; nothing it does can escape into the server."""
    async with stream:
        uid = _peer_uid(stream)
        if uid is not None and uid not in (0, os.getuid()):
            log.warning("admin connection refused", uid=uid)
            return
        server.next_session += 1
        number = server.next_session
        if server.clients >= server.max_clients:
            await _refuse_busy(stream, server.max_clients)
            return
        server.clients += 1
        try:
            async with trio.open_nursery() as nursery:
                session = _Session(server, stream, number, nursery)
                try:
                    await session.run()
                finally:
                    nursery.cancel_scope.cancel()
        except* _SessionClosed as group:
            log.debug("admin session closed", session=number, reason=str(group.exceptions[0]))
        except* Exception as group:  # a bug in a session must not take the daemon down
            log.error("admin session crashed", session=number, error=repr(group.exceptions[0]))
        finally:
            server.clients -= 1


# -- counters ticker ---------------------------------------------------------------------------


def stats_from_snapshot(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The ``stats`` event body: global and per-endpoint counters out of a snapshot."""
    endpoints: dict[str, Any] = {}
    for endpoint in snapshot.get("endpoints", ()):
        if isinstance(endpoint, Mapping) and "id" in endpoint:
            endpoints[str(endpoint["id"])] = list(endpoint.get("counters", ()))
    return {"counters": list(snapshot.get("counters", ())), "endpoints": endpoints}


async def _stats_ticker(control: DaemonControl, bus: EventBus, interval: float) -> None:
    """Publish counters every ``interval`` while someone listens, so rates can be plotted."""
    while True:
        await trio.sleep(interval)
        if not bus.has_subscribers(wire.EventKind.STATS.value):
            continue
        try:
            snapshot = control.snapshot()
        except Exception as exc:  # keep ticking; the next snapshot may work
            log.warning("snapshot for stats failed", error=_describe(exc))
            continue
        bus.publish(wire.EventKind.STATS.value, stats_from_snapshot(snapshot))


# -- entry point -------------------------------------------------------------------------------


async def serve_admin(
    path: str,
    control: DaemonControl,
    bus: EventBus,
    *,
    max_clients: int = MAX_CLIENTS,
    send_timeout: float = SEND_TIMEOUT,
    stats_interval: float = STATS_INTERVAL,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the admin socket at ``path`` until cancelled; ``task_status`` gets the path.

    Raises AdminSocketError (before ``started``) when the socket cannot be created.
    """
    listener, info = await open_admin_listener(path)
    server = _Server(control, bus, send_timeout, max_clients)

    async def handler(stream: trio.SocketStream) -> None:
        await _serve_client(server, stream)

    try:
        async with listener, trio.open_nursery() as nursery:
            nursery.start_soon(_stats_ticker, control, bus, stats_interval)
            await nursery.start(trio.serve_listeners, handler, [listener])
            log.info("admin socket listening", path=path)
            task_status.started(path)
    finally:
        _unlink_if_ours(path, info)


__all__ = [
    "MAX_CLIENTS",
    "SOCKET_MODE",
    "AdminSocketError",
    "DaemonControl",
    "open_admin_listener",
    "serve_admin",
    "stats_from_snapshot",
]

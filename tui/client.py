"""The dashboard's side of the admin socket: an asyncio client on the shared codec.

Textual runs on asyncio, so this client uses asyncio unix streams; framing and messages come
from ``ibacm.wire.admin``, the same codec the daemon uses. One reader task owns the stream's
receiving side: it matches replies to waiting calls by id and hands events to a callback.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from typing import Any

from ibacm.wire import admin as wire

CONNECT_TIMEOUT = 5.0
CALL_TIMEOUT = 30.0
READ_SIZE = 256 * 1024

EventCallback = Callable[[wire.EventMessage], None]


class AdminConnectionError(Exception):
    """The admin socket cannot be reached, or the connection broke."""


class AdminCommandError(Exception):
    """The daemon answered a command with an error reply."""

    def __init__(self, cmd: str, message: str, code: str | None) -> None:
        super().__init__(f"{cmd}: {message}" if not message.startswith(cmd) else message)
        self.cmd = cmd
        self.message = message
        self.code = code


class AdminClient:
    """One connection to a daemon's admin socket."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        on_event: EventCallback | None = None,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._on_event = on_event
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[wire.Reply]] = {}
        self._lines = wire.LineBuffer(wire.MAX_SERVER_LINE)
        self._closed = asyncio.Event()
        self.close_reason = ""
        self._server_error = ""
        self.server: dict[str, Any] = {}
        self._task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def connect(
        cls, path: str, on_event: EventCallback | None = None, *, timeout: float = CONNECT_TIMEOUT
    ) -> AdminClient:
        """Connect and say hello (version negotiation); raises AdminConnectionError."""
        try:
            async with asyncio.timeout(timeout):
                reader, writer = await asyncio.open_unix_connection(path)
        except FileNotFoundError:
            raise AdminConnectionError(f"no admin socket at {path}") from None
        except PermissionError:
            raise AdminConnectionError(
                f"permission denied on {path} (the admin socket is owner-only)"
            ) from None
        except (OSError, TimeoutError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "timed out"
            raise AdminConnectionError(f"cannot connect to {path}: {reason}") from None
        client = cls(reader, writer, on_event)
        try:
            client.server = await client.call(
                "hello", versions=list(wire.SUPPORTED_VERSIONS), client="ibacm-tui"
            )
        except AdminCommandError as exc:
            await client.aclose()
            raise AdminConnectionError(f"daemon refused the connection: {exc.message}") from None
        except BaseException:
            await client.aclose()
            raise
        return client

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    async def wait_closed(self) -> str:
        """Wait until the connection ends; returns why."""
        await self._closed.wait()
        return self.close_reason

    async def call(self, cmd: str, *, timeout: float = CALL_TIMEOUT, **args: Any) -> Any:
        """Send a request and return its ``result``; raises AdminCommandError/ConnectionError."""
        if self.closed:
            raise AdminConnectionError(f"connection closed: {self.close_reason}")
        request_id = next(self._ids)
        line = wire.encode_request(wire.Request(wire.Command(cmd), request_id, args))
        future: asyncio.Future[wire.Reply] = asyncio.get_running_loop().create_future()
        self._waiting[request_id] = future
        try:
            try:
                self._writer.write(line)
                await self._writer.drain()
            except (ConnectionError, OSError) as exc:
                # The server may have said why before hanging up (e.g. "busy"): let the
                # reader take in what arrived, then report that.
                await asyncio.wait({self._task}, timeout=1.0)
                self._finish(f"connection lost: {exc}")
                raise AdminConnectionError(self.close_reason) from None
            try:
                async with asyncio.timeout(timeout):
                    reply = await future
            except TimeoutError:
                raise AdminConnectionError(f"{cmd}: no reply within {timeout} s") from None
        finally:
            self._waiting.pop(request_id, None)
            if not future.done():
                future.cancel()
        if not reply.ok:
            raise AdminCommandError(cmd, reply.error or "error", str(reply.code or ""))
        return reply.result

    async def _read_loop(self) -> None:
        reason = "the daemon closed the connection"
        try:
            while True:
                data = await self._reader.read(READ_SIZE)
                if not data:
                    break
                for item in self._lines.feed(data):
                    self._handle_line(item)
        except (ConnectionError, OSError) as exc:
            reason = f"connection lost: {exc}"
        except wire.AdminProtocolError as exc:
            reason = f"the daemon sent a bad message: {exc.message}"
        except Exception as exc:  # e.g. the event callback failed: end cleanly, say why
            reason = f"dashboard error while reading: {exc!r}"
        finally:
            self._finish(reason)

    def _handle_line(self, item: bytes | wire.LineTooLong) -> None:
        if isinstance(item, wire.LineTooLong):
            raise wire.AdminProtocolError(
                f"line of {item.length} bytes is over the client limit", wire.ErrorCode.BAD_REQUEST
            )
        message = wire.parse_server_message(item)
        if isinstance(message, wire.EventMessage):
            if self._on_event is not None:
                self._on_event(message)
            return
        if message.id is None and not message.ok:
            # An error nobody asked for (e.g. "busy"): the likely reason of what follows.
            self._server_error = message.error or ""
        future = self._waiting.get(message.id) if isinstance(message.id, int) else None
        if future is not None and not future.done():
            future.set_result(message)

    def _finish(self, reason: str) -> None:
        if self._closed.is_set():
            return
        if self._server_error:
            reason = f"{reason} ({self._server_error})"
        self.close_reason = reason
        self._closed.set()
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(AdminConnectionError(reason))
                # Mark it retrieved: a caller that already gave up must not cause a warning.
                future.exception()
        self._writer.close()

    async def aclose(self) -> None:
        self._finish("closed by the dashboard")
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, ConnectionError, OSError):
            await self._task
        with contextlib.suppress(ConnectionError, OSError):
            await self._writer.wait_closed()

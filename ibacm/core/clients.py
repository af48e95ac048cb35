"""Client connections: accept, frame, dispatch, answer in order, never block anyone else.

Fixes the C server's limits (defects 1-3): requests are framed from the byte stream (one
recv() per message is not needed, pipelined requests work), there is no client limit
(select()/FD_SETSIZE is gone), and every connection sends its own replies from its own task.

One ``Poller`` task reads all client sockets (epoll); each connection frames its bytes and
answers what is at hand (a cache hit) on the spot, in one write; a request that has to wait
gets a task in the connection's nursery. A writer task per connection sends queued replies
in REQUEST order, each with one ``send_all`` of the whole reply (ib_acme
reads a reply with a single recv()). A client may pipeline as many requests as it likes: with
``max_pending`` replies owed, its connection stops reading (the kernel then holds its further
requests back) until the writer has caught up. Only a client that stops reading is dropped,
with a log line: when one reply cannot be written for ``stall_timeout`` seconds, or its
unwritten replies pass ``MAX_UNSENT_BYTES``; everybody else is served as usual. A malformed
stream is closed exactly where the C server closes (client-protocol.md §8) after the replies to
its earlier requests were sent.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import math
import os
import select
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import trio

from ibacm.core.dispatch import Dispatcher
from ibacm.log import get_logger
from ibacm.wire.client import HDR_LEN, MSG_MAX, ClientFramer, FramingError, FramingFault
from ibacm.wire.errors import WireError

log = get_logger("ibacm.clients")

MAX_PENDING_REPLIES = 256
"""Replies one connection may owe before it stops reading that client's requests for a while."""
STALL_TIMEOUT = 10.0
"""Seconds one reply may wait for the client's socket to drain before the client is dropped."""
MAX_UNSENT_BYTES = 4 << 20
"""Bytes of ready but unwritten replies one connection may hold before it is dropped."""
RECEIVE_SIZE = 4 * MSG_MAX
_ACCEPT_RETRY = 0.1
_TRANSIENT_ACCEPT_ERRORS = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


@dataclass(eq=False)
class _Reply:
    """A request's place in the connection's reply order."""

    done: trio.Event = field(default_factory=trio.Event)
    data: bytes | None = None
    """The reply; None means "close the connection here" (protocol error, handler crash)."""

    def set(self, data: bytes | None) -> None:
        self.data = data
        self.done.set()


class _Overrun(Exception):
    """The client does not read its replies (too many unwritten bytes)."""


def peer_name(stream: trio.SocketStream, number: int) -> str:
    sock = stream.socket
    if sock.family == socket.AF_UNIX:
        return f"unix:{number}"
    try:
        host, port = sock.getpeername()[:2]
    except OSError:
        return f"tcp:{number}"
    return f"tcp:{host}:{port}"


class Connection:
    """One client, from accept to close.

    Its task owns the connection's nursery (the writer, and one task per request that has to
    wait); its bytes are read by the server's ``Poller``, which calls ``on_readable``.
    """

    def __init__(
        self,
        stream: trio.SocketStream,
        dispatcher: Dispatcher,
        name: str,
        *,
        max_pending: int = MAX_PENDING_REPLIES,
        stall_timeout: float = STALL_TIMEOUT,
    ) -> None:
        self.stream = stream
        self.dispatcher = dispatcher
        self.name = name
        self.requests = 0
        self._fd = stream.socket.fileno()
        self._framer = ClientFramer()
        self._max_pending = max_pending
        self._stall_timeout = stall_timeout
        # Unbounded: the bound is reading (``_paused``), not a full queue.
        self._send, self._receive = trio.open_memory_channel[_Reply](math.inf)
        self._paused = False
        """Reading stopped for now: ``max_pending`` replies are owed (flow control)."""
        self._unsent = 0
        """Bytes of ready replies not yet written."""
        self._nursery: trio.Nursery | None = None
        self._poller: Poller | None = None
        self._reading = True
        """False once reading stopped; ``_reading_done`` wakes ``run``. A plain flag because
        every request checks it (``Event.is_set`` measurably slows the cached RESOLVE)."""
        self._reading_done = trio.Event()
        self._outbox: list[bytes] = []
        """Replies answered at once in the poller's current round, written at its end
        (``flush``): one write per connection per round, and the client is woken once."""
        self._owed = 0
        """Replies queued for the writer and not yet written: 0 means a reply that is ready
        may be written at once without overtaking another (the cache-hit fast path)."""

    def stop_reading(self) -> None:
        """Shutdown: take no more requests; the replies already owed are still sent."""
        if self._poller is not None:
            self._poller.forget(self._fd, self)
        self._reading = False
        self._reading_done.set()

    def abort(self) -> None:
        self.stop_reading()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    async def run(self, poller: Poller) -> None:
        async with self.stream, trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._writer)
            try:
                if self._reading:
                    self._poller = poller
                    try:
                        poller.watch(self._fd, self)
                    except OSError as exc:  # e.g. fs.epoll.max_user_watches reached
                        log.error(
                            "cannot watch the client; closing", client=self.name, error=str(exc)
                        )
                        self.abort()
                        return
                    await self._reading_done.wait()
            finally:
                poller.forget(self._fd, self)
                # The writer sends what is owed, then ends (closing the connection).
                self._send.close()

    def on_readable(self) -> None:
        """The socket has bytes (or EOF): read once, answer every whole request in them.

        One read per call, so a client that never pauses gets its turn like everybody else.
        """
        if not self._reading:
            return
        try:
            data = os.read(self._fd, RECEIVE_SIZE)
        except BlockingIOError:
            return
        except OSError:
            self.abort()
            return
        if not data:
            self.stop_reading()
            return
        self._take_guarded(data)

    def _take_guarded(self, data: bytes) -> None:
        try:
            self._take(data)
        except _Overrun:
            self._drop("its unwritten replies pass the byte bound")

    def _drop(self, why: str) -> None:
        log.warning(
            "client dropped: it does not read its replies",
            client=self.name,
            why=why,
            owed=self._owed,
            unsent_bytes=self._unsent,
        )
        self.abort()

    def _take(self, data: bytes) -> None:
        framer = self._framer
        try:
            framer.feed(data)
            while not self._paused and (frame := framer.next_frame()) is not None:
                if not self._submit(frame):
                    self.stop_reading()
                    return
        except FramingError as exc:
            # The framer still holds the offending message: its header answers §8's case.
            self._protocol_error(exc, framer.head(HDR_LEN))
            self.stop_reading()

    def _protocol_error(self, exc: FramingError, head: bytes) -> None:
        log.warning("client request rejected; closing", client=self.name, reason=exc.reason)
        if exc.fault is FramingFault.BAD_LENGTH:
            reply = self.dispatcher.undersized_resolve(head)
            if reply is not None:
                self._queue(_done(reply))
        self._queue(_done(None))

    def _queue(self, reply: _Reply) -> bool:
        """Give ``reply`` its place in the order; False once the connection is closing."""
        # Replies answered earlier in this round go first.
        if self._outbox and not self._queue(_done(self._take_outbox())):
            return False
        try:
            self._send.send_nowait(reply)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        self._owed += 1
        if reply.data is not None:
            self._count_unsent(len(reply.data))
        if self._owed >= self._max_pending and not self._paused and self._poller is not None:
            # Flow control: read no further until the writer caught up (see _wrote).
            self._paused = True
            self._poller.forget(self._fd, self)
        return True

    def _count_unsent(self, size: int) -> None:
        self._unsent += size
        if self._unsent > MAX_UNSENT_BYTES:
            raise _Overrun

    def _wrote(self, size: int) -> None:
        """One owed reply is written: resume reading once half of what is owed went out."""
        self._owed -= 1
        self._unsent -= size
        if not self._paused or self._owed > self._max_pending // 2 or not self._reading:
            return
        self._paused = False
        self._take_guarded(b"")  # requests already read and framed come first
        if self._reading and not self._paused and self._poller is not None:
            self.flush()
            self._poller.watch(self._fd, self)

    def _submit(self, frame: bytes) -> bool:
        """Answer or queue the request's reply; False when the connection must read no
        further."""
        self.requests += 1
        try:
            data = self.dispatcher.answer_now(frame)
            if data is None:
                data = self.dispatcher.resolve_now(frame)
        except WireError as exc:
            # Framed but not decodable (e.g. opcode 0x81 on a request): close, as for any
            # malformed request (client-protocol §8); nobody else notices.
            log.info("malformed request; closing the connection", client=self.name, reason=str(exc))
            self._queue(_done(None))
            return False
        except Exception:
            # C closes a connection whose handler fails; nobody else notices.
            log.exception("request failed; closing the connection", client=self.name)
            self._queue(_done(None))
            return False
        if data is not None:
            if self._owed:
                return self._queue(_done(data))
            if not self._outbox:
                assert self._poller is not None  # requests are read only by the poller
                self._poller.flush_later(self)
            self._outbox.append(data)
            return True
        reply = _Reply()
        if not self._queue(reply):
            return False
        assert self._nursery is not None  # requests are read only while run() is inside it
        self._nursery.start_soon(self._resolve, frame, reply)
        return True

    def _take_outbox(self) -> bytes:
        data = b"".join(self._outbox)
        self._outbox.clear()
        return data

    def flush(self) -> None:
        """Write the replies answered in this round, in one write (ib_acme reads a reply with
        one recv). Nothing is owed before them; what does not fit goes to the writer."""
        if not self._outbox:
            return
        data = self._take_outbox()
        try:
            written = os.write(self._fd, data)
        except BlockingIOError:
            written = 0
        except OSError:
            log.debug("client went away before its reply", client=self.name)
            self.abort()
            return
        if written < len(data):
            self._queue(_done(data[written:]))

    async def _resolve(self, frame: bytes, reply: _Reply) -> None:
        try:
            data: bytes | None = await self.dispatcher.resolve(frame, self.name)
        except WireError as exc:
            log.info("malformed request; closing the connection", client=self.name, reason=str(exc))
            data = None
        except Exception:
            log.exception("request failed; closing the connection", client=self.name)
            data = None
        reply.set(data)
        if data is not None:
            try:
                self._count_unsent(len(data))
            except _Overrun:
                self._drop("its unwritten replies pass the byte bound")

    async def _writer(self) -> None:
        async with self._receive:
            async for reply in self._receive:
                await reply.done.wait()
                if reply.data is None:
                    self.abort()
                    return
                with trio.move_on_after(self._stall_timeout) as stalled:
                    try:
                        await self.stream.send_all(reply.data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        log.debug("client went away before its reply", client=self.name)
                        self.abort()
                        return
                if stalled.cancelled_caught:
                    self._drop(f"its socket did not drain for {self._stall_timeout:g} s")
                    return
                self._wrote(len(reply.data))


def _done(data: bytes | None) -> _Reply:
    reply = _Reply()
    reply.set(data)
    return reply


class Poller:
    """Reads every client socket from one task.

    A task per connection costs a trip through trio's scheduler for every request; here one
    task waits on an epoll set of all client sockets (the epoll descriptor is itself waited
    on through trio) and, each time, lets every readable connection read once and answer what
    it can at once. Requests that must wait still get their own task in their connection's
    nursery. The epoll set is level-triggered: bytes left unread are reported again.
    """

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._watched: dict[int, Connection] = {}
        self._unflushed: list[Connection] = []

    def watch(self, fd: int, connection: Connection) -> None:
        self._epoll.register(fd, select.EPOLLIN)
        self._watched[fd] = connection

    def flush_later(self, connection: Connection) -> None:
        """``connection`` has replies to write at the end of this round."""
        self._unflushed.append(connection)

    def forget(self, fd: int, connection: Connection) -> None:
        # Only this connection's registration: a descriptor number is reused once closed.
        if self._watched.get(fd) is connection:
            del self._watched[fd]
            with contextlib.suppress(OSError):  # already closed: epoll dropped it itself
                self._epoll.unregister(fd)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self._epoll:
            task_status.started()
            while True:
                await trio.lowlevel.wait_readable(self._epoll.fileno())
                for fd, _ in self._epoll.poll(0):
                    connection = self._watched.get(fd)
                    if connection is not None:
                        self._guarded(connection, connection.on_readable)
                # Replies go out together after the round: a client process that waits for
                # several of them is woken once, not once per reply.
                unflushed = self._unflushed
                self._unflushed = []
                for connection in unflushed:
                    self._guarded(connection, connection.flush)

    @staticmethod
    def _guarded(connection: Connection, step: Callable[[], None]) -> None:
        try:
            step()
        except Exception:
            # A bug costs this one client its connection; everybody else goes on.
            log.exception("client handling failed; closing", client=connection.name)
            connection.abort()


class ClientServer:
    """Accepts clients on the listeners and serves each in its own connection."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        *,
        max_pending: int = MAX_PENDING_REPLIES,
        stall_timeout: float = STALL_TIMEOUT,
    ) -> None:
        self.dispatcher = dispatcher
        self.max_pending = max_pending
        self.stall_timeout = stall_timeout
        self.connections: set[Connection] = set()
        self.accepted = 0
        self._accept_scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._listeners: list[trio.SocketListener] = []
        self._idle = trio.Event()
        self._numbers = itertools.count(1)
        self._poller = Poller()

    @property
    def active(self) -> int:
        return len(self.connections)

    async def serve(
        self,
        listeners: Sequence[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept until ``drain``; returns when the last connection is gone."""
        self._listeners = list(listeners)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._poller.run)
            nursery.start_soon(self._accept_all)
            task_status.started()

    async def _accept_all(self) -> None:
        with self._accept_scope:
            async with trio.open_nursery() as nursery:
                for listener in self._listeners:
                    nursery.start_soon(self._accept_loop, listener)

    async def _accept_loop(self, listener: trio.SocketListener) -> None:
        while True:
            try:
                stream = await listener.accept()
            except trio.ClosedResourceError:
                return
            except OSError as exc:
                if exc.errno in _TRANSIENT_ACCEPT_ERRORS:
                    # Out of descriptors: the pending client waits in the backlog.
                    log.warning("accept failed; retrying", error=exc.strerror)
                    await trio.sleep(_ACCEPT_RETRY)
                    continue
                log.error("accept failed; listener stopped", error=exc.strerror)
                return
            assert self._nursery is not None
            self._nursery.start_soon(self._serve_one, stream)

    async def _serve_one(self, stream: trio.SocketStream) -> None:
        self.accepted += 1
        name = peer_name(stream, next(self._numbers))
        connection = Connection(
            stream,
            self.dispatcher,
            name,
            max_pending=self.max_pending,
            stall_timeout=self.stall_timeout,
        )
        self.connections.add(connection)
        self._idle = trio.Event()
        log.debug("client connected", client=name)
        try:
            await connection.run(self._poller)
        finally:
            self.connections.discard(connection)
            log.debug("client disconnected", client=name, requests=connection.requests)
            if not self.connections:
                self._idle.set()

    async def drain(self, grace: float) -> None:
        """Graceful stop: close the listeners, let owed replies go out for up to ``grace``
        seconds, then cancel whatever is left."""
        self._accept_scope.cancel()
        for listener in self._listeners:
            await listener.aclose()
        for connection in list(self.connections):
            connection.stop_reading()
        if self.connections:
            with trio.move_on_after(grace):
                await self._idle.wait()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

"""Client connections: accept, frame, dispatch, answer in order, never block anyone else.

Fixes the C server's limits (defects 1-3): requests are framed from the byte stream (one
recv() per message is not needed, pipelined requests work), there is no client limit
(select()/FD_SETSIZE is gone), and every connection sends its own replies from its own task.

One ``Poller`` task reads all client sockets (epoll); each connection frames its bytes and
answers what is at hand (a cache hit) on the spot, in one write; a request that has to wait
gets a task in the connection's nursery. A writer task per connection (started with the
first reply that has to wait) sends queued replies in REQUEST order, each with one
``send_all`` of the whole reply (ib_acme reads a reply with a single recv()). A client may
pipeline as many requests as it likes: with ``max_pending`` replies owed, its connection
stops reading (the kernel then holds its further requests back) until the writer has caught
up. Only a client that stops reading is dropped,
with a log line: when one reply cannot be written for ``stall_timeout`` seconds, or its
unwritten replies pass ``MAX_UNSENT_BYTES``; everybody else is served as usual. A malformed
stream is closed exactly where the C server closes (client-protocol.md §8) after the replies to
its earlier requests were sent.

The client socket is open to every local user (0666), so connections are bounded
(``ClientLimits``): in total (and below the open-file limit, keeping a reserve for the admin
socket) and per peer uid (SO_PEERCRED; root is bounded by the total only). A connection over
a bound is accepted and closed at once, so the backlog never fills up for everybody else.
A coarse timer (``_sweep``) closes connections whose request stays half-sent, or that stay
without a request, too long; it reads each connection's request count, so serving a request
costs nothing more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import math
import os
import resource
import select
import socket
import struct
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
FD_RESERVE = 256
"""Descriptors kept free of clients: the admin socket's clients, log and capture files, the
provider's and the fabric's own."""
SWEEP_MAX = 5.0
"""Longest pause of the timeout sweep (seconds); shorter timeouts sweep more often."""
_PEERCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
_REFUSAL_LOG_INTERVAL = 10.0
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


@dataclass(frozen=True)
class ClientLimits:
    """How many clients may connect, and how long a connection may stay without a request
    (option names in the comments; 0 = no limit, except ``max_clients``)."""

    max_clients: int = 16384  # max_clients
    max_per_user: int = 1024  # max_clients_per_user
    request_timeout: float = 10.0  # client_request_timeout
    idle_timeout: float = 0.0  # client_idle_timeout


@dataclass
class ClientStats:
    """What the limits refused and closed, for the admin snapshot and the metrics."""

    refused_total: int = 0
    """Connections refused: ``max_clients`` (or the open-file limit) reached."""
    refused_user: int = 0
    """Connections refused: the peer's user had ``max_clients_per_user`` connections."""
    request_timeouts: int = 0
    """Connections closed: a request stayed half-sent ``client_request_timeout`` seconds."""
    idle_timeouts: int = 0
    """Connections closed: no request for ``client_idle_timeout`` seconds."""

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)  # not vars(): a compiled instance has no __dict__


def peer_uid(sock: trio.socket.SocketType) -> int | None:
    """The uid of a unix-socket peer (SO_PEERCRED); None for TCP or when unknown."""
    if sock.family != socket.AF_UNIX:
        return None
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return None
    return int(_PEERCRED.unpack(raw)[1])


def descriptor_budget(reserve: int = FD_RESERVE) -> int:
    """Client connections the open-file limit leaves room for, ``reserve`` kept free."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max(1, soft - reserve)


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
        uid: int | None = None,
    ) -> None:
        self.stream = stream
        self.dispatcher = dispatcher
        self.name = name
        self.uid = uid
        """The peer's uid (unix socket), counted against ``max_clients_per_user``."""
        self.requests = 0
        self._swept_requests = 0
        self._quiet_since = trio.current_time()
        """When the sweep last saw this connection make progress (a request, a reply owed)."""
        self._fd = stream.socket.fileno()
        self._framer = ClientFramer()
        self._max_pending = max_pending
        self._stall_timeout = stall_timeout
        self._send: trio.MemorySendChannel[_Reply] | None = None
        """The writer's queue, made with the writer when the first reply has to wait: a
        one-shot client answered from the cache needs neither (each costs microseconds)."""
        self._closing = False
        """No reply is queued any more (``run`` is ending)."""
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

    def timed_out(self, now: float, limits: ClientLimits) -> str | None:
        """The sweep's question: which timeout (if any) this connection has passed.

        Progress is a new request or a reply still owed (then the writer's own stall bound
        applies); otherwise the connection is quiet: half-sent when bytes of a request
        wait in the framer, else idle."""
        if self.requests != self._swept_requests or self._owed or self._outbox:
            self._swept_requests = self.requests
            self._quiet_since = now
            return None
        quiet = now - self._quiet_since
        if self._framer.buffered:
            if limits.request_timeout and quiet >= limits.request_timeout:
                return "request"
        elif limits.idle_timeout and quiet >= limits.idle_timeout:
            return "idle"
        return None

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
                    # A one-shot client (ib_acme) sent its request right after connecting:
                    # answer it now rather than one more scheduler round later.
                    poller.guarded(self, self.on_readable)
                    poller.guarded(self, self.flush)
                    await self._reading_done.wait()
            finally:
                poller.forget(self._fd, self)
                # The writer sends what is owed, then ends (closing the connection).
                self._closing = True
                if self._send is not None:
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
        if self._send is None:
            if self._closing:
                return False
            # Unbounded: the bound is reading (``_paused``), not a full queue.
            self._send, replies = trio.open_memory_channel[_Reply](math.inf)
            assert self._nursery is not None  # replies are queued only while run() is in it
            self._nursery.start_soon(self._writer, replies)
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

    async def _writer(self, replies: trio.MemoryReceiveChannel[_Reply]) -> None:
        async with replies:
            async for reply in replies:
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
                        self.guarded(connection, connection.on_readable)
                # Replies go out together after the round: a client process that waits for
                # several of them is woken once, not once per reply.
                unflushed = self._unflushed
                self._unflushed = []
                for connection in unflushed:
                    self.guarded(connection, connection.flush)

    @staticmethod
    def guarded(connection: Connection, step: Callable[[], None]) -> None:
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
        limits: ClientLimits | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.max_pending = max_pending
        self.stall_timeout = stall_timeout
        self.connections: set[Connection] = set()
        self.accepted = 0
        self.stats = ClientStats()
        self._per_user: dict[int, int] = {}
        self._limits = limits or ClientLimits()
        self._capacity = self._limits.max_clients
        """``max_clients``, or fewer when the open-file limit leaves room for fewer."""
        self._sweep_changed = trio.Event()
        self._refusals_logged_at = -math.inf
        self._accept_scope = trio.CancelScope()
        self._nursery: trio.Nursery | None = None
        self._listeners: list[trio.SocketListener] = []
        self._idle = trio.Event()
        self._numbers = itertools.count(1)
        self._poller = Poller()

    @property
    def active(self) -> int:
        return len(self.connections)

    @property
    def limits(self) -> ClientLimits:
        return self._limits

    @limits.setter
    def limits(self, limits: ClientLimits) -> None:
        """New limits (a reload): they apply to the next connection and the next sweep;
        nobody already connected is dropped for a lower bound."""
        self._limits = limits
        self._capacity = min(limits.max_clients, descriptor_budget())
        self._sweep_changed.set()

    def status(self) -> dict[str, object]:
        """For the admin snapshot: connections, the limits in force, what they refused."""
        return {
            "connected": len(self.connections),
            "capacity": self._capacity,
            "max_per_user": self._limits.max_per_user,
            "request_timeout": self._limits.request_timeout,
            "idle_timeout": self._limits.idle_timeout,
            **self.stats.as_dict(),
        }

    async def serve(
        self,
        listeners: Sequence[trio.SocketListener],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Accept until ``drain``; returns when the last connection is gone."""
        self._listeners = list(listeners)
        self.limits = self._limits  # the open-file limit as it is now
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self._poller.run)
            nursery.start_soon(self._accept_all)
            nursery.start_soon(self._sweep)
            task_status.started()

    async def _sweep(self) -> None:
        """The coarse timer of the request and idle timeouts: every few seconds (a quarter
        of the shortest timeout, at most ``SWEEP_MAX``), close the connections past one."""
        while True:
            timeouts = [t for t in (self._limits.request_timeout, self._limits.idle_timeout) if t]
            self._sweep_changed = trio.Event()
            with trio.move_on_after(min([SWEEP_MAX, *(t / 4 for t in timeouts)])):
                await self._sweep_changed.wait()
            if timeouts:
                self.sweep_once(trio.current_time())

    def sweep_once(self, now: float) -> None:
        limits = self._limits
        for connection in list(self.connections):
            which = connection.timed_out(now, limits)
            if which is None:
                continue
            if which == "request":
                self.stats.request_timeouts += 1
                why, seconds = "a request stayed half-sent", limits.request_timeout
            else:
                self.stats.idle_timeouts += 1
                why, seconds = "no request", limits.idle_timeout
            log.info("client timed out; closing", client=connection.name, why=why, s=seconds)
            connection.abort()

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
            uid = peer_uid(stream.socket)
            if not self._admit(uid):
                stream.socket.close()  # the client sees EOF at once; nothing else is spent
                continue
            assert self._nursery is not None
            # Counted now, not when its task starts: a burst of accepts sees every one.
            self._nursery.start_soon(self._serve_one, self._open(stream, uid))

    def _admit(self, uid: int | None) -> bool:
        """Whether a new connection from ``uid`` fits the limits; counted either way.
        Root (and TCP peers, whose uid is unknown) are bounded by the total only."""
        limits = self._limits
        if len(self.connections) >= self._capacity:
            self.stats.refused_total += 1
            self._log_refusal("max_clients", self._capacity, uid)
            return False
        if uid and limits.max_per_user and self._per_user.get(uid, 0) >= limits.max_per_user:
            self.stats.refused_user += 1
            self._log_refusal("max_clients_per_user", limits.max_per_user, uid)
            return False
        return True

    def _log_refusal(self, limit: str, value: int, uid: int | None) -> None:
        """One line per ``_REFUSAL_LOG_INTERVAL`` at most: a flood must not flood the log."""
        now = trio.current_time()
        if now - self._refusals_logged_at < _REFUSAL_LOG_INTERVAL:
            return
        self._refusals_logged_at = now
        log.warning(
            "client connection refused: limit reached",
            limit=limit,
            value=value,
            uid=uid,
            refused_total=self.stats.refused_total,
            refused_user=self.stats.refused_user,
        )

    def _open(self, stream: trio.SocketStream, uid: int | None) -> Connection:
        self.accepted += 1
        connection = Connection(
            stream,
            self.dispatcher,
            peer_name(stream, next(self._numbers)),
            max_pending=self.max_pending,
            stall_timeout=self.stall_timeout,
            uid=uid,
        )
        self.connections.add(connection)
        if uid:
            self._per_user[uid] = self._per_user.get(uid, 0) + 1
        self._idle = trio.Event()
        return connection

    async def _serve_one(self, connection: Connection) -> None:
        log.debug("client connected", client=connection.name)
        try:
            await connection.run(self._poller)
        finally:
            self.connections.discard(connection)
            uid = connection.uid
            if uid:
                left = self._per_user[uid] - 1
                if left:
                    self._per_user[uid] = left
                else:
                    del self._per_user[uid]
            log.debug("client disconnected", client=connection.name, requests=connection.requests)
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

"""The client loop: every client socket in one epoll set, served by one thread.

A connection is a descriptor in this set from accept to close: accepted in the loop's own
round (``accept4``, non-blocking from the start, in a batch until the backlog is empty or
``ACCEPTS_PER_ROUND``), read at once (a one-shot client has sent its request before it is
accepted), a cache hit answered (``HitPath``), and only then watched by the set, to see the
next request or the close. A readable connection is read once per round, its requests
framed (``ClientFramer``) and its hits answered; the round's replies are written at its end,
one write per connection (written at once instead, the clients' next requests spread over
more rounds: 13% fewer requests a second at 64 clients, measured). No socket object,
trio stream, task or nursery per connection: a one-shot client (``ib_acme``) costs accept4,
read, write, epoll_ctl, the read that sees its close, and close; C's select loop makes
accept, recv, send, recv, shutdown and close, and a select per connection. The peer's uid
(``SO_PEERCRED``) is asked only when the per-user bound could bite: while fewer connections
are open than ``max_per_user`` in total, no user can be at it.

A request that must wait (a miss, a PERF_QUERY, anything but a hit) is handed to the trio
side (``ClientServer``) in a batch per round; its reply comes back through the inbox and is
written in request order: a reply never overtakes an earlier request's (``_Slot``).

Why a thread and not a trio task, by measurement (``make bench-throughput``, the two no-work
loops of this kind): a trio task waits for its epoll set through trio's own epoll and a
run-loop pass, 5 system calls a request where C makes 3; the thread blocks in its own
``epoll_wait``. At one cached client the thread loop answered in 7.7 us at the median against
16.4 us for the task loop (the C responder 5.3 us), at 5.4 against 14.4 us of CPU a request.

The loop runs in a thread started by ``trio.to_thread.run_sync`` and owned by the
``ClientServer``'s task, which stops it through the wake-up eventfd; it never outlives that
task. What the two sides share follows the project's thread rules: the loop reads only what
the trio side replaces whole (route tables, limits), each counter has one writer (the
loop's: ``ClientStats``, the hit tally), and hand-offs go through channels: requests to trio
through the ``Outbox`` (a deque and an eventfd trio's epoll watches; a list per round, never
touched again here), replies and commands to the loop through a deque and the wake-up
eventfd. The loop does not log: what is worth a line goes to trio with the requests
(``Note``), and trio's logging applies its rate limits.

A peer that closed is seen by the read that returns nothing, never by its hang-up alone:
bytes it sent before closing are still framed and counted (a malformed request, a RESOLVE
that warms the cache), as C reads them.

Limits (``ClientLimits``): connections in total and per peer uid (SO_PEERCRED, root bounded
by the total only); a connection over a bound is closed at once, so the backlog never fills
for anybody else. A client may pipeline: with ``max_pending`` replies owed its socket is not
read (the kernel holds its further requests back) until half of them went out. Only a client
that stops reading is dropped: when its unwritten replies pass ``MAX_UNSENT_BYTES``, or a
reply stays unwritten ``stall_timeout`` seconds. The trio side's sweep asks the loop for the
request and idle timeouts (its clock is trio's: tests run it on a mock clock).
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import dataclasses
import enum
import errno
import os
import select
import socket
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from ibacm.core.hits import HitPath
from ibacm.wire.client import (
    HDR_LEN,
    MSG_MAX,
    ClientFramer,
    FramingError,
    FramingFault,
    whole_request,
)

MAX_PENDING_REPLIES = 256
"""Replies one connection may owe before its requests are not read for a while."""
STALL_TIMEOUT = 10.0
"""Seconds one reply may wait for the client's socket to drain before the client is dropped."""
MAX_UNSENT_BYTES = 4 << 20
"""Bytes of ready but unwritten replies one connection may hold before it is dropped."""
RECEIVE_SIZE = 4 * MSG_MAX
ACCEPTS_PER_ROUND = 32
"""Connections one listener may bring per round: a flood of connections waits its turn in
the backlog, every connected client is read in between."""
_PEERCRED: Final = struct.Struct("3i")  # struct ucred: pid, uid, gid
NO_UID: Final = -1
"""A connection's ``uid`` when it has none (TCP) or the kernel did not say."""
UID_NOT_ASKED: Final = -2
"""A unix connection's ``uid`` before ``SO_PEERCRED`` was asked (see ``ClientLoop._admit``)."""
# Final: mypyc keeps them in C statics, not in the module's dict (read on every request).
_IN: Final = select.EPOLLIN
_OUT: Final = select.EPOLLOUT
_GONE: Final = select.EPOLLHUP | select.EPOLLERR
_ACCEPT_FLAGS: Final = socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC
_read_fd: Final = os.read  # bound once: no lookup in the os module per request
_write_fd: Final = os.write
_close_fd: Final = os.close
_EAGAIN: Final = errno.EAGAIN
_EINTR: Final = errno.EINTR
_TRANSIENT_ACCEPT_ERRORS = frozenset((errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM))
_CLIENT_ACCEPT_ERRORS = frozenset(
    # accept(2) on Linux: errors of the pending connection, to be retried at once.
    (
        errno.ECONNABORTED,
        errno.EPROTO,
        errno.EPERM,
        errno.ENETDOWN,
        errno.ENOPROTOOPT,
        errno.EHOSTDOWN,
        errno.ENONET,
        errno.EHOSTUNREACH,
        errno.EOPNOTSUPP,
        errno.ENETUNREACH,
    )
)


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
    """What the loop accepted, refused and closed (the loop's thread is the one writer of
    every field; the admin snapshot and the metrics read them)."""

    accepted: int = 0
    refused_total: int = 0
    """Connections refused: ``max_clients`` (or the open-file limit) reached."""
    refused_user: int = 0
    """Connections refused: the peer's user had ``max_clients_per_user`` connections."""
    malformed: int = 0
    """Connections closed for a request that cannot be framed (client-protocol §8)."""
    request_timeouts: int = 0
    """Connections closed: a request stayed half-sent ``client_request_timeout`` seconds."""
    idle_timeouts: int = 0
    """Connections closed: no request for ``client_idle_timeout`` seconds."""
    dropped: int = 0
    """Connections dropped for not reading their replies."""

    def as_dict(self) -> dict[str, int]:
        return dataclasses.asdict(self)  # not vars(): a compiled instance has no __dict__


class NoteKind(enum.Enum):
    """What the loop tells the trio side besides requests (trio logs them)."""

    MALFORMED = "malformed"
    TIMED_OUT = "timed out"
    DROPPED = "dropped"
    FAILED = "failed"
    ACCEPT_FAILED = "accept failed"
    IDLE = "idle"
    """Draining, and the last connection is gone."""


@dataclass(frozen=True)
class Note:
    kind: NoteKind
    client: str
    detail: str


class Connection:
    """One client as the loop keeps it (only the loop's thread touches its fields; the trio
    side holds it as an opaque handle and reads ``name``, fixed at accept)."""

    __slots__ = (
        "blocked",
        "closed",
        "events",
        "fd",
        "framer",
        "number",
        "owed",
        "paused",
        "peer",
        "quiet_since",
        "reading",
        "requests",
        "stalled_since",
        "swept_requests",
        "uid",
        "unsent",
        "unsent_bytes",
        "watched",
    )

    def __init__(self, fd: int, number: int, peer: str, uid: int, now: float) -> None:
        self.fd = fd
        """The connected socket's descriptor (non-blocking), closed by ``ClientLoop._close``."""
        self.number = number
        self.peer = peer
        """A TCP peer's ``host:port``; empty for a unix peer (named by its number)."""
        self.uid = uid
        """The peer's uid (``NO_UID``: none; ``UID_NOT_ASKED``: not asked yet)."""
        self.framer: ClientFramer | None = None
        """Made at the first read that is not exactly one whole request (most clients send
        one request per read, framed without a buffer of their own)."""
        self.owed: collections.deque[Slot] = collections.deque()
        """Replies not written yet, in request order (ready or still with trio)."""
        self.unsent: list[bytes] = []
        """Replies due now that the socket did not take yet, in order (joined at the write:
        a pipelined burst is not copied once per reply)."""
        self.unsent_bytes = 0
        self.events = _IN
        """The epoll mask for the socket (registered once ``watched``)."""
        self.watched = False
        """In the epoll set: after the first read at accept, which may answer and close a
        one-shot client before it costs a registration."""
        self.reading = True
        self.paused = False
        """Not read for now: ``max_pending`` replies are owed (flow control)."""
        self.closed = False
        self.requests = 0
        self.swept_requests = 0
        self.quiet_since = now
        self.blocked = False
        """The socket refused bytes owed to it: its requests are not read until it took
        them all (a client that does not read its replies sends no more)."""
        self.stalled_since = 0.0
        """While ``blocked``: when the socket last took nothing or refused the rest."""

    def timed_out(self, now: float, limits: ClientLimits) -> str | None:
        """Which timeout (if any) this connection has passed: progress is a new request or a
        reply still owed (then the stall bound applies); a quiet connection is half-sent when
        bytes of a request wait in the framer, else idle."""
        if self.requests != self.swept_requests or self.owed or self.unsent:
            self.swept_requests = self.requests
            self.quiet_since = now
            return None
        quiet = now - self.quiet_since
        if self.framer is not None and self.framer.buffered:
            if limits.request_timeout and quiet >= limits.request_timeout:
                return "request"
        elif limits.idle_timeout and quiet >= limits.idle_timeout:
            return "idle"
        return None

    @property
    def name(self) -> str:
        """How logs name the client (made when asked: most connections are never named)."""
        return f"tcp:{self.peer}" if self.peer else f"unix:{self.number}"


class Slot:
    """A request's place in its connection's reply order (written by the loop only)."""

    __slots__ = ("data", "ready")

    def __init__(self, data: bytes | None = None, ready: bool = False) -> None:
        self.data = data
        """The reply; None when ready means "close the connection here"."""
        self.ready = ready


@dataclass(frozen=True, slots=True)
class Request:
    """A request that must wait, handed to the trio side: its reply goes into ``slot``."""

    connection: Connection
    slot: Slot
    frame: bytes
    undersized: bool = False
    """``frame`` is the header of a RESOLVE whose length field is below 16 (client-protocol
    §8): answered EINVAL; the connection closes after it."""


class Outbox:
    """What the loop hands to the trio side: a round's requests that must wait and its notes
    (the first new connection's request that must wait goes ahead, ``ClientLoop._open``), in a
    deque, and an eventfd that trio's own epoll watches (``ClientServer``).

    The trio side takes the items (``take``) before it reads the eventfd (``clear``), and
    takes again after: an uncached request's MAD is posted one system call after the trio
    thread wakes. (``TrioToken.run_sync_soon`` drains its wake-up socket to EAGAIN and
    re-arms it before it runs a callback: three more, measured with strace.) An item put
    after the first ``take`` either made the eventfd readable after ``clear`` or is seen by
    the second ``take``: none waits for a later wake-up."""

    def __init__(self) -> None:
        self._items: collections.deque[tuple[list[Request], list[Note]]] = collections.deque()
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def put(self, batch: list[Request], notes: list[Note]) -> None:
        """(The loop's thread.) Hand over; the lists are never touched here again."""
        self._items.append((batch, notes))
        if self.fd >= 0:
            with contextlib.suppress(BlockingIOError):  # the counter is full: woken anyway
                os.eventfd_write(self.fd, 1)

    def take(self) -> list[tuple[list[Request], list[Note]]]:
        """(The trio side.) Everything handed over so far, in order."""
        items = self._items
        taken = []
        while items:
            taken.append(items.popleft())
        return taken

    def clear(self) -> None:
        """(The trio side.) The eventfd is read: readable again at the next ``put``."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


class ClientLoop:
    """The epoll loop (see the module docstring). ``run`` is the thread's body; every other
    public method is for the trio side and only queues a command and wakes the loop."""

    def __init__(
        self,
        listeners: Sequence[socket.socket],
        hits: HitPath,
        clock: Callable[[], float],
        *,
        limits: ClientLimits,
        capacity: int,
        max_pending: int = MAX_PENDING_REPLIES,
        stall_timeout: float = STALL_TIMEOUT,
    ) -> None:
        self.hits = hits
        self.stats = ClientStats()
        self.limits = limits
        """Replaced whole by the trio side (a reload); read at each accept."""
        self.capacity = capacity
        """``max_clients``, or fewer when the open-file limit leaves room for fewer."""
        self.active = 0
        """Connections open now (written by the loop, read by the trio side)."""
        self._clock = clock
        self.outbox = Outbox()
        """Requests and notes for the trio side (which reads and closes it)."""
        self._max_pending = max_pending
        self._stall_timeout = stall_timeout
        self._listeners = {sock.fileno(): sock for sock in listeners}
        self._unix_listeners = {
            fd for fd, sock in self._listeners.items() if sock.family == socket.AF_UNIX
        }
        """The unix listeners (accepted by ``accept4`` with no address; the others keep
        theirs for the client's name)."""
        for sock in listeners:
            sock.setblocking(False)
        self._epoll = select.epoll()
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._inbox: collections.deque[tuple[Connection, Slot, bytes | None] | Callable[[], None]]
        self._inbox = collections.deque()
        self._conns: dict[int, Connection] = {}
        self._per_user: dict[int, int] = {}
        self._numbers = 0
        self._not_asked = 0
        """Open connections whose uid was not asked yet (``UID_NOT_ASKED``)."""
        self._batch: list[Request] = []
        self._notes: list[Note] = []
        self._dirty: list[Connection] = []
        self._stopping = False
        self._woken = False
        """The wake-up fd was readable this round (read at its end: ``_end_round``)."""
        self._handed_early = False
        """This round handed a new connection's request over before its end (``_open``)."""
        self._draining = False
        self._resting: list[socket.socket] = []
        self.accept_resting = False
        """A listener rests after the open-file limit refused an accept (read by the trio
        side: its sweep brings it back)."""

    # -- the trio side's commands (any thread) -----------------------------------------------

    def reply(self, connection: Connection, slot: Slot, data: bytes | None) -> None:
        """The reply to a handed-off request (None: close the connection there)."""
        self._inbox.append((connection, slot, data))
        self._wake()

    def sweep(self, now: float) -> None:
        """Close the connections past the request or idle timeout, or stalled."""
        self._command(lambda: self._sweep(now))

    def drain(self) -> None:
        """Graceful stop: accept no more, read no more; connections close once their owed
        replies are written (a ``NoteKind.IDLE`` note when the last one is gone)."""
        self._command(self._drain)

    def stop(self) -> None:
        """End ``run`` now (every connection is closed)."""
        self._stopping = True
        self._wake()

    def _command(self, command: Callable[[], None]) -> None:
        self._inbox.append(command)
        self._wake()

    def _wake(self) -> None:
        if self._wake_fd < 0:
            return  # closed: the loop has ended
        with contextlib.suppress(BlockingIOError):  # the counter is full: woken anyway
            os.eventfd_write(self._wake_fd, 1)

    # -- the thread ------------------------------------------------------------------------

    def run(self) -> None:
        epoll = self._epoll
        try:
            epoll.register(self._wake_fd, _IN)
            for fd in self._listeners:
                epoll.register(fd, _IN)
            while not self._stopping:
                events = epoll.poll()
                now = self._clock()
                listeners: list[int] = []
                conns = self._conns
                for fd, mask in events:
                    conn = conns.get(fd)
                    if conn is not None:
                        self._serve(conn, mask, now)
                    elif fd == self._wake_fd:
                        self._take_inbox()
                    elif fd in self._listeners:
                        listeners.append(fd)
                # Accepted after the round's events: a new connection may get the number of
                # one closed in this round, whose event must not reach it.
                for fd in listeners:
                    listener = self._listeners.get(fd)
                    if listener is not None:
                        self._accept(fd, listener, now)
                self._end_round(now)
        finally:
            # In the thread: the connections. The set and the listeners: ``close``.
            for conn in list(self._conns.values()):
                self._close(conn)

    def close(self) -> None:
        """Release the wake-up fd, the epoll set and the listeners (the trio side, once
        ``run`` returned or never ran, and no reply can come any more: closing the fd in the
        thread could let a late reply write to a reused descriptor number)."""
        if self._wake_fd >= 0:
            os.close(self._wake_fd)
            self._wake_fd = -1
        self._epoll.close()
        for sock in self._listeners.values():
            sock.close()
        self._listeners.clear()

    def _end_round(self, now: float) -> None:
        while True:
            dirty = self._dirty
            if dirty:
                self._dirty = []
                for conn in dirty:
                    if not conn.closed:
                        try:
                            self._flush(conn, now)
                        except Exception as exc:
                            self._failed(conn, exc)
            # The wake-up fd is read after the replies it brought are written (one system
            # call sooner to the client); what came meanwhile is taken now, not lost.
            if not self._woken:
                break
            self._woken = False
            with contextlib.suppress(BlockingIOError):
                os.eventfd_read(self._wake_fd)
            if not self._inbox:
                break
            self._take_inbox()
        if self._batch or self._notes:
            self._hand_over()
        self._handed_early = False

    def _hand_over(self) -> None:
        batch, notes = self._batch, self._notes
        self._batch, self._notes = [], []
        self.outbox.put(batch, notes)

    def _take_inbox(self) -> None:
        self._woken = True
        inbox = self._inbox
        while inbox:
            item = inbox.popleft()
            if isinstance(item, tuple):
                conn, slot, data = item
                if not conn.closed:
                    slot.data = data
                    slot.ready = True
                    try:
                        self._advance(conn)
                    except Exception as exc:
                        self._failed(conn, exc)
            else:
                try:
                    item()
                except Exception as exc:
                    self._note(NoteKind.FAILED, "client loop", f"{type(exc).__name__}: {exc}")

    # -- accepting -----------------------------------------------------------------------

    def _accept(self, fd: int, listener: socket.socket, now: float) -> None:
        unix = fd in self._unix_listeners
        for _ in range(ACCEPTS_PER_ROUND):
            peer = ""
            if unix:
                client = _accept4(fd, None, None, _ACCEPT_FLAGS)
                error = ctypes.get_errno() if client < 0 else 0
            else:
                try:
                    sock, address = listener.accept()
                    sock.setblocking(False)
                except OSError as exc:
                    client, error = -1, exc.errno or errno.EIO
                else:
                    peer = _tcp_peer(address, self._numbers + 1)
                    client, error = sock.detach(), 0
            if client < 0:
                if error == _EAGAIN:
                    return
                if error == _EINTR or error in _CLIENT_ACCEPT_ERRORS:
                    continue  # that client's connection failed, not the listener
                self._epoll.unregister(fd)
                if error not in _TRANSIENT_ACCEPT_ERRORS:
                    why = f"{os.strerror(error)}; stopped"
                    self._note(NoteKind.ACCEPT_FAILED, "listener", why)
                    del self._listeners[fd]
                    listener.close()
                    return
                # Out of descriptors: the pending client waits in the backlog, and the
                # listener (level-triggered, still readable) rests until the next sweep
                # instead of spinning the loop.
                self._resting.append(listener)
                self.accept_resting = True
                why = f"{os.strerror(error)}; retrying"
                self._note(NoteKind.ACCEPT_FAILED, "listener", why)
                return
            uid = self._admit(client, unix)
            if uid is None:
                os.close(client)  # the client sees EOF at once; nothing else is spent
                continue
            self._open(client, peer, uid, now)

    def _admit(self, fd: int, unix: bool) -> int | None:
        """The uid to keep for the new connection ``fd`` if it fits the limits, else None;
        counted either way. The peer's uid is asked only when its user could be at
        ``max_per_user``: not while fewer connections than that are open in total."""
        limits = self.limits
        if self.active >= self.capacity:
            self.stats.refused_total += 1
            return None
        if not unix:
            return NO_UID
        bound = limits.max_per_user
        if not bound or self.active < bound:
            return UID_NOT_ASKED
        self._ask_uids()
        uid = _peer_uid(fd)
        if uid > 0 and self._per_user.get(uid, 0) >= bound:
            self.stats.refused_user += 1
            return None
        return uid

    def _ask_uids(self) -> None:
        """Learn the uid of every open connection that was admitted without it."""
        if not self._not_asked:
            return
        for conn in self._conns.values():
            if conn.uid == UID_NOT_ASKED:
                conn.uid = uid = _peer_uid(conn.fd)
                if uid > 0:
                    self._per_user[uid] = self._per_user.get(uid, 0) + 1
        self._not_asked = 0

    def _open(self, fd: int, peer: str, uid: int, now: float) -> None:
        self._numbers += 1
        conn = Connection(fd, self._numbers, peer, uid, now)
        self._conns[fd] = conn
        self.active += 1
        self.stats.accepted += 1
        if uid > 0:
            self._per_user[uid] = self._per_user.get(uid, 0) + 1
        elif uid == UID_NOT_ASKED:
            self._not_asked += 1
        # A one-shot client (ib_acme) sent its request right after connecting: read it,
        # answer a hit and see the close before the connection costs a registration.
        self._serve(conn, _IN, now)
        if self._batch and not self._handed_early:
            # Its request must wait for the fabric: the trio side takes it now, before the
            # registration and the next accept (its MAD leaves two system calls sooner);
            # once a round, so a burst of connections still wakes trio once.
            self._handed_early = True
            self._hand_over()
        if conn.closed:
            return
        try:
            self._epoll.register(fd, conn.events)
        except OSError as exc:  # e.g. fs.epoll.max_user_watches reached
            self._note(NoteKind.FAILED, conn.name, f"cannot watch the client: {exc.strerror}")
            # What its first read already answered (and counted) still goes out.
            self._flush(conn, now)
            self._close(conn)
            return
        conn.watched = True

    # -- serving -------------------------------------------------------------------------

    def _serve(self, conn: Connection, mask: int, now: float) -> None:
        try:
            if mask & _OUT:
                self._write(conn, now)
            if mask & _IN and conn.reading and not conn.paused and not conn.blocked:
                self._read(conn, now)
            elif mask & _GONE and not conn.closed:
                self._close(conn)  # gone while not read (paused or draining)
        except Exception as exc:
            self._failed(conn, exc)

    def _failed(self, conn: Connection, exc: Exception) -> None:
        # A bug costs this one client its connection; everybody else goes on.
        self._note(NoteKind.FAILED, conn.name, f"{type(exc).__name__}: {exc}")
        self._close(conn)

    def _read(self, conn: Connection, now: float) -> None:
        """Read once (a client that never pauses gets its turn like everybody else) and
        take every whole request in what came."""
        try:
            data = _read_fd(conn.fd, RECEIVE_SIZE)
        except BlockingIOError:
            return
        except OSError:
            self._close(conn)
            return
        if not data:
            self._stop_reading(conn)
            return
        framer = conn.framer
        frame = whole_request(data) if framer is None else framer.whole(data)
        if frame is not None:
            conn.requests += 1
            self._request(conn, frame, now)
            return
        if framer is None:
            framer = conn.framer = ClientFramer()
        framer.feed(data)
        self._take(conn, now)

    def _take(self, conn: Connection, now: float) -> None:
        framer = conn.framer
        if framer is None:
            return  # nothing was ever buffered
        try:
            while not conn.paused and not conn.closed and (frame := framer.next_frame()):
                conn.requests += 1
                self._request(conn, frame, now)
        except FramingError as exc:
            self.stats.malformed += 1
            self._note(NoteKind.MALFORMED, conn.name, exc.reason)
            if exc.fault is FramingFault.BAD_LENGTH:
                # The framer still holds the offending message: its header answers §8's case.
                self._hand(conn, framer.head(HDR_LEN), undersized=True)
            self._queue(conn, Slot(None, True))
            self._stop_reading(conn)

    def _request(self, conn: Connection, frame: bytes, now: float) -> None:
        # Behind a reply still owed, even a hit goes to the trio side, in order: a
        # PERF_QUERY waiting there must not count a hit that came after it (as in C).
        answer = None if conn.owed else self.hits.answer(frame, now)
        if answer is None:
            self._hand(conn, frame)
        else:
            if not conn.unsent:
                self._dirty.append(conn)
            conn.unsent.append(answer)
            conn.unsent_bytes += len(answer)
            self._check_unsent(conn)

    def _hand(self, conn: Connection, frame: bytes, *, undersized: bool = False) -> None:
        slot = Slot()
        self._queue(conn, slot)
        self._batch.append(Request(conn, slot, frame, undersized))

    def _queue(self, conn: Connection, slot: Slot) -> None:
        conn.owed.append(slot)
        if slot.ready:
            self._advance(conn)
        if len(conn.owed) >= self._max_pending and not conn.paused and not conn.closed:
            conn.paused = True  # read no further until the replies caught up (_advance)
            self._set_events(conn)

    def _advance(self, conn: Connection) -> None:
        """Move the replies that are due (ready, nothing unready before them) to the bytes
        to write at the end of the round; close where a reply says so."""
        owed = conn.owed
        moved = False
        while owed and owed[0].ready:
            data = owed.popleft().data
            if data is None:
                owed.clear()
                conn.reading = False
                break
            conn.unsent.append(data)
            conn.unsent_bytes += len(data)
            moved = True
        if moved or not conn.reading:
            self._dirty.append(conn)
        self._check_unsent(conn)
        if conn.paused and len(owed) <= self._max_pending // 2 and conn.reading:
            conn.paused = False
            self._set_events(conn)
            self._take(conn, self._clock())  # requests already read and framed come first

    def _check_unsent(self, conn: Connection) -> None:
        if conn.unsent_bytes > MAX_UNSENT_BYTES:
            self._drop(conn, "its unwritten replies pass the byte bound")

    def _flush(self, conn: Connection, now: float) -> None:
        """Write what is due (one write: ib_acme reads a reply with one recv); what the
        socket does not take waits for EPOLLOUT. A connection that reads no more closes
        once nothing is owed."""
        if conn.unsent:
            self._write(conn, now)
            if conn.closed:
                return
        if not conn.reading and not conn.owed and not conn.unsent:
            self._close(conn)

    def _write(self, conn: Connection, now: float) -> None:
        chunks = conn.unsent
        if not chunks:
            return
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            written = _write_fd(conn.fd, data)
        except BlockingIOError:
            written = 0
        except OSError:
            self._close(conn)  # the client went away before its reply
            return
        if written == len(data):
            conn.unsent = []
            conn.unsent_bytes = 0
            if conn.blocked:
                conn.blocked = False
                self._set_events(conn)
            if not conn.reading and not conn.owed:
                self._close(conn)
            return
        rest = data[written:]
        conn.unsent = [rest]
        conn.unsent_bytes = len(rest)
        if written or not conn.blocked:
            conn.stalled_since = now  # the stall timeout counts from the last progress
        if not conn.blocked:
            conn.blocked = True
            self._set_events(conn)

    def _set_events(self, conn: Connection) -> None:
        reads = conn.reading and not conn.paused and not conn.blocked
        events = (_IN if reads else 0) | (_OUT if conn.blocked else 0)
        if events != conn.events and not conn.closed:
            conn.events = events
            if conn.watched:  # else registered with these at the end of ``_open``
                self._epoll.modify(conn.fd, events)

    def _stop_reading(self, conn: Connection) -> None:
        """EOF, or a request that ends the connection: owed replies still go out first."""
        conn.reading = False
        if not conn.owed and not conn.unsent:
            self._close(conn)
        else:
            self._set_events(conn)

    def _drop(self, conn: Connection, why: str) -> None:
        self.stats.dropped += 1
        self._note(
            NoteKind.DROPPED,
            conn.name,
            f"it does not read its replies: {why} ({len(conn.owed)} owed, "
            f"{conn.unsent_bytes} bytes unwritten)",
        )
        self._close(conn)

    def _close(self, conn: Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        conn.owed.clear()
        conn.unsent = []
        conn.unsent_bytes = 0
        del self._conns[conn.fd]
        _close_fd(conn.fd)  # epoll forgets a closed socket by itself
        self.active -= 1
        uid = conn.uid
        if uid > 0:
            left = self._per_user[uid] - 1
            if left:
                self._per_user[uid] = left
            else:
                del self._per_user[uid]
        elif uid == UID_NOT_ASKED:
            self._not_asked -= 1
        if self._draining and not self._conns:
            self._note(NoteKind.IDLE, "", "")

    def _note(self, kind: NoteKind, client: str, detail: str) -> None:
        self._notes.append(Note(kind, client, detail))

    # -- commands --------------------------------------------------------------------------

    def _sweep(self, now: float) -> None:
        if self._resting:
            for listener in self._resting:
                if listener.fileno() in self._listeners:  # not closed by a drain meanwhile
                    self._epoll.register(listener.fileno(), _IN)
            self._resting.clear()
            self.accept_resting = False
        limits = self.limits
        for conn in list(self._conns.values()):
            if conn.blocked and now - conn.stalled_since >= self._stall_timeout:
                self._drop(conn, f"its socket did not drain for {self._stall_timeout:g} s")
                continue
            which = conn.timed_out(now, limits)
            if which is None:
                continue
            if which == "request":
                self.stats.request_timeouts += 1
                why = f"a request stayed half-sent {limits.request_timeout:g} s"
            else:
                self.stats.idle_timeouts += 1
                why = f"no request for {limits.idle_timeout:g} s"
            self._note(NoteKind.TIMED_OUT, conn.name, why)
            self._close(conn)

    def _drain(self) -> None:
        self._draining = True
        resting = {sock.fileno() for sock in self._resting}
        self._resting.clear()
        for fd, sock in self._listeners.items():
            if fd not in resting:
                self._epoll.unregister(fd)
            sock.close()
        self._listeners.clear()
        for conn in list(self._conns.values()):
            self._stop_reading(conn)
        if not self._conns:
            self._note(NoteKind.IDLE, "", "")


def _peer_uid(fd: int) -> int:
    """The uid of the unix-socket peer on ``fd`` (SO_PEERCRED); ``NO_UID`` when unknown."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, 0, fd)
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _PEERCRED.size)
    except OSError:
        return NO_UID
    finally:
        sock.detach()  # the descriptor stays the connection's
    return int(_PEERCRED.unpack(raw)[1])


def _tcp_peer(address: object, number: int) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(number)


def _load_accept4() -> Callable[..., int]:
    """libc's ``accept4``: a client's descriptor, non-blocking and close-on-exec from the
    start, without the socket object (and its ``getsockname``) of ``socket.accept``; -1 with
    ``ctypes.get_errno()`` on failure. The listener is non-blocking: the call never waits,
    so it keeps the GIL (``PyDLL``). No ``argtypes``: ctypes' own conversions (a Python int
    to a C int, None to a null pointer) are what accept4 takes, without a ``from_param``
    call per argument; the result is a C int by default."""
    accept4: Callable[..., int] = ctypes.PyDLL(None, use_errno=True).accept4
    return accept4


_accept4: Final = _load_accept4()

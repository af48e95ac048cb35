"""Client service, the trio side: the client loop's thread, and the requests it hands over.

Fixes the C server's limits (defects 1-3): requests are framed from the byte stream (one
recv() per message is not needed, pipelined requests work), there is no client limit
(select()/FD_SETSIZE is gone), and a slow request holds up nobody but its own client.

Every client socket lives in the ``ClientLoop`` (an epoll loop in one thread, which answers
cache hits itself). ``ClientServer`` owns that thread (``trio.to_thread.run_sync`` in its
nursery, stopped through the loop's wake-up fd when cancelled) and answers what the loop
hands over, in arrival order, in the round that takes it: PERF and EP queries at once, a
RESOLVE that must wait started without a task when the provider can (its reply given back
to the loop from the round that ends it), else in a task of the server's nursery. The
loop's notes (malformed streams, dropped clients, timeouts) and its refusals are logged
here, rate-limited: a flood of bad clients writes one line per ``LOG_INTERVAL`` with a
count, not one line each.
"""

from __future__ import annotations

import math
import resource
import socket
from collections.abc import Sequence

import trio

from ibacm.core.client_loop import (
    MAX_PENDING_REPLIES,
    STALL_TIMEOUT,
    ClientLimits,
    ClientLoop,
    ClientStats,
    Note,
    NoteKind,
    Outbox,
    Request,
)
from ibacm.core.dispatch import Dispatcher
from ibacm.core.hits import HitPath
from ibacm.log import get_logger
from ibacm.provider.api import Counter
from ibacm.wire.errors import WireError

log = get_logger("ibacm.clients")

FD_RESERVE = 256
"""Descriptors kept free of clients: the admin socket's clients, log and capture files, the
provider's and the fabric's own."""
SWEEP_MAX = 1.0
"""Longest pause of the timeout sweep and of the rate-limited log lines (seconds); shorter
timeouts sweep more often."""
LOG_INTERVAL = 10.0
"""Seconds between two log lines of one kind about misbehaving clients."""


def descriptor_budget(reserve: int = FD_RESERVE) -> int:
    """Client connections the open-file limit leaves room for, ``reserve`` kept free."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 30
    return max(1, soft - reserve)


class RateLimitedLine:
    """One kind of log line, written at most once per ``interval`` with the number of its
    occurrences since the last one (the first at once)."""

    def __init__(self, event: str, level: str = "warning", interval: float = LOG_INTERVAL) -> None:
        self.event = event
        self.level = level
        self.interval = interval
        self.logged_at = -math.inf
        self.unlogged = 0
        self.last: dict[str, object] = {}

    def occurred(self, now: float, count: int = 1, **fields: object) -> None:
        self.unlogged += count
        self.last = fields
        self.flush(now)

    def flush(self, now: float) -> None:
        if not self.unlogged or now - self.logged_at < self.interval:
            return
        getattr(log, self.level)(self.event, count=self.unlogged, **self.last)
        self.logged_at = now
        self.unlogged = 0


class ClientServer:
    """Serves the clients of the listeners through a ``ClientLoop``."""

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
        self._limits = limits or ClientLimits()
        self._capacity = self._limits.max_clients
        """``max_clients``, or fewer when the open-file limit leaves room for fewer."""
        self._loop: ClientLoop | None = None
        self._nursery: trio.Nursery | None = None
        self._sweep_changed = trio.Event()
        self._idle = trio.Event()
        self._refused_seen = 0
        self._lines = {
            NoteKind.MALFORMED: RateLimitedLine("client request rejected; closing"),
            NoteKind.TIMED_OUT: RateLimitedLine("client timed out; closing", "info"),
            NoteKind.DROPPED: RateLimitedLine("client dropped: it does not read its replies"),
            NoteKind.FAILED: RateLimitedLine("client handling failed; closing", "error"),
            NoteKind.ACCEPT_FAILED: RateLimitedLine("accept failed", "error"),
        }
        self._refusals = RateLimitedLine("client connections refused: limit reached")
        self._undecodable = RateLimitedLine("malformed request; closing the connection", "info")

    @property
    def stats(self) -> ClientStats:
        return self._loop.stats if self._loop is not None else ClientStats()

    @property
    def hits(self) -> int:
        """RESOLVEs the client loop answered from the route tables (cache hits)."""
        loop = self._loop
        return loop.hits.tally.values[Counter.ROUTE_CACHE] if loop is not None else 0

    @property
    def active(self) -> int:
        return self._loop.active if self._loop is not None else 0

    @property
    def limits(self) -> ClientLimits:
        return self._limits

    @limits.setter
    def limits(self, limits: ClientLimits) -> None:
        """New limits (a reload): they apply to the next connection and the next sweep;
        nobody already connected is dropped for a lower bound."""
        self._limits = limits
        self._capacity = min(limits.max_clients, descriptor_budget())
        if self._loop is not None:
            self._loop.limits = limits  # replaced whole: the loop reads it at each accept
            self._loop.capacity = self._capacity
        self._sweep_changed.set()

    def status(self) -> dict[str, object]:
        """For the admin snapshot: connections, the limits in force, what they refused."""
        return {
            "connected": self.active,
            "capacity": self._capacity,
            "max_per_user": self._limits.max_per_user,
            "request_timeout": self._limits.request_timeout,
            "idle_timeout": self._limits.idle_timeout,
            **self.stats.as_dict(),
        }

    async def serve(
        self,
        listeners: Sequence[socket.socket],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until ``drain`` (or cancellation); returns when the loop's thread ended."""
        self.limits = self._limits  # the open-file limit as it is now
        dispatcher = self.dispatcher
        hits = HitPath(dispatcher.devices, dispatcher.max_paths)
        dispatcher.counters.add_tally(hits.tally)  # kept after the loop ends: counts never fall
        loop = ClientLoop(
            listeners,
            hits,
            trio.lowlevel.current_clock().current_time,
            limits=self._limits,
            capacity=self._capacity,
            max_pending=self.max_pending,
            stall_timeout=self.stall_timeout,
        )
        self._loop = loop
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._sweep, loop)
                nursery.start_soon(self._stop_when_cancelled, loop)
                nursery.start_soon(self._take_handoffs, loop.outbox)
                task_status.started()
                await trio.to_thread.run_sync(
                    loop.run, abandon_on_cancel=False, limiter=trio.CapacityLimiter(1)
                )
                nursery.cancel_scope.cancel()  # the loop ended: its requests' tasks go too
        finally:
            loop.close()
            # The loop's thread has ended and the task that watched the eventfd is gone.
            trio.lowlevel.notify_closing(loop.outbox.fd)
            loop.outbox.close()

    @staticmethod
    async def _stop_when_cancelled(loop: ClientLoop) -> None:
        try:
            await trio.sleep_forever()
        finally:
            loop.stop()

    async def _sweep(self, loop: ClientLoop) -> None:
        """The coarse timer of the request, idle and stall timeouts (a quarter of the
        shortest, at most ``SWEEP_MAX``), and of the rate-limited log lines."""
        while True:
            limits = self._limits
            timeouts = [t for t in (limits.request_timeout, limits.idle_timeout) if t]
            self._sweep_changed = trio.Event()
            pause = min([SWEEP_MAX, self.stall_timeout / 4, *(t / 4 for t in timeouts)])
            with trio.move_on_after(pause):
                await self._sweep_changed.wait()
            now = trio.current_time()
            if loop.active or loop.accept_resting:  # an idle loop is not woken for nothing
                loop.sweep(now)
            self._report_refusals(loop.stats, now)
            for line in (*self._lines.values(), self._refusals, self._undecodable):
                line.flush(now)

    def _report_refusals(self, stats: ClientStats, now: float) -> None:
        refused = stats.refused_total + stats.refused_user
        if refused != self._refused_seen:
            self._refusals.occurred(
                now,
                refused - self._refused_seen,
                capacity=self._capacity,
                max_per_user=self._limits.max_per_user,
                refused_total=stats.refused_total,
                refused_user=stats.refused_user,
            )
            self._refused_seen = refused

    # -- what the loop hands over ----------------------------------------------------------

    async def _take_handoffs(self, outbox: Outbox) -> None:
        """Take what the loop hands over when its eventfd wakes us, in the round it does:
        the items first (an uncached request's MAD is posted before anything else), the
        eventfd read after, and the items that came meanwhile (``Outbox``)."""
        while True:
            await trio.lowlevel.wait_readable(outbox.fd)
            for batch, notes in outbox.take():
                self._intake(batch, notes)
            outbox.clear()
            for batch, notes in outbox.take():
                self._intake(batch, notes)

    def _intake(self, batch: list[Request], notes: list[Note]) -> None:
        # Whatever fails here must not end the hand-off task: the clients are closed.
        try:
            now = trio.current_time()
            for note in notes:
                self._take_note(note, now)
            for request in batch:
                self._take(request)
        except Exception:
            log.exception("client requests could not be taken; closing their connections")
            loop = self._loop
            if loop is not None:
                for request in batch:
                    loop.reply(request.connection, request.slot, None)

    def _take_note(self, note: Note, now: float) -> None:
        if note.kind is NoteKind.IDLE:
            self._idle.set()
            return
        self._lines[note.kind].occurred(now, client=note.client, reason=note.detail)

    def _take(self, request: Request) -> None:
        """Admit a request in arrival order, here and now (so a PERF_QUERY counts exactly
        the requests before it, as in C); what must wait gets a task."""
        assert self._loop is not None and self._nursery is not None  # set before the loop runs
        dispatcher = self.dispatcher
        data: bytes | None
        try:
            if request.undersized:
                data = dispatcher.undersized_resolve(request.frame)
            else:
                data = dispatcher.answer_now(request.frame)
                if data is None:
                    self._begin(request)
                    return
        except Exception as exc:
            data = None
            self._failed(request, exc)
        self._loop.reply(request.connection, request.slot, data)

    def _begin(self, request: Request) -> None:
        """A RESOLVE to wait for: started now by the provider when it can (its MAD posted in
        this round, the reply handed to the loop from the round that ends it), else in a
        task of its own."""
        loop = self._loop
        assert loop is not None and self._nursery is not None
        connection, slot = request.connection, request.slot

        def done(data: bytes) -> None:
            loop.reply(connection, slot, data)

        if not self.dispatcher.begin_resolve(request.frame, connection.name, done):
            self._nursery.start_soon(self._resolve, request)

    async def _resolve(self, request: Request) -> None:
        data: bytes | None = None
        try:
            data = await self.dispatcher.resolve(request.frame, request.connection.name)
        except Exception as exc:
            self._failed(request, exc)
        assert self._loop is not None
        self._loop.reply(request.connection, request.slot, data)

    def _failed(self, request: Request, exc: Exception) -> None:
        client = request.connection.name
        if isinstance(exc, WireError):
            # Framed but not decodable (e.g. opcode 0x81 on a request): closed, as any
            # malformed request (client-protocol §8); nobody else notices.
            self._undecodable.occurred(trio.current_time(), client=client, reason=str(exc))
        else:
            # C closes a connection whose handler fails; nobody else notices.
            log.error("request failed; closing the connection", client=client, exc_info=exc)

    async def drain(self, grace: float) -> None:
        """Graceful stop: accept and read no more, let owed replies go out for up to
        ``grace`` seconds, then cancel whatever is left."""
        loop = self._loop
        if loop is not None:
            loop.drain()
            with trio.move_on_after(grace):
                await self._idle.wait()
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

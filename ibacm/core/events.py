"""The event bus: the daemon tells admin-socket subscribers what changes, without waiting.

``EventBus.publish`` is synchronous and never blocks: each subscriber owns a bounded queue, and
an event that does not fit is only counted. The subscriber later receives one ``dropped``
marker carrying that count, at the place in the stream where the gap is, so a slow reader
learns it missed something while the daemon never slows down for it.

``publish`` may be called from any trio task, from outside a trio run (start-up logging) and
from worker threads (``trio.to_thread``; a structlog processor can run there); calls from a
foreign thread are handed to the trio thread that created the subscriptions.

The bus also keeps the last ``history`` events of the history kinds (log records by default),
also those published before anyone subscribed, so a new subscriber can ask for a ``replay``.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import trio

DROPPED = "dropped"
"""Kind of the marker that reports events lost to a full subscriber queue."""

DEFAULT_MAX_QUEUE = 1000
DEFAULT_HISTORY = 200
"""Recent events (of the history kinds, by default log records) kept for ``replay``."""


@dataclass(frozen=True, slots=True)
class Event:
    """One published change or log record.

    ``ts`` is wall-clock time (seconds since the epoch) because operators read it next to
    log files; timers never use it.
    """

    kind: str
    data: Mapping[str, Any]
    ts: float


@dataclass(eq=False)
class Subscription:
    """A subscriber's bounded view of the bus; iterate it or call ``receive``."""

    bus: EventBus
    max_queue: int
    kinds: frozenset[str] | None
    queue: collections.deque[Event] = field(default_factory=collections.deque)
    dropped: int = 0
    """Events lost since the last marker was queued."""
    dropped_total: int = 0
    closed: bool = False
    _lot: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)

    def wants(self, kind: str) -> bool:
        return self.kinds is None or kind in self.kinds

    def offer(self, event: Event) -> None:
        """Queue ``event`` or count it as dropped; never blocks (trio thread only)."""
        if self.closed:
            return
        if len(self.queue) >= self.max_queue:
            self.dropped += 1
            self.dropped_total += 1
            return
        if self.dropped:
            # The marker sits where the gap is; it may use one slot beyond max_queue so the
            # event that found room is not lost as well.
            self.queue.append(self._marker(event.ts))
        self.queue.append(event)
        self._lot.unpark_all()

    def _marker(self, ts: float) -> Event:
        count, self.dropped = self.dropped, 0
        return Event(DROPPED, {"count": count}, ts)

    def receive_nowait(self) -> Event:
        """The next queued event; raises ``trio.WouldBlock`` when there is none."""
        if self.queue:
            return self.queue.popleft()
        if self.dropped:
            # Events were lost and nothing followed them yet: report the gap now.
            return self._marker(self.bus.clock())
        if self.closed:
            raise trio.EndOfChannel
        raise trio.WouldBlock

    async def receive(self) -> Event:
        """Wait for the next event; raises ``trio.EndOfChannel`` once closed and drained."""
        while True:
            try:
                event = self.receive_nowait()
            except trio.WouldBlock:
                await self._lot.park()
                continue
            await trio.lowlevel.checkpoint()
            return event

    def close(self) -> None:
        """Stop receiving: waiting readers wake and see ``trio.EndOfChannel``."""
        if self.closed:
            return
        self.closed = True
        self.queue.clear()
        self.dropped = 0
        self.bus._unsubscribe(self)
        self._lot.unpark_all()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Event:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class EventBus:
    """Fan-out of daemon events to bounded per-subscriber queues."""

    def __init__(
        self,
        clock: Callable[[], float] = time.time,
        *,
        history: int = DEFAULT_HISTORY,
        history_kinds: Collection[str] = ("log",),
    ) -> None:
        self.clock = clock
        self._subscribers: list[Subscription] = []
        self._token: trio.lowlevel.TrioToken | None = None
        self._trio_thread: int | None = None
        self._history_kinds = frozenset(history_kinds)
        # Recent events of the history kinds, so a new subscriber can see what just happened.
        self._history: collections.deque[Event] = collections.deque(maxlen=max(0, history))

    @property
    def subscriber_count(self) -> int:
        return len(self._subscribers)

    def has_subscribers(self, kind: str) -> bool:
        """Whether an event of ``kind`` would reach anyone (skip building costly events)."""
        return any(subscription.wants(kind) for subscription in self._subscribers)

    def subscribe(
        self,
        max_queue: int = DEFAULT_MAX_QUEUE,
        *,
        kinds: Collection[str] | None = None,
        replay: int = 0,
    ) -> Subscription:
        """A new subscription (call inside the daemon's trio run).

        ``kinds`` limits it to those event kinds; the ``dropped`` marker always comes through.
        ``replay`` queues up to that many recent history events (log records) first.
        """
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        if replay < 0:
            raise ValueError(f"replay must not be negative, got {replay}")
        self._token = trio.lowlevel.current_trio_token()
        self._trio_thread = threading.get_ident()
        wanted = frozenset(kinds) if kinds is not None else None
        subscription = Subscription(self, max_queue, wanted)
        if replay:
            recent = [event for event in self._history if subscription.wants(event.kind)]
            subscription.queue.extend(recent[-min(replay, max_queue) :])
        self._subscribers.append(subscription)
        return subscription

    def publish(self, kind: str, data: Mapping[str, Any]) -> None:
        """Offer an event to every subscriber; never blocks, never raises for a subscriber."""
        if not self._subscribers and kind not in self._history_kinds:
            return
        event = Event(kind, dict(data), self.clock())
        if self._trio_thread is None or threading.get_ident() == self._trio_thread:
            self._deliver(event)
            return
        token = self._token
        if token is None:
            return
        # If the daemon's run is over, nobody is left to tell.
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(self._deliver, event)

    def _deliver(self, event: Event) -> None:
        if event.kind in self._history_kinds:
            self._history.append(event)
        for subscription in tuple(self._subscribers):
            if subscription.wants(event.kind):
                subscription.offer(event)

    def _unsubscribe(self, subscription: Subscription) -> None:
        if subscription in self._subscribers:
            self._subscribers.remove(subscription)

    def close(self) -> None:
        """End every subscription (daemon shutdown)."""
        for subscription in tuple(self._subscribers):
            subscription.close()

"""One timer task per endpoint: when its requests in flight are to be sent again or given up.

A resolution whose ACM request went out without a task of its own (``Resolver``: posted in
the round that took the client's request) still needs a clock: ``retries`` retransmissions,
then a time-out. Instead of a task per request sleeping in ``move_on_after``, the endpoint's
``Timers.run`` sleeps until the earliest deadline of all of them, in a cancel scope whose
deadline a new, earlier timer moves forward (no wake-up, no task switch), and calls each due
timer's ``fire`` in its round. A job start's burst of first resolutions costs one task, not
one per destination.

Timers are cancelled lazily (a flag; the heap drops them when they come up), and the task's
deadline moves to the next armed one when the earliest is cancelled. When the task ends (the
endpoint closes), every timer still armed is ``close``-d: what waits on it learns that the
endpoint is gone, as a task of the endpoint's nursery learns it by cancellation.
"""

from __future__ import annotations

import heapq
import math
from typing import Protocol

import trio

from ibacm.log import get_logger

log = get_logger("ibacm.provider.acmp")


class TimerClient(Protocol):
    """What a timer calls: ``fire`` at its deadline, ``close`` when the endpoint closes."""

    def fire(self, now: float) -> None: ...

    def close(self) -> None: ...


class Timer:
    """One armed deadline (``Timers.at``); ``Timers.cancel`` disarms it."""

    __slots__ = ("armed", "client", "deadline")

    def __init__(self, deadline: float, client: TimerClient) -> None:
        self.deadline = deadline
        self.client = client
        self.armed = True


class Timers:
    """The deadlines of one endpoint (see the module docstring)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Timer]] = []
        self._count = 0
        self._scope: trio.CancelScope | None = None
        self.running = False
        """``run`` is serving: a timer armed now will fire (or be closed)."""

    def __len__(self) -> int:
        return sum(1 for _, _, timer in self._heap if timer.armed)

    def at(self, deadline: float, client: TimerClient) -> Timer:
        """Arm a timer; ``client.fire(now)`` is called at ``deadline`` (trio time)."""
        timer = Timer(deadline, client)
        self._count += 1
        heapq.heappush(self._heap, (deadline, self._count, timer))
        scope = self._scope
        if scope is not None and deadline < scope.deadline:
            scope.deadline = deadline  # the sleeping task wakes sooner, without a wake-up
        return timer

    def cancel(self, timer: Timer) -> None:
        """Disarm ``timer``; when the task sleeps until it, it sleeps until the next one
        instead (a request answered in time costs no wake-up at its deadline)."""
        timer.armed = False
        scope = self._scope
        if scope is not None and timer.deadline <= scope.deadline:
            scope.deadline = self._next()

    async def run(self) -> None:
        """Fire timers until cancelled; then close every timer still armed."""
        self.running = True
        try:
            while True:
                with trio.CancelScope(deadline=self._next()) as scope:
                    self._scope = scope
                    await trio.sleep_forever()
                self._scope = None
                self._fire_due(trio.current_time())
        finally:
            self.running = False
            self._scope = None
            self._close_all()

    def _next(self) -> float:
        heap = self._heap
        while heap and not heap[0][2].armed:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf

    def _fire_due(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, timer = heapq.heappop(heap)
            if not timer.armed:
                continue
            timer.armed = False
            try:
                timer.client.fire(now)
            except Exception:
                # One request's bug must not stop the others' retransmissions.
                log.exception("a timer failed")

    def _close_all(self) -> None:
        heap, self._heap = self._heap, []
        for _, _, timer in heap:
            if timer.armed:
                timer.armed = False
                try:
                    timer.client.close()
                except Exception:
                    log.exception("a timer failed to close")

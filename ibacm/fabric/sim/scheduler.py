"""Timed delivery for the simulator: one task, one heap, trio's clock.

Every MAD in flight is a heap entry (deadline, sequence, callback). A single task sleeps until
the earliest deadline and runs the callbacks that are due, in deadline order and, for equal
deadlines, in the order they were scheduled. This costs O(log n) per MAD and no task per MAD,
which is what lets one process carry an all-to-all storm over thousands of ports; on a
``MockClock`` the waits take no real time.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from typing import Any

import trio


class DeliveryScheduler:
    """Run callbacks at trio-clock deadlines (see the module docstring)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._sequence = itertools.count()
        self._wakeup = trio.Event()
        self._armed = math.inf
        self._running = False

    def __len__(self) -> int:
        return len(self._heap)

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> None:
        """Run ``callback(*args)`` ``delay`` seconds from now (0 = after already-due entries)."""
        deadline = trio.current_time() + max(0.0, delay)
        heapq.heappush(self._heap, (deadline, next(self._sequence), callback, args))
        if deadline < self._armed:
            self._wakeup.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Deliver until cancelled. Exceptions from callbacks propagate (they are bugs)."""
        if self._running:
            raise RuntimeError("the delivery scheduler is already running")
        self._running = True
        task_status.started()
        try:
            while True:
                self._run_due()
                self._wakeup = trio.Event()
                self._armed = self._heap[0][0] if self._heap else math.inf
                with trio.move_on_at(self._armed):
                    await self._wakeup.wait()
        finally:
            self._running = False
            self._armed = math.inf

    def _run_due(self) -> None:
        now = trio.current_time()
        heap = self._heap
        while heap and heap[0][0] <= now:
            _deadline, _seq, callback, args = heapq.heappop(heap)
            callback(*args)

"""Waiters that take turns polling a shared event source.

A completion queue or a umad port delivers events for many waiters (send completions,
receives, SA replies for different TIDs). Instead of a background task that needs an owner
outside the fabric interface, every waiter drives the source itself: the first one polls
("step"), the others park; after each step everyone re-checks its own condition, and when
the polling waiter is satisfied (or cancelled) the next one takes over. No event is lost,
because a step hands everything it read to the shared state before returning.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio


class TurnPoller:
    """Runs ``step`` on behalf of whichever waiter's turn it is."""

    def __init__(self, step: Callable[[], Awaitable[None]], *, name: str) -> None:
        self._step = step
        self._name = name
        self._polling = False
        self._closed = False
        self._lot = trio.lowlevel.ParkingLot()

    @property
    def polling(self) -> bool:
        return self._polling

    @property
    def closed(self) -> bool:
        return self._closed

    async def wait_until(self, done: Callable[[], bool]) -> None:
        """Return once ``done()`` holds; raise ``trio.ClosedResourceError`` after ``close``."""
        while not done():
            if self._closed:
                raise trio.ClosedResourceError(f"{self._name} is closed")
            if self._polling:
                await self._lot.park()
                continue
            self._polling = True
            try:
                await self._step()
            finally:
                self._polling = False
                if self._lot:  # most steps have no other waiter to wake
                    self._lot.unpark_all()

    def close(self) -> None:
        """Wake every waiter; from now on unsatisfied waits raise ClosedResourceError."""
        self._closed = True
        self._lot.unpark_all()

    async def wait_idle(self) -> None:
        """Wait until no step is running (before releasing what a step uses)."""
        while self._polling:
            await self._lot.park()

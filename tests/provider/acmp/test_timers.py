"""The endpoint's timer task (``acmp.timers``): deadlines in order, an earlier one taken at
once, cancelled ones skipped, a failing one logged, the armed ones closed at the end."""

from __future__ import annotations

import pytest
import structlog
import trio
import trio.testing

from ibacm.provider.acmp.timers import Timers

pytestmark = pytest.mark.trio


class Client:
    def __init__(self, name: str, fired: list[tuple[str, float]], fail: bool = False) -> None:
        self.name = name
        self.fired = fired
        self.fail = fail
        self.closed = False

    def fire(self, now: float) -> None:
        self.fired.append((self.name, now))
        if self.fail:
            raise RuntimeError("a bug in one timer")

    def close(self) -> None:
        self.closed = True


async def test_timers_fire_in_deadline_order_and_the_rest_are_closed_at_the_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timers = Timers()
    fired: list[tuple[str, float]] = []
    late = Client("late", fired)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(timers.run)
        await trio.testing.wait_all_tasks_blocked()
        assert timers.running
        start = trio.current_time()
        timers.at(start + 10, Client("ten", fired))
        timers.at(start + 1000, late)
        # Armed while the task sleeps until +10: it wakes for the earlier one.
        timers.at(start + 2, Client("two, failing", fired, fail=True))
        timers.cancel(timers.at(start + 5, Client("cancelled", fired)))
        with structlog.testing.capture_logs() as logs:
            await trio.sleep(20)
        nursery.cancel_scope.cancel()
    assert fired == [("two, failing", start + 2), ("ten", start + 10)]
    assert [log["event"] for log in logs] == ["a timer failed"]  # the next one still fired
    assert late.closed and not timers.running and len(timers) == 0


async def test_a_cancelled_earliest_timer_costs_no_wake_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """An answered request's retransmission timer, cancelled, does not wake the task at
    its deadline: the task sleeps until the next armed one."""
    timers = Timers()
    fired: list[tuple[str, float]] = []
    wakes = 0

    class Counting(trio.abc.Instrument):
        def before_task_step(self, task: trio.lowlevel.Task) -> None:
            nonlocal wakes
            if task.name.endswith("Timers.run"):
                wakes += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(timers.run)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        answered = timers.at(start + 2, Client("answered", fired))
        timers.at(start + 10, Client("ten", fired))
        trio.lowlevel.add_instrument(Counting())
        timers.cancel(answered)
        await trio.sleep(5)
        assert wakes == 0 and fired == []
        await trio.sleep(10)
        nursery.cancel_scope.cancel()
    assert fired == [("ten", start + 10)]

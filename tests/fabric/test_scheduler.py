"""The simulator's timed delivery (ibacm.fabric.sim.scheduler): one task, one heap, trio's
clock; callbacks at their deadlines, in deadline order, ties in the order scheduled."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from ibacm.fabric.sim.scheduler import DeliveryScheduler


@pytest.mark.trio
async def test_callbacks_run_at_their_deadlines_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    scheduler = DeliveryScheduler()
    ran: list[tuple[str, float]] = []

    def note(name: str) -> None:
        ran.append((name, trio.current_time()))

    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        scheduler.call_later(0.5, note, "late")
        scheduler.call_later(0.1, note, "first-tie")
        scheduler.call_later(0.1, note, "second-tie")
        scheduler.call_later(-3, note, "now")  # a negative delay is "now", not the past
        assert len(scheduler) == 4
        await trio.sleep(1)
        assert len(scheduler) == 0
        nursery.cancel_scope.cancel()
    assert [name for name, _ in ran] == ["now", "first-tie", "second-tie", "late"]
    assert [round(at - start, 6) for _, at in ran] == [0.0, 0.1, 0.1, 0.5]


@pytest.mark.trio
async def test_an_earlier_deadline_wakes_the_sleeping_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    scheduler = DeliveryScheduler()
    ran: list[float] = []
    start = trio.current_time()
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        scheduler.call_later(10, lambda: ran.append(trio.current_time() - start))
        await trio.sleep(0.1)  # the task now sleeps until t=10
        scheduler.call_later(0.2, lambda: ran.append(trio.current_time() - start))
        await trio.sleep(20)
        nursery.cancel_scope.cancel()
    assert [round(at, 6) for at in ran] == [0.3, 10.0]


@pytest.mark.trio
async def test_one_scheduler_runs_once_and_a_callbacks_error_is_not_swallowed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    scheduler = DeliveryScheduler()
    async with trio.open_nursery() as nursery:
        await nursery.start(scheduler.run)
        with pytest.raises(RuntimeError, match="already running"):
            await scheduler.run()
        nursery.cancel_scope.cancel()

    def broken() -> None:
        raise ValueError("a bug in a delivery")

    with pytest.raises(ExceptionGroup) as caught:
        async with trio.open_nursery() as nursery:
            await nursery.start(scheduler.run)  # runnable again once the first ended
            scheduler.call_later(0.1, broken)
            await trio.sleep(1)
    assert caught.value.subgroup(ValueError) is not None
    assert "a bug in a delivery" in repr(caught.value.exceptions)

"""TurnPoller: waiters take turns driving a shared source; nobody's event is lost."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from ibacm.fabric.hw.poller import TurnPoller


@pytest.fixture
def autojump_clock() -> trio.testing.MockClock:
    return trio.testing.MockClock(autojump_threshold=0)


class Source:
    """Delivers numbered items one per step, each after a delay."""

    def __init__(self) -> None:
        self.items: list[int] = []
        self.steps = 0
        self.concurrent = 0
        self.max_concurrent = 0

    async def step(self) -> None:
        self.concurrent += 1
        self.max_concurrent = max(self.max_concurrent, self.concurrent)
        try:
            await trio.sleep(1)
            self.steps += 1
            self.items.append(self.steps)
        finally:
            self.concurrent -= 1


@pytest.mark.trio
async def test_every_waiter_gets_its_item_and_only_one_polls_at_a_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    source = Source()
    poller = TurnPoller(source.step, name="test")
    got: dict[int, float] = {}

    async def wait_for(item: int) -> None:
        await poller.wait_until(lambda: item in source.items)
        got[item] = trio.current_time()

    async with trio.open_nursery() as nursery:
        for item in (3, 1, 2):
            nursery.start_soon(wait_for, item)
    assert got == {1: 1.0, 2: 2.0, 3: 3.0}
    assert source.max_concurrent == 1
    assert source.steps == 3


@pytest.mark.trio
async def test_cancelling_the_polling_waiter_hands_the_turn_over(
    autojump_clock: trio.testing.MockClock,
) -> None:
    source = Source()
    poller = TurnPoller(source.step, name="test")
    done = trio.Event()

    async def patient() -> None:
        await poller.wait_until(lambda: 2 in source.items)
        done.set()

    async with trio.open_nursery() as nursery:
        with trio.move_on_after(0.5):  # the first waiter polls, then gives up mid-step
            nursery.start_soon(patient)
            await poller.wait_until(lambda: 99 in source.items)
        await done.wait()
    assert source.items[:2] == [1, 2]


@pytest.mark.trio
async def test_close_wakes_parked_waiters_with_closed_resource_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    source = Source()
    poller = TurnPoller(source.step, name="the source")
    errors: list[str] = []

    async def waiter() -> None:
        try:
            await poller.wait_until(lambda: False)
        except trio.ClosedResourceError as exc:
            errors.append(str(exc))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        nursery.start_soon(waiter)
        await trio.sleep(0.5)
        poller.close()
        await poller.wait_idle()
    assert errors == ["the source is closed", "the source is closed"]
    with pytest.raises(trio.ClosedResourceError):
        await poller.wait_until(lambda: False)
    await poller.wait_until(lambda: True)  # a satisfied wait still returns after close

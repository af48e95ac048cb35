"""The event bus: bounded queues, the dropped marker, never blocking the publisher."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from ibacm.core.events import DROPPED, EventBus


def _kinds(events: list[object]) -> list[str]:
    return [getattr(e, "kind", "?") for e in events]


def drain(sub: object) -> list[object]:
    out = []
    while True:
        try:
            out.append(sub.receive_nowait())  # type: ignore[attr-defined]
        except trio.WouldBlock:
            return out


@pytest.mark.trio
async def test_events_arrive_in_order_with_data_and_time() -> None:
    bus = EventBus(clock=lambda: 1234.5)
    with bus.subscribe() as sub:
        bus.publish("cache", {"dest": "10.0.0.3", "state": "READY"})
        bus.publish("group", {"mgid": "ff15::"})
        first = await sub.receive()
        second = await sub.receive()
    assert (first.kind, dict(first.data), first.ts) == (
        "cache",
        {"dest": "10.0.0.3", "state": "READY"},
        1234.5,
    )
    assert second.kind == "group"


@pytest.mark.trio
async def test_publish_copies_data_so_later_mutation_does_not_leak() -> None:
    bus = EventBus()
    with bus.subscribe() as sub:
        data = {"hits": 1}
        bus.publish("cache", data)
        data["hits"] = 99
        assert (await sub.receive()).data["hits"] == 1


@pytest.mark.trio
async def test_full_queue_counts_drops_and_marker_sits_at_the_gap() -> None:
    bus = EventBus()
    sub = bus.subscribe(max_queue=3)
    for n in range(10):
        bus.publish("log", {"n": n})  # never blocks although nobody reads
    first = await sub.receive()
    assert first.data == {"n": 0}
    bus.publish("log", {"n": 10})  # room again: the marker goes before this event
    rest = drain(sub)
    assert [(e.kind, dict(e.data)) for e in rest] == [  # type: ignore[attr-defined]
        ("log", {"n": 1}),
        ("log", {"n": 2}),
        (DROPPED, {"count": 7}),
        ("log", {"n": 10}),
    ]
    assert sub.dropped_total == 7


@pytest.mark.trio
async def test_marker_is_delivered_even_if_nothing_follows_the_gap() -> None:
    bus = EventBus()
    sub = bus.subscribe(max_queue=1)
    bus.publish("log", {"n": 0})
    bus.publish("log", {"n": 1})
    bus.publish("log", {"n": 2})
    assert (await sub.receive()).data == {"n": 0}
    marker = await sub.receive()
    assert (marker.kind, dict(marker.data)) == (DROPPED, {"count": 2})
    with pytest.raises(trio.WouldBlock):
        sub.receive_nowait()


@pytest.mark.trio
async def test_a_slow_subscriber_does_not_affect_a_fast_one() -> None:
    bus = EventBus()
    slow = bus.subscribe(max_queue=2)
    fast = bus.subscribe(max_queue=1000)
    for n in range(500):
        bus.publish("cache", {"n": n})
    assert len(drain(fast)) == 500
    assert slow.dropped == 498


@pytest.mark.trio
async def test_kinds_filter_only_passes_requested_kinds() -> None:
    bus = EventBus()
    sub = bus.subscribe(kinds=["log"])
    assert bus.has_subscribers("log") and not bus.has_subscribers("stats")
    bus.publish("cache", {})
    bus.publish("log", {"event": "hi"})
    assert _kinds(drain(sub)) == ["log"]


@pytest.mark.trio
async def test_close_wakes_a_waiting_reader_and_ends_iteration() -> None:
    bus = EventBus()
    sub = bus.subscribe()
    seen: list[object] = []

    async def reader() -> None:
        async for event in sub:
            seen.append(event)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        bus.publish("log", {"n": 1})
        await trio.testing.wait_all_tasks_blocked()
        sub.close()
    assert _kinds(seen) == ["log"]
    assert bus.subscriber_count == 0
    bus.publish("log", {"n": 2})  # no subscriber left: nothing to do, no error
    with pytest.raises(trio.EndOfChannel):
        await sub.receive()


@pytest.mark.trio
async def test_bus_close_ends_every_subscription() -> None:
    bus = EventBus()
    subs = [bus.subscribe(), bus.subscribe()]
    bus.close()
    for sub in subs:
        with pytest.raises(trio.EndOfChannel):
            await sub.receive()


@pytest.mark.trio
async def test_publish_from_a_worker_thread_reaches_subscribers() -> None:
    bus = EventBus()
    with bus.subscribe() as sub:
        await trio.to_thread.run_sync(bus.publish, "log", {"event": "from thread"})
        with trio.fail_after(5):
            event = await sub.receive()
    assert event.data == {"event": "from thread"}


def test_publish_outside_trio_without_subscribers_is_harmless() -> None:
    EventBus().publish("log", {"event": "start-up"})


@pytest.mark.trio
async def test_max_queue_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_queue must be at least 1"):
        EventBus().subscribe(max_queue=0)


@pytest.mark.trio
async def test_log_history_is_kept_without_subscribers_and_replayed() -> None:
    bus = EventBus(history=3)
    for n in range(5):
        bus.publish("log", {"n": n})  # e.g. start-up logs, before anyone subscribed
    bus.publish("cache", {"n": 99})
    everything = bus.subscribe(replay=10)
    assert [e.data["n"] for e in drain(everything)] == [2, 3, 4]  # type: ignore[attr-defined]
    nothing_asked = bus.subscribe()
    assert drain(nothing_asked) == []
    small = bus.subscribe(max_queue=2, replay=10)
    assert [e.data["n"] for e in drain(small)] == [3, 4]  # type: ignore[attr-defined]
    only_cache = bus.subscribe(kinds=["cache"], replay=10)
    assert drain(only_cache) == []
    with pytest.raises(ValueError, match="replay must not be negative"):
        bus.subscribe(replay=-1)

"""``SaCall`` (ibacm.fabric.api): an SA request ended once, its waiters told in that round."""

from __future__ import annotations

import pytest
import structlog
import trio
import trio.testing

from ibacm.fabric.api import SaCall, SaSendError, SaTimeout

pytestmark = pytest.mark.trio


async def test_the_first_end_counts_and_its_waiters_run_in_that_round() -> None:
    seen: list[str] = []
    ended = trio.Event()

    async def drive(call: SaCall) -> None:
        await ended.wait()  # as a backend's: the reply ends the call, then the drive returns

    call = SaCall(drive)

    def failing(_: SaCall) -> None:
        raise RuntimeError("a waiter's bug")

    call.when_ended(lambda c: seen.append(f"first {c.reply!r}"))
    call.when_ended(failing)
    call.when_ended(lambda c: seen.append("third"))
    async with trio.open_nursery() as nursery:
        results: list[bytes] = []

        async def waiter() -> None:
            results.append(await call.wait())

        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        with structlog.testing.capture_logs() as logs:
            call.end(b"reply")
        assert seen == ["first b'reply'", "third"] and results == []  # before wait resumed
        assert [entry["event"] for entry in logs] == ["an SA call's waiter failed"]
        call.end(None, SaTimeout("late"))  # ignored: the call had ended
        ended.set()
    assert results == [b"reply"] and call.error is None
    late: list[SaCall] = []
    call.when_ended(late.append)  # after the end: at once
    assert late == [call]


async def test_a_drive_that_ends_it_and_a_cancelled_wait(autojump_clock: object) -> None:
    async def times_out(call: SaCall) -> None:
        await trio.sleep(2)
        call.end(None, SaTimeout("no answer"))

    timed = SaCall(times_out)
    with pytest.raises(SaTimeout):
        await timed.wait()
    assert trio.current_time() == 2

    async def forever(call: SaCall) -> None:
        await trio.sleep_forever()

    abandoned = SaCall(forever)
    with trio.move_on_after(1):
        await abandoned.wait()
    # Nobody will read its reply: it ended, so whatever it held (a credit) is given back.
    assert isinstance(abandoned.error, SaTimeout)
    with pytest.raises(SaSendError):
        SaCall(forever).result()  # not ended yet

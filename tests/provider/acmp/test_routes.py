"""SA path queries (status checks, BUSY backoff, budgets) and locally built paths."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
import trio
import trio.testing

from ibacm.config.options import Options
from ibacm.fabric.api import SaCall, SaSendError, SaTimeout
from ibacm.provider.acmp.routes import (
    SaOutcome,
    SaPaths,
    address_query,
    av_from_path,
    check_path_reply,
    loopback_path,
    path_from_group,
    path_query,
)
from ibacm.provider.api import CorePort, CoreServices, Counters
from ibacm.wire.client import AcmStatus
from ibacm.wire.mad import MadHeader, SaAttr, SaHeader, SaMad
from ibacm.wire.path_record import PathRecord

GID_A = bytes.fromhex("fe800000000000000002c9030001e3f1")
GID_B = bytes.fromhex("fe800000000000000002c903000a2b3d")
Reply = Callable[[bytes], bytes]


class FakeSa(CoreServices):
    """Answers each SA MAD with the next function of ``replies`` (or raises)."""

    def __init__(self, replies: list[Reply | BaseException]) -> None:
        self.options = Options()
        self.counters = Counters()
        self.replies = replies
        self.sent: list[bytes] = []
        self.times: list[float] = []
        self._tid = 0

    def next_tid(self) -> int:
        self._tid += 1
        return self._tid

    async def sa_request(self, port: CorePort, mad: bytes) -> bytes:
        self.sent.append(mad)
        self.times.append(trio.current_time())
        reply = self.replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        return reply(mad)

    def publish(self, kind: str, data: Mapping[str, Any]) -> None:
        pass


def answer(status: int = 0, record: PathRecord | None = None, method: int = 0x81) -> Reply:
    def build(request: bytes) -> bytes:
        sent = SaMad.decode(request)
        header = MadHeader(
            method=method,
            status=status,
            tid=sent.mad.tid | (0xABC << 32),  # the kernel rewrites the upper half
            attr_id=SaAttr.PATH_RECORD,
        )
        data = (record or PathRecord(dgid=GID_B, sgid=GID_A, dlid=5, slid=3)).encode()
        return SaMad(mad=header, sa=SaHeader(), data=data).encode()

    return build


def paths(replies: list[Reply | BaseException]) -> tuple[SaPaths, FakeSa]:
    core = FakeSa(replies)
    return SaPaths(core, object()), core  # type: ignore[arg-type]


@pytest.mark.trio
async def test_a_good_answer_gives_the_record(autojump_clock: object) -> None:
    sa, core = paths([answer()])
    outcome = await sa.get(address_query(GID_A, GID_B, 0, 0xFFFF))
    assert outcome.status == AcmStatus.SUCCESS and outcome.record.dlid == 5  # type: ignore[union-attr]
    sent = SaMad.decode(core.sent[0])
    assert sent.sa.comp_mask == 0x200C  # DGID | SGID | PKEY, mad-protocol.md §9.4
    assert (sent.mad.method, sent.mad.class_version, sent.mad.attr_id) == (1, 2, 0x35)


@pytest.mark.trio
async def test_sa_status_is_passed_through_with_the_record(autojump_clock: object) -> None:
    sa, _ = paths([answer(status=0x0300)])
    outcome = await sa.get(PathRecord(dlid=77))
    assert outcome.status == AcmStatus.ENODATA  # "no records" is 3, as ENODATA
    assert outcome.record is not None


@pytest.mark.trio
async def test_busy_is_retried_after_growing_pauses(autojump_clock: object) -> None:
    sa, core = paths([answer(status=0x0001), answer(status=0x0001), answer()])
    outcome = await sa.get(PathRecord(dlid=5))
    assert outcome.status == AcmStatus.SUCCESS
    gaps = [round(b - a, 3) for a, b in zip(core.times, core.times[1:], strict=False)]
    assert gaps == [0.05, 0.1]
    tids = [SaMad.decode(m).mad.tid for m in core.sent]
    assert len(set(tids)) == 3  # each retry is a new transaction
    assert sa.busy_retries == 2


@pytest.mark.trio
async def test_endless_busy_ends_with_etimedout_within_the_budget(autojump_clock: object) -> None:
    sa, _ = paths([answer(status=0x0001)] * 1000)
    start = trio.current_time()
    outcome = await sa.get(PathRecord(dlid=5))
    assert outcome.status == AcmStatus.ETIMEDOUT
    assert trio.current_time() - start == pytest.approx(6.0)  # 2000 ms x 3


@pytest.mark.trio
@pytest.mark.parametrize("generic", [0x0002, 0x0004, 0x0008, 0x000C, 0x001C])
async def test_generic_mad_status_is_a_failure(autojump_clock: object, generic: int) -> None:
    """C read such answers as success with garbage (defect 39)."""
    sa, _ = paths([answer(status=generic)])
    outcome = await sa.get(PathRecord(dlid=5))
    assert outcome.status == AcmStatus.ENODATA and outcome.record is None
    assert f"0x{generic:02x}" in outcome.reason


@pytest.mark.trio
async def test_transport_failures(autojump_clock: object) -> None:
    sa, _ = paths([SaTimeout("gone"), SaSendError("port down")])
    assert (await sa.get(PathRecord(dlid=5))).status == AcmStatus.ETIMEDOUT
    assert (await sa.get(PathRecord(dlid=5))).status == AcmStatus.ENODATA
    assert sa.failures == 2


@pytest.mark.trio
async def test_wrong_answers_are_failures(autojump_clock: object) -> None:
    sa, _ = paths([answer(method=0x01), lambda _: b"\x01" * 10])
    first = await sa.get(PathRecord(dlid=5))
    assert first.status == AcmStatus.ENODATA and "method" in first.reason
    second = await sa.get(PathRecord(dlid=5))
    assert second.status == AcmStatus.ENODATA and "malformed" in second.reason


def test_reply_checks_compare_only_the_low_tid_half() -> None:
    request = SaMad(mad=MadHeader(tid=0x1234)).encode()
    good = answer()(request)
    assert isinstance(check_path_reply(good, 0x1234, table=False), SaMad)
    assert "TID" in str(check_path_reply(good, 0x1235, table=False))
    assert "method" in str(check_path_reply(good, 0x1234, table=True))


def test_address_query_is_fresh_every_time() -> None:
    """Defect 33: nothing from an earlier path leaks into the next query."""
    query = address_query(GID_A, GID_B, 0, 0xFFFF)
    assert query.comp_mask() == 0x200C
    assert (query.dlid, query.slid, query.sl, query.mtu, query.rate) == (0, 0, 0, 0, 0)


def test_path_query_fills_our_side_unless_given() -> None:
    request = PathRecord(dlid=5, reversible=True, tclass=9, service_id=77)
    query = path_query(request, 0xFFFF, port_lid=3, port_gid=GID_A)
    assert (query.dlid, query.slid, query.sgid, query.pkey) == (5, 3, GID_A, 0xFFFF)
    assert query.comp_mask() == 0x2038  # mad-protocol.md §9.4 "ib_acme -f l -s 3 -d 5"
    own = path_query(PathRecord(dgid=GID_B, slid=9, sgid=GID_B), 0xFFFF, 3, GID_A)
    assert (own.slid, own.sgid) == (9, GID_B)


def test_loopback_and_group_paths() -> None:
    loop = loopback_path(GID_A, 3, 0xFFFF, mtu=5, rate=16)
    assert (loop.sgid, loop.dgid, loop.slid, loop.dlid) == (GID_A, GID_A, 3, 3)
    assert (loop.reversible_numpath, loop.mtu_byte, loop.rate_byte) == (0x80, 5, 16)
    group = PathRecord(dgid=bytes(16), sgid=GID_A, dlid=0xC001, slid=3, sl=2, pkey=0xFFFF)
    peer = path_from_group(group, GID_B, 9)
    assert (peer.dgid, peer.dlid, peer.sl, peer.slid) == (GID_B, 9, 2, 3)
    assert group.dlid == 0xC001  # the group's record is not changed


def test_address_vector_from_a_path() -> None:
    path = PathRecord(dgid=GID_B, sgid=GID_A, dlid=5, slid=3 | 2, sl=4, tclass=7)
    path.flowlabel_hoplimit = (0x54321 << 8) | 0x40
    path.rate_byte = 0x87
    av = av_from_path(path, sgid_index=1, lid_mask=0xFFFC)
    assert (av.dlid, av.dgid, av.sl, av.static_rate, av.sgid_index) == (5, GID_B, 4, 7, 1)
    assert (av.flow_label, av.hop_limit, av.traffic_class) == (0x54321, 0x40, 7)
    assert av.src_path_bits == 3  # the LMC bits of our SLID


# -- a query started without waiting (``SaPaths.begin``, ``SaQuery``) ------------------------


class StartingSa(FakeSa):
    """``FakeSa`` whose first query is started (``sa_start``): the test ends the call."""

    def __init__(self, replies: list[Reply | BaseException]) -> None:
        super().__init__(replies)
        self.calls: list[SaCall] = []
        self.driven = 0

    def sa_start(self, port: CorePort, mad: bytes) -> SaCall | None:
        if self.calls:
            return None  # one at a time, as one credit would allow
        self.sent.append(mad)

        async def drive(call: SaCall) -> None:
            self.driven += 1
            await trio.sleep(1)  # the umad time-out, unless the reply ended it first
            call.end(None, SaTimeout("no answer"))

        call = SaCall(drive)
        self.calls.append(call)
        return call


@pytest.mark.trio
async def test_a_started_query_gives_its_outcome_in_the_round_of_the_answer(
    autojump_clock: object,
) -> None:
    core = StartingSa([])
    sa = SaPaths(core, object())  # type: ignore[arg-type]
    outcomes: list[SaOutcome] = []
    query = sa.begin(address_query(GID_A, GID_B, 0, 0xFFFF), outcomes.append)
    assert query is not None and len(core.sent) == 1  # sent before begin returned
    async with trio.open_nursery() as nursery:
        nursery.start_soon(query.run)
        await trio.testing.wait_all_tasks_blocked()
        (call,) = core.calls
        call.end(answer()(core.sent[0]))  # the backend read the reply
        assert [o.status for o in outcomes] == [AcmStatus.SUCCESS]  # before run resumed
        assert outcomes[0].record is not None and outcomes[0].record.dlid == 5
    assert len(outcomes) == 1 and sa.failures == 0  # run gave nothing more
    # Without a credit (or a port that can start), the query is not begun.
    assert sa.begin(PathRecord(dlid=9), outcomes.append) is None


@pytest.mark.trio
async def test_a_started_query_that_is_busy_or_unanswered_ends_through_run(
    autojump_clock: object,
) -> None:
    # BUSY in the round of the answer: asked again by run after a pause (``sa_request``).
    core = StartingSa([answer()])
    sa = SaPaths(core, object())  # type: ignore[arg-type]
    outcomes: list[SaOutcome] = []
    query = sa.begin(PathRecord(dlid=5), outcomes.append)
    assert query is not None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(query.run)
        await trio.testing.wait_all_tasks_blocked()
        core.calls[0].end(answer(status=0x0001)(core.sent[0]))
        assert outcomes == []
    assert [o.status for o in outcomes] == [AcmStatus.SUCCESS] and sa.busy_retries == 1
    assert core.times and len(core.sent) == 2  # the second one waited for its pause
    # No answer: the call's time-out ends the query ETIMEDOUT, counted once.
    core = StartingSa([])
    sa = SaPaths(core, object())  # type: ignore[arg-type]
    query = sa.begin(PathRecord(dlid=5), outcomes.append)
    assert query is not None
    await query.run()
    assert outcomes[-1].status == AcmStatus.ETIMEDOUT and sa.failures == 1
    # Abandoned (nobody runs it): the call ends, so its credit comes back.
    core = StartingSa([])
    query = SaPaths(core, object()).begin(PathRecord(dlid=5), outcomes.append)  # type: ignore[arg-type]
    assert query is not None
    query.abandon()
    assert core.calls[0].ended and core.driven == 0

"""SA MADs through the hub without waiting (``HubPort.sa_start``): SA_POST frames, calls ended
by whichever task reads the hub's answer, retransmissions, hub-side failures, the tap.

Real hub, real unix sockets, the world's SA answering; one trio run holds both ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from ibacm.fabric.api import (
    MAD_SIZE,
    Port,
    PortAttributes,
    SaDestination,
    SaSendError,
    SaTimeout,
    UdQp,
)
from ibacm.fabric.capture import MadTrace, SaExchange, SaOutcome, TapFabric, TapPort
from ibacm.fabric.sim import hub_protocol as hp
from ibacm.fabric.sim.hub import HubFabric, hub_call, serve_hub
from ibacm.fabric.sim.hub_client import HubPort
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire.mad import Method, SaAttr, SaMad, build_path_get, sa_mad
from ibacm.wire.path_record import PATH_RECORD_LEN, PathRecord
from tests.capture.traffic import Recorder
from tests.fabric.helpers import NodePort, frames_answered, hub, hub_pair, open_node, running


@asynccontextmanager
async def two_nodes(tmp_path: Path) -> AsyncIterator[tuple[str, SimWorld, NodePort, NodePort]]:
    async with hub_pair(tmp_path) as pair:
        yield pair.path, pair.world, pair.a, pair.b


def path_get(tid: int, a: NodePort, b: NodePort) -> bytes:
    return build_path_get(tid, PathRecord(dgid=b.gid, sgid=a.gid, numb_path=1))


def answered_path(reply: bytes) -> PathRecord:
    answer = SaMad.decode(reply)
    assert (answer.mad.method, answer.mad.status) == (Method.GET_RESP, 0)
    return PathRecord.decode(answer.data[:PATH_RECORD_LEN])


@pytest.mark.trio
async def test_a_started_call_ends_in_the_round_that_reads_its_answer(tmp_path: Path) -> None:
    async with two_nodes(tmp_path) as (_, _world, a, b):
        port = a.port
        assert isinstance(port, HubPort)
        device = (await a.fabric.open())[0]
        reader: list[trio.lowlevel.Task] = []

        async def read_events() -> None:
            reader.append(trio.lowlevel.current_task())
            await device.wait_event()

        async with trio.open_nursery() as nursery:
            # This task waits for a port event: it is the one reading node1's socket.
            nursery.start_soon(read_events)
            await trio.testing.wait_all_tasks_blocked()
            # Its time-out is far: only the read's wake-up can end the wait in time.
            call = port.sa_start(path_get(0x42, a, b), a.dest, timeout_ms=60_000, retries=0)
            assert call is not None and not call.ended  # sent; the answer is not read yet
            ended: list[tuple[trio.lowlevel.Task, bool]] = []
            waiting = trio.lowlevel.current_task()
            call.when_ended(lambda c: ended.append((trio.lowlevel.current_task(), c.ended)))
            with trio.fail_after(10):
                reply = await call.wait()
            # The reader ended the call (its waiters ran there); this task, waiting in
            # ``wait``, was woken after it, not handed the answer to end it itself.
            assert ended == [(reader[0], True)] and reader[0] is not waiting
            path = answered_path(reply)
            assert (path.slid, path.dlid) == (a.lid, b.lid)
            assert SaMad.decode(reply).mad.tid & 0xFFFFFFFF == 0x42
            assert port.agent.outstanding == 0
            # The plain ``sa_send`` is the same call's ``wait``.
            again = answered_path(await a.sa(path_get(0x43, a, b)))
            assert (again.slid, again.dlid) == (a.lid, b.lid)
            nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_a_lost_sa_mad_is_sent_again_then_times_out(tmp_path: Path) -> None:
    async with two_nodes(tmp_path) as (path, world, a, b):
        await hub_call(path, {"op": "faults", "set": {"sa_down": "on"}})
        call = a.port.sa_start(path_get(7, a, b), a.dest, timeout_ms=100, retries=2)
        assert call is not None
        started = trio.current_time()
        with trio.fail_after(10), pytest.raises(SaTimeout, match=r"after 3 x 100 ms"):
            await call.wait()
        assert trio.current_time() - started >= 0.3
        with trio.fail_after(10):
            while world.stats["sa_down"] < 3:
                await trio.sleep(0.01)
        assert world.stats["sa_down"] == 3  # the first send and two retransmissions
        await hub_call(path, {"op": "faults", "set": {"sa_down": "off"}})
        # The same TID may go again once the call has ended.
        answered_path(await a.sa(path_get(7, a, b)))


@pytest.mark.trio
async def test_a_hub_side_failure_ends_its_call_or_is_counted(tmp_path: Path) -> None:
    async with two_nodes(tmp_path) as (path, _world, a, b):
        port = a.port
        assert isinstance(port, HubPort)
        # The SA answers late: the failure must wake the waiting task by itself.
        await hub_call(path, {"op": "faults", "set": {"sa_service_time": "2"}})
        bad = SaDestination(a.dest.sm_lid, a.dest.sm_sl, 60)  # not in the P_Key table
        device = (await a.fabric.open())[0]
        async with trio.open_nursery() as nursery:
            # Another task reads the socket: the hub's answer must wake this one.
            nursery.start_soon(device.wait_event)
            await trio.testing.wait_all_tasks_blocked()
            other = port.sa_start(path_get(2, a, b), a.dest, timeout_ms=60_000, retries=0)
            call = port.sa_start(path_get(1, a, b), bad, timeout_ms=60_000, retries=3)
            assert call is not None and other is not None
            with trio.fail_after(1.5):  # before the SA answers the other: the hub said why
                with pytest.raises(SaSendError, match="P_Key index 60 is not in the table"):
                    await call.wait()
            assert isinstance(call.error, SaSendError)
            with trio.fail_after(10):
                answered_path(await other.wait())  # the other request is not affected
            nursery.cancel_scope.cancel()
        assert port.sa_post_errors == 0
        # An unanswered SA MAD (a ReportResp) that fails belongs to no request: counted.
        report = sa_mad(Method.REPORT_RESP, SaAttr.NOTICE, 0x99, 0, bytes(200))
        await port.sa_post(report, bad)
        await port.query()  # answered after the hub's SA_POST_ERROR, read before it
        assert port.sa_post_errors == 1 and port.agent.outstanding == 0


@pytest.mark.trio
async def test_the_hub_skips_a_malformed_sa_post_and_answers_a_failed_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = SimWorld(generate(1))
    async with hub(world, tmp_path / "hub.sock") as path:
        stream = await trio.open_unix_socket(path)
        mad = build_path_get(0x0000_0005_0000_0009, PathRecord(numb_path=1))
        frames = await frames_answered(
            stream,
            hp.encode_call(1, {"op": "hello", "version": hp.PROTOCOL_VERSION, "node": "node1"})
            + hp.frame(hp.FrameType.SA_POST, b"short")
            + hp.encode_sa_post(5, 1, 1, 0, 0, mad)
            + hp.encode_call(2, {"op": "stats"}),
            3,
        )
        # The bad frame costs a line on stderr; the failed post is answered with its TID.
        assert [f.type for f in frames] == [
            hp.FrameType.REPLY,
            hp.FrameType.SA_POST_ERROR,
            hp.FrameType.REPLY,
        ]
        assert hp.decode_sa_post_error(frames[1].body) == (
            5,
            1,
            0x0000_0005_0000_0009,
            "no device with index 5",
        )
        assert hp.decode_json_body(frames[2].body)[0] == 2
        assert "bad frame from a client: SA_POST of 5 bytes" in capsys.readouterr().err
        await stream.aclose()


def test_sa_post_frames_round_trip() -> None:
    mad = build_path_get(3, PathRecord(numb_path=1))
    frames = hp.FrameDecoder().feed(
        hp.encode_sa_post(1, 2, 0xC001, 3, 4, mad)
        + hp.encode_sa_post_error(1, 2, (7 << 32) | 3, "port down")
    )
    assert [f.type for f in frames] == [hp.FrameType.SA_POST, hp.FrameType.SA_POST_ERROR]
    assert hp.decode_sa_post(frames[0].body) == (1, 2, 0xC001, 3, 4, mad)
    assert hp.decode_sa_post_error(frames[1].body) == (1, 2, (7 << 32) | 3, "port down")
    with pytest.raises(hp.HubProtocolError, match="out of range"):
        hp.encode_sa_post(1, 1, 1 << 16, 0, 0, mad)
    with pytest.raises(hp.HubProtocolError, match="MAD of 255 bytes"):
        hp.encode_sa_post(1, 1, 1, 0, 0, mad[:-1])
    with pytest.raises(hp.HubProtocolError, match="SA_POST_ERROR"):
        hp.decode_sa_post_error(b"abc")


class SendOnly(Port):
    """A backend port that cannot start SA calls (``sa_start`` as the interface has it)."""

    def __init__(self, inner: Port) -> None:
        self.inner = inner

    @property
    def port_num(self) -> int:
        return self.inner.port_num

    async def query(self) -> PortAttributes:
        return await self.inner.query()

    async def sa_send(
        self, mad: bytes, dest: SaDestination, *, timeout_ms: int, retries: int
    ) -> bytes:
        return await self.inner.sa_send(mad, dest, timeout_ms=timeout_ms, retries=retries)

    async def open_ud(self, pkey_index: int, *, recv_depth: int) -> UdQp:
        return await self.inner.open_ud(pkey_index, recv_depth=recv_depth)


@pytest.mark.trio
async def test_the_tap_traces_a_started_call_as_a_sent_one(tmp_path: Path) -> None:
    async with two_nodes(tmp_path) as (path, _world, a, b):
        recorder = Recorder()
        tap = TapFabric(HubFabric(path, "node1"))
        tap.add_observer(recorder)
        device = (await tap.open())[0]
        started = device.port(1)
        assert isinstance(started, TapPort)
        await started.query()
        sent = TapPort(started.device, SendOnly(started.inner))
        await sent.query()
        assert sent.sa_start(path_get(1, a, b), a.dest, timeout_ms=100, retries=0) is None
        bad = SaDestination(a.dest.sm_lid, a.dest.sm_sl, 60)

        async def through_start(mad: bytes, dest: SaDestination, timeout_ms: int) -> bytes:
            call = started.sa_start(mad, dest, timeout_ms=timeout_ms, retries=1)
            assert call is not None
            seen: list[int] = []
            # The answer is traced before the caller's waiters hear of the end.
            call.when_ended(lambda _: seen.append(len(recorder.exchanges)))
            try:
                return await call.wait()
            finally:
                assert seen == [len(recorder.exchanges)]  # nothing traced after the end

        async def through_send(mad: bytes, dest: SaDestination, timeout_ms: int) -> bytes:
            return await sent.sa_send(mad, dest, timeout_ms=timeout_ms, retries=1)

        for case, mad, dest, timeout_ms in [
            ("answered", path_get(5, a, b), a.dest, 5000),
            ("refused by the hub", path_get(6, a, b), bad, 5000),
            ("lost", path_get(7, a, b), a.dest, 50),
        ]:
            if case == "lost":
                await hub_call(path, {"op": "faults", "set": {"sa_down": "on"}})
            results: list[tuple[type[Exception] | None, list[MadTrace], list[SaExchange]]] = []
            for run in (through_start, through_send):
                failure: type[Exception] | None = None
                with trio.fail_after(10):
                    try:
                        await run(mad, dest, timeout_ms)
                    except (SaTimeout, SaSendError) as exc:
                        failure = type(exc)
                results.append((failure, *recorder.take()))
            assert results[0] == results[1], case
            _, traces, exchanges = results[0]
            expected = {
                "answered": SaOutcome.OK,
                "refused by the hub": SaOutcome.SEND_ERROR,
                "lost": SaOutcome.TIMEOUT,
            }[case]
            assert [e.outcome for e in exchanges] == [expected]
            assert len(traces) == (2 if case == "answered" else 1)
            assert traces[0].mad == mad and (traces[0].slid, traces[0].dlid) == (
                a.lid,
                a.dest.sm_lid,
            )
            assert all(len(t.mad) == MAD_SIZE for t in traces)
        # A call its caller abandons (cancelled, the SA still silent) has no exchange.
        for run in (through_start, through_send):
            with trio.move_on_after(0.2) as scope:
                await run(path_get(8, a, b), a.dest, 60_000)
            assert scope.cancelled_caught
            traces, exchanges = recorder.take()
            assert [t.mad for t in traces] == [path_get(8, a, b)] and exchanges == []
        await tap.aclose()


@pytest.mark.trio
async def test_calls_on_their_way_end_when_the_hub_goes_away(tmp_path: Path) -> None:
    world = SimWorld(generate(2))
    async with running(world):
        # Not ``hub``: this hub ends by itself, and the nursery waits for it.
        async with trio.open_nursery() as nursery:
            path = await nursery.start(serve_hub, world, tmp_path / "hub.sock")
            fabric = HubFabric(path, "node1")
            a = await open_node(fabric)
            await hub_call(path, {"op": "faults", "set": {"sa_down": "on"}})
            call = a.port.sa_start(path_get(1, a, a), a.dest, timeout_ms=60_000, retries=0)
            assert call is not None
            await hub_call(path, {"op": "shutdown"})
        # Its time-out is far: the lost connection ended it.
        with trio.fail_after(10), pytest.raises(SaSendError, match="hub connection lost"):
            await call.wait()
        with pytest.raises(SaSendError, match="hub connection lost"):
            a.port.sa_start(path_get(2, a, a), a.dest, timeout_ms=100, retries=0)
        await fabric.aclose()

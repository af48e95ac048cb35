"""``post`` and ``serve`` through the hub: UD_POST frames, the link's non-blocking writes and
handlers called by the reader of the socket.

Both ends run in one trio test (real hub, real unix sockets): while the test posts without
yielding, the hub cannot read at all, so the socket really fills and the link's outbound
buffer really holds frames.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import structlog
import trio
import trio.testing

from ibacm.fabric.api import (
    MULTICAST_QPN,
    AddressVector,
    FabricError,
    PortDownError,
    PortState,
    ReceivedMad,
    SendQueueFull,
)
from ibacm.fabric.capture import Direction, MadTrace, TapFabric
from ibacm.fabric.sim import hub_protocol as hp
from ibacm.fabric.sim.hub import DATA_QUEUE_LIMIT, HubFabric, hub_call
from ibacm.fabric.sim.hub_client import HubUdQp
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from tests.capture.traffic import Recorder
from tests.fabric.helpers import (
    ACM_MGID,
    NodePort,
    frames_answered,
    hub,
    hub_pair,
)

BURST = 10_000


def acm_mad(method: int, tag: int) -> bytes:
    return bytes([1, 0x2C, 1, method, 0, 0, 0, 1]) + tag.to_bytes(8, "big") + bytes(240)


def tag_of(got: ReceivedMad) -> int:
    return int.from_bytes(got.mad[8:16], "big")


@asynccontextmanager
async def two_nodes(
    tmp_path: Path, recv_depth: int = 64
) -> AsyncIterator[tuple[str, HubFabric, HubFabric, NodePort, NodePort, HubUdQp, HubUdQp]]:
    async with hub_pair(tmp_path) as pair:
        qa, qb = await pair.a.qp(recv_depth), await pair.b.qp(recv_depth)
        assert isinstance(qa, HubUdQp) and isinstance(qb, HubUdQp)
        yield pair.path, pair.f1, pair.f2, pair.a, pair.b, qa, qb


async def collect(qp: HubUdQp, count: int) -> list[int]:
    tags: list[int] = []
    with trio.fail_after(60):
        while len(tags) < count:
            tags.extend(tag_of(got) for got in await qp.receive_many(count - len(tags)))
    return tags


@pytest.mark.trio
async def test_a_burst_of_posts_arrives_whole_and_in_order_between_sends_and_calls(
    tmp_path: Path,
) -> None:
    async with two_nodes(tmp_path, recv_depth=2 * BURST) as (path, f1, _, a, b, qa, qb):
        to_b = AddressVector(dlid=b.lid, dgid=b.gid)
        half = BURST // 2
        for tag in range(half):
            qa.post(acm_mad(1, tag), to_b, qb.qpn)
        # The hub had no chance to read: the socket is full and frames wait in the link.
        assert f1.link.outbound > 0
        # An async send goes behind them (it flushes them while waiting for its OK)...
        await qa.send(acm_mad(1, half), to_b, qb.qpn)
        assert f1.link.outbound == 0
        for tag in range(half + 1, BURST):
            qa.post(acm_mad(1, tag), to_b, qb.qpn)
        assert f1.link.outbound > 0
        # ... and so does a call, answered after every frame before it was read.
        assert (await a.port.query()).lid == a.lid
        assert await collect(qb, BURST) == list(range(BURST))
        stats = await hub_call(path, {"op": "stats"})
        assert stats["connected"] == ["node1", "node2"]  # no frame was damaged
        assert [0x2C, 1, 0, BURST] in stats["counters"]
        assert qa.completion_errors == 0


@pytest.mark.trio
async def test_posts_from_two_tasks_keep_each_task_s_order(tmp_path: Path) -> None:
    async with two_nodes(tmp_path, recv_depth=4 * 2000) as (_, _f1, _f2, _a, b, qa, qb):
        to_b = AddressVector(dlid=b.lid, dgid=b.gid)

        async def poster(base: int) -> None:
            for tag in range(base, base + 2000):
                qa.post(acm_mad(1, tag), to_b, qb.qpn)
                if tag % 97 == 0:
                    await trio.lowlevel.checkpoint()

        async def sender(base: int) -> None:
            for tag in range(base, base + 50):
                await qa.send(acm_mad(1, tag), to_b, qb.qpn)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(poster, 0)
            nursery.start_soon(poster, 100_000)
            nursery.start_soon(sender, 200_000)
        tags = await collect(qb, 4050)
        for base, count in ((0, 2000), (100_000, 2000), (200_000, 50)):
            assert [t for t in tags if base <= t < base + count] == list(range(base, base + count))


@pytest.mark.trio
async def test_a_failed_post_is_counted_and_a_full_link_says_send_queue_full(
    tmp_path: Path,
) -> None:
    async with two_nodes(tmp_path, recv_depth=1024) as (path, f1, _, a, b, qa, qb):
        to_b = AddressVector(dlid=b.lid, dgid=b.gid)
        logging.getLogger("ibacm.fabric.sim").setLevel(logging.DEBUG)
        try:
            with structlog.testing.capture_logs() as logs:
                # A multicast send to a unicast LID, and a GID index the port does not have.
                qa.post(acm_mad(1, 1), AddressVector(dlid=b.lid, dgid=ACM_MGID), MULTICAST_QPN)
                qa.post(acm_mad(1, 2), AddressVector(dlid=b.lid, sgid_index=5), qb.qpn)
                qa.post(acm_mad(1, 3), to_b, qb.qpn)
                # The hub answers in order: by this OK both failures were told.
                await qa.send(acm_mad(1, 4), to_b, qb.qpn)
        finally:
            logging.getLogger("ibacm.fabric.sim").setLevel(logging.NOTSET)
        assert qa.completion_errors == 2
        failures = [e for e in logs if e["event"] == "posted send failed"]
        assert [(e["log_level"], e["qpn"]) for e in failures] == [("debug", qa.qpn)] * 2
        assert "multicast DLID" in failures[0]["error"]
        assert "GID index 5" in failures[1]["error"]
        assert await collect(qb, 2) == [3, 4]
        # What cannot become a frame is refused at once.
        with pytest.raises(FabricError, match="MAD of 3 bytes"):
            qa.post(b"abc", to_b, qb.qpn)
        # A link holding its limit refuses posts until a waiter flushed it; calls wait.
        f1.link.outbound_limit = 64 * 1024
        posted = 0
        with pytest.raises(SendQueueFull, match="wait for the hub"):
            while True:
                qa.post(acm_mad(1, 1000 + posted), to_b, qb.qpn)
                posted += 1
        assert f1.link.outbound >= f1.link.outbound_limit
        assert (await a.port.query()).lid == a.lid
        qa.post(acm_mad(1, 1000 + posted), to_b, qb.qpn)
        assert await collect(qb, posted + 1) == list(range(1000, 1000 + posted + 1))
        assert qa.completion_errors == 2
        # A closed QP and a lost hub refuse posts.
        await hub_call(path, {"op": "shutdown"})
        assert (await a.port.query()).state == PortState.DOWN
        with pytest.raises(PortDownError, match="lost with the hub"):
            qa.post(acm_mad(1, 9), to_b, qb.qpn)
        await qa.aclose()
        with pytest.raises(FabricError, match="closed QP"):
            qa.post(acm_mad(1, 9), to_b, qb.qpn)


@pytest.mark.trio
async def test_serve_hands_mads_to_the_handler_in_the_round_that_read_them(
    tmp_path: Path,
) -> None:
    async with two_nodes(tmp_path) as (_, _f1, f2, a, b, qa, qb):
        to_a = AddressVector(dlid=a.lid, dgid=a.gid)
        to_b = AddressVector(dlid=b.lid, dgid=b.gid)
        # MADs that arrive before ``serve`` wait in the receive queue.
        for tag in (1, 2):
            await qa.send(acm_mad(1, tag), to_b, qb.qpn)
        with trio.fail_after(10):
            while len(qb._queue) < 2:  # a call reads what the hub forwarded meanwhile
                await b.port.query()
        calls: list[tuple[list[int], trio.lowlevel.Task]] = []

        def handler(batch: list[ReceivedMad]) -> None:
            calls.append(([tag_of(got) for got in batch], trio.lowlevel.current_task()))
            for got in batch:
                if tag_of(got) == 13:
                    raise RuntimeError("handler bug")
                # The answer leaves from the handler, as a daemon's response does.
                qb.post(acm_mad(0x81, tag_of(got)), to_a, got.src_qp)

        async def answers(count: int) -> list[int]:
            got = [await qa.receive() for _ in range(count)]
            assert all(m.mad[3] == 0x81 for m in got)
            return [tag_of(m) for m in got]

        device = (await f2.open())[0]
        async with trio.open_nursery() as nursery:
            # This task waits for a port event: it is the one reading b's socket.
            nursery.start_soon(device.wait_event)
            await trio.testing.wait_all_tasks_blocked()
            serving = trio.CancelScope()

            async def serve() -> None:
                with serving:
                    await qb.serve(handler, limit=1)

            nursery.start_soon(serve)
            await trio.testing.wait_all_tasks_blocked()
            # The queued MADs first, one call each (limit 1), from the serving task.
            assert [tags for tags, _ in calls] == [[1], [2]]
            serve_task = calls[0][1]
            assert await answers(2) == [1, 2]
            # A MAD that arrives later is handed over by the task that read it, in the same
            # step: the serving task, parked, never got a scheduler pass in between.
            qa.post(acm_mad(1, 3), to_b, qb.qpn)
            assert await answers(1) == [3]
            assert calls[2][0] == [3] and calls[2][1] is not serve_task
            # A handler that raises is logged; the MADs after it still arrive.
            with structlog.testing.capture_logs() as logs:
                qa.post(acm_mad(1, 13), to_b, qb.qpn)
                qa.post(acm_mad(1, 14), to_b, qb.qpn)
                assert await answers(1) == [14]
            assert [tags for tags, _ in calls[3:]] == [[13], [14]]
            assert [(e["event"], e["log_level"]) for e in logs] == [
                ("received MADs could not be handled; dropped", "error")
            ]
            # Without a handler, receive works again.
            serving.cancel()
            await trio.testing.wait_all_tasks_blocked()
            await qa.send(acm_mad(1, 20), to_b, qb.qpn)
            assert tag_of(await qb.receive()) == 20
            assert len(calls) == 5
            # ``serve`` returns when the QP is destroyed.
            done = trio.Event()

            async def serve_until_closed() -> None:
                await qb.serve(handler)
                done.set()

            nursery.start_soon(serve_until_closed)
            await trio.testing.wait_all_tasks_blocked()
            await qb.aclose()
            with trio.fail_after(10):
                await done.wait()
            nursery.cancel_scope.cancel()


@pytest.mark.trio
async def test_the_hub_skips_a_malformed_post_and_answers_a_failed_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = SimWorld(generate(1))
    async with hub(world, tmp_path / "hub.sock") as path:
        stream = await trio.open_unix_socket(path)
        mad = acm_mad(1, 1)
        frames = await frames_answered(
            stream,
            hp.encode_call(1, {"op": "hello", "version": hp.PROTOCOL_VERSION})
            + hp.frame(hp.FrameType.UD_POST, b"short")
            + hp.frame(hp.FrameType.UD_SEND, b"short")
            + hp.encode_ud_post(7, 0x100, AddressVector(dlid=1), mad)
            + hp.encode_call(2, {"op": "stats"}),
            3,
        )
        # The bad frames cost nothing but a line on stderr: the failed post is answered
        # (no OK for a post), and the connection goes on.
        assert [f.type for f in frames] == [
            hp.FrameType.REPLY,
            hp.FrameType.POST_ERROR,
            hp.FrameType.REPLY,
        ]
        assert hp.decode_post_error(frames[1].body) == (7, "no QP with handle 7")
        assert hp.decode_json_body(frames[2].body)[0] == 2
        err = capsys.readouterr().err
        assert "bad frame from a client: UD_POST of 5 bytes" in err
        assert "bad frame from a client: UD_SEND of 5 bytes" in err
        await stream.aclose()


def test_post_frames_round_trip() -> None:
    av = AddressVector(dlid=0xC001, dgid=ACM_MGID, sl=3, hop_limit=64, flow_label=0x12345)
    mad = acm_mad(1, 9)
    frames = hp.FrameDecoder().feed(
        hp.encode_ud_post(2, MULTICAST_QPN, av, mad) + hp.encode_post_error(2, "port down")
    )
    assert [f.type for f in frames] == [hp.FrameType.UD_POST, hp.FrameType.POST_ERROR]
    assert hp.decode_ud_post(frames[0].body) == (2, MULTICAST_QPN, av, mad)
    assert hp.decode_post_error(frames[1].body) == (2, "port down")
    with pytest.raises(hp.HubProtocolError, match="out of range"):
        hp.encode_ud_post(1, 1 << 32, av, mad)
    with pytest.raises(hp.HubProtocolError, match="POST_ERROR"):
        hp.decode_post_error(b"ab")


@pytest.mark.trio
async def test_the_tap_over_the_hub_traces_posts_and_counts_their_failures(
    tmp_path: Path,
) -> None:
    async with two_nodes(tmp_path) as (path, _f1, _f2, a, b, _qa, qb):
        recorder = Recorder()
        tap = TapFabric(HubFabric(path, "node1"))
        tap.add_observer(recorder)
        port = (await tap.open())[0].port(1)
        await port.query()
        tapped = await port.open_ud(0, recv_depth=8)
        to_b = AddressVector(dlid=b.lid, dgid=b.gid)
        tapped.post(acm_mad(1, 1), AddressVector(dlid=b.lid, sgid_index=3), qb.qpn)
        tapped.post(acm_mad(1, 2), to_b, qb.qpn)
        await tapped.send(acm_mad(1, 3), to_b, qb.qpn)
        assert tapped.completion_errors == 1  # the hub's POST_ERROR, counted by the inner QP
        assert await collect(qb, 2) == [2, 3]
        traces = recorder.traces
        assert [(t.direction, tag_of_trace(t)) for t in traces] == [
            (Direction.SENT, 1),
            (Direction.SENT, 2),
            (Direction.SENT, 3),
        ]
        assert all((t.slid, t.dlid, t.dest_qp) == (a.lid, b.lid, qb.qpn) for t in traces)
        await tap.aclose()


def tag_of_trace(trace: MadTrace) -> int:
    return int.from_bytes(trace.mad[8:16], "big")


@pytest.mark.trio
async def test_a_client_that_posts_bad_mads_and_never_reads_cannot_grow_the_hub(
    tmp_path: Path,
) -> None:
    world = SimWorld(generate(1))
    async with hub(world, tmp_path / "hub.sock") as path:
        stream = await trio.open_unix_socket(path)
        await stream.send_all(hp.encode_call(1, {"op": "hello", "version": hp.PROTOCOL_VERSION}))
        bad = hp.encode_ud_post(7, 0x100, AddressVector(dlid=1), acm_mad(1, 1)) * 1000
        with trio.fail_after(120):
            for _ in range(DATA_QUEUE_LIMIT // 1000 + 10):
                await stream.send_all(bad)  # and never a read
            while world.stats["post_error_dropped"] == 0:
                await trio.sleep(0.01)
        stats = await hub_call(path, {"op": "stats"})
        assert stats["stats"]["post_error_dropped"] > 0
        await stream.aclose()

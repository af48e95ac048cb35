"""The tap and the capture file on a simulated fabric: what is recorded, when, and failures."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from ibacm.core.sa import sa_destination
from ibacm.fabric.api import MULTICAST_QPN, AddressVector, FabricError, ReceivedMad, SaTimeout
from ibacm.fabric.capture import (
    DEFAULT_QUEUE,
    INTERFACE_RECEIVED,
    INTERFACE_SENT,
    CaptureControl,
    CaptureError,
    CaptureUsageError,
    Direction,
    MadKind,
    MadTrace,
    SaExchange,
    SaOutcome,
    TapFabric,
    describe_mad,
)
from ibacm.fabric.sim.topo_file import generate
from ibacm.fabric.sim.world import SimWorld
from ibacm.wire import erf
from ibacm.wire.acm_mad import AcmMad
from ibacm.wire.mad import Method, RmppFlag, SaMad, build_path_get_table
from ibacm.wire.notice import (
    InformInfo,
    Notice,
    Trap,
    build_inform_info_set,
    build_report,
    build_report_resp,
)
from ibacm.wire.path_record import PathRecord
from tests.capture.traffic import GROUP0, REQUEST_TID, Exchange, Recorder, acm_exchange, running
from tests.fullfs import free, full_tmpfs

WALL = 1_700_000_000.0


@asynccontextmanager
async def capturing(
    world: SimWorld, node: str = "node2", queue_size: int = DEFAULT_QUEUE
) -> AsyncIterator[tuple[TapFabric, CaptureControl]]:
    tap = TapFabric(world.fabric(node))
    control = CaptureControl(tap, wall_clock=lambda: WALL, queue_size=queue_size)
    async with trio.open_nursery() as nursery:
        await nursery.start(control.run)
        yield tap, control
        nursery.cancel_scope.cancel()


def records(path: Path) -> list[tuple[float, erf.ErfRecord, erf.UdPacket]]:
    parsed = erf.parse_pcap(path.read_bytes())
    assert parsed.linktype == erf.LINKTYPE_ERF
    out = []
    for packet in parsed.packets:
        record = erf.ErfRecord.decode(packet.data)
        assert record.rec_type == erf.ERF_TYPE_INFINIBAND
        out.append((packet.seconds, record, erf.UdPacket.decode(record.payload)))
    return out


async def captured_exchange(tmp_path: Path) -> tuple[Exchange, Path]:
    world = SimWorld(generate(3))
    path = tmp_path / "acm.pcap"
    async with running(world), capturing(world) as (tap, control):
        await control.start(str(path))
        exchange = await acm_exchange(tap, world.fabric("node3"))
        status = await control.stop()
    assert status["records"] == 7 and status["dropped"] == 0 and not status["active"]
    return exchange, path


@pytest.mark.trio
async def test_capture_holds_every_mad_with_its_addressing(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    ex, path = await captured_exchange(tmp_path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    got = records(path)
    kinds = [(rec.interface, describe_mad(pkt.payload)) for _, rec, pkt in got]
    assert [(i, k.mgmt_class, k.method, k.attribute) for i, k in kinds] == [
        (INTERFACE_SENT, "sa", "set", "mc_member_record"),
        (INTERFACE_RECEIVED, "sa", "get_resp", "mc_member_record"),
        (INTERFACE_SENT, "sa", "get", "path_record"),
        (INTERFACE_RECEIVED, "sa", "get_resp", "path_record"),
        (INTERFACE_SENT, "acm", "get", "resolve"),
        (INTERFACE_RECEIVED, "acm", "get", "resolve"),  # the multicast comes back (loopback)
        (INTERFACE_RECEIVED, "acm", "get_resp", "resolve"),
    ]
    req, resp, sm = ex.requester.lid, ex.responder.lid, ex.requester.sm_lid
    sa_packets = [pkt for _, _, pkt in got[:4]]
    assert [(p.lrh.slid, p.lrh.dlid) for p in sa_packets] == [(req, sm), (sm, req)] * 2
    for packet in sa_packets:
        assert packet.grh is None
        assert (packet.bth.dest_qp, packet.deth.src_qp, packet.deth.qkey) == (1, 1, 0x80010000)
        assert packet.bth.pkey == 0xFFFF
    # The SA answer carries the MLID and the path exactly as the SA sent them.
    assert SaMad.decode(sa_packets[1].payload).data[36:38] == ex.mlid.to_bytes(2, "big")
    assert PathRecord.decode(SaMad.decode(sa_packets[3].payload).data[:64]) == ex.path

    sent, looped, answer = (pkt for _, _, pkt in got[4:])
    for packet in (sent, looped):
        assert (packet.lrh.slid, packet.lrh.dlid) == (req, ex.mlid)
        assert (packet.bth.dest_qp, packet.deth.src_qp) == (MULTICAST_QPN, ex.requester_qpn)
        assert packet.grh is not None
        assert (packet.grh.sgid, packet.grh.dgid) == (ex.requester.gids[0], GROUP0)
        assert AcmMad.decode(packet.payload) == ex.request
    assert (answer.lrh.slid, answer.lrh.dlid) == (resp, req)
    assert (answer.bth.dest_qp, answer.deth.src_qp) == (ex.requester_qpn, ex.responder_qpn)
    assert answer.grh is not None
    assert (answer.grh.sgid, answer.grh.dgid) == (ex.responder.gids[0], ex.requester.gids[0])
    assert AcmMad.decode(answer.payload).tid == REQUEST_TID
    # Wall-clock stamps: the anchor plus trio-clock offsets, in order.
    stamps = [seconds for seconds, _, _ in got]
    assert stamps == sorted(stamps)
    assert stamps[0] >= WALL and stamps[-1] < WALL + 1


@pytest.mark.trio
async def test_capture_starts_and_stops_at_run_time(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    world = SimWorld(generate(3))
    first, second = tmp_path / "one.pcap", tmp_path / "two.pcap"
    async with running(world), capturing(world) as (tap, control):
        assert control.status() == {
            "active": False,
            "path": None,
            "records": 0,
            "dropped": 0,
            "lost": 0,
            "bytes": 0,
        }
        recorder = Recorder()
        tap.add_observer(recorder)
        await acm_exchange(tap, world.fabric("node3"))  # before any capture: not recorded
        assert len(recorder.traces) == 7
        assert tap.observers == (recorder,)

        await control.start(str(first))
        assert control.active and list(tap.observers) == [recorder, control]
        with pytest.raises(CaptureUsageError, match="already running"):
            await control.start(str(second))
        node = await tap.open()
        port = node[0].port(1)
        attrs = await port.query()
        await port.sa_send(
            build_path_get_table(11, PathRecord(sgid=attrs.gids[0], pkey=0xFFFF)),
            sa_destination(attrs),
            timeout_ms=100,
            retries=1,
        )
        stopped = await control.stop()
        assert tap.observers == (recorder,)
        with pytest.raises(CaptureUsageError, match="no capture is running"):
            await control.stop()

        result = await control.command({"action": "start", "path": str(second)})
        assert result["active"] and result["path"] == str(second)
        await acm_exchange(tap, world.fabric("node1"))
        assert (await control.command({"action": "status"}))["active"]
        final = await control.command({"action": "stop"})

    # A GetTable answer longer than one MAD is recorded as the RMPP segments it came in.
    got = records(first)
    assert stopped["records"] == len(got) >= 3
    request, *segments = (pkt.payload for _, _, pkt in got)
    assert SaMad.decode(request).mad.method == Method.GET_TABLE
    flags = [SaMad.decode(s).sa.rmpp_flags & 0x7 for s in segments]
    assert flags[0] & RmppFlag.FIRST and flags[-1] & RmppFlag.LAST
    assert [SaMad.decode(s).sa.seg_num for s in segments] == list(range(1, len(segments) + 1))
    assert final["records"] == len(records(second)) == 7


@pytest.mark.trio
async def test_bad_requests_get_clear_errors(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    world = SimWorld(generate(2))
    async with running(world), capturing(world) as (_tap, control):
        with pytest.raises(CaptureUsageError, match="absolute"):
            await control.start("relative.pcap")
        with pytest.raises(CaptureUsageError, match="non-empty string"):
            await control.command({"action": "start"})
        with pytest.raises(CaptureUsageError, match="start, stop or status"):
            await control.command({"action": "pause"})
        with pytest.raises(CaptureError, match=r"cannot open capture file .*No such file"):
            await control.start(str(tmp_path / "missing" / "x.pcap"))
        target = tmp_path / "target"
        target.write_bytes(b"keep me")
        (tmp_path / "link.pcap").symlink_to(target)
        with pytest.raises(CaptureError, match="cannot open capture file"):
            await control.start(str(tmp_path / "link.pcap"))
        assert target.read_bytes() == b"keep me"  # a planted symlink is not followed
        assert not control.active
    unstarted = CaptureControl(TapFabric(world.fabric("node1")))
    with pytest.raises(CaptureError, match="not running"):
        await unstarted.start(str(tmp_path / "x.pcap"))


@pytest.mark.trio
async def test_a_full_queue_drops_instead_of_blocking(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    world = SimWorld(generate(2))
    path = tmp_path / "small.pcap"
    trace = MadTrace(0.0, Direction.SENT, "mlx5_0/1", bytes(256), 1, 2, 3, 4, 0xFFFF)
    async with running(world), capturing(world, queue_size=2) as (_tap, control):
        await control.start(str(path))
        for _ in range(5):  # no checkpoint in between: the writer cannot run
            control.on_mad(trace)
        status = await control.stop()
    assert (status["records"], status["dropped"]) == (2, 3)
    assert len(records(path)) == 2


@pytest.mark.trio
async def test_shutdown_flushes_the_running_capture(
    autojump_clock: trio.abc.Clock, tmp_path: Path
) -> None:
    world = SimWorld(generate(3))
    path = tmp_path / "shutdown.pcap"
    async with running(world):
        tap = TapFabric(world.fabric("node2"))
        control = CaptureControl(tap)
        async with trio.open_nursery() as nursery:
            await nursery.start(control.run)
            await control.start(str(path))
            await acm_exchange(tap, world.fabric("node3"))
            nursery.cancel_scope.cancel()  # the daemon stops without stopping the capture
        assert not control.active and tap.observers == ()
    assert len(records(path)) == 7


@pytest.mark.trio
async def test_failures_and_observer_bugs(autojump_clock: trio.abc.Clock, tmp_path: Path) -> None:
    world = SimWorld(generate(3))
    async with running(world):
        tap = TapFabric(world.fabric("node2"))

        class Broken:
            def on_mad(self, trace: MadTrace) -> None:
                raise RuntimeError("observer bug")

            def on_sa_exchange(self, exchange: SaExchange) -> None:
                raise RuntimeError("observer bug")

        recorder = Recorder()
        tap.add_observer(Broken())
        tap.add_observer(recorder)
        await acm_exchange(tap, world.fabric("node3"))  # the broken observer changes nothing
        assert len(recorder.traces) == 7
        assert tap.observer_errors == 7 + 2
        assert [e.outcome for e in recorder.exchanges] == [SaOutcome.OK, SaOutcome.OK]
        assert all(e.latency > 0 and e.status == 0 for e in recorder.exchanges)

        world.faults.sa_down = True
        port = (await tap.open())[0].port(1)
        attrs = await port.query()
        with pytest.raises(SaTimeout):
            await port.sa_send(
                build_path_get_table(99, PathRecord(pkey=0xFFFF)),
                sa_destination(attrs),
                timeout_ms=50,
                retries=1,
            )
        timeout = recorder.exchanges[-1]
        assert (timeout.outcome, timeout.status) == (SaOutcome.TIMEOUT, None)
        assert timeout.latency == pytest.approx(0.1)  # 2 attempts of 50 ms
        assert recorder.traces[-1].direction is Direction.SENT  # the request, no answer


@pytest.mark.trio
async def test_a_batch_of_received_mads_is_traced_mad_by_mad(
    autojump_clock: trio.abc.Clock,
) -> None:
    world = SimWorld(generate(3))
    async with running(world):
        tap = TapFabric(world.fabric("node2"))
        recorder = Recorder()
        tap_port = (await tap.open())[0].port(1)
        tapped = await tap_port.open_ud(0, recv_depth=8)
        sender_port = (await world.fabric("node3").open())[0].port(1)
        sender = await sender_port.open_ud(0, recv_depth=8)
        lid = (await tap_port.query()).lid
        tap.add_observer(recorder)
        mads = [
            bytes([1, 0x2C, 1, 0x81]) + bytes(4) + tag.to_bytes(8, "big") + bytes(240)
            for tag in range(3)
        ]
        for mad in mads:
            await sender.send(mad, AddressVector(dlid=lid), tapped.qpn)
        await trio.sleep(1)
        assert [got.mad for got in await tapped.receive_many(8)] == mads
        traced = [t for t in recorder.traces if t.direction is Direction.RECEIVED]
        assert [t.mad for t in traced] == mads
        await tap.aclose()


@pytest.mark.trio
async def test_the_tap_is_transparent(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(3))
    async with running(world):
        inner = world.fabric("node2")
        tap = TapFabric(inner)
        assert tap.hostname == inner.hostname == "node2"
        assert await tap.interface_addresses() == await inner.interface_addresses()
        devices = await tap.open()
        assert devices == await tap.open()  # the same wrappers every time
        device = devices[0]
        assert device.port(1) is device.port(1)
        assert (device.name, device.node_guid, device.phys_port_cnt) == (
            (await inner.open())[0].name,
            (await inner.open())[0].node_guid,
            1,
        )
        exchange = await acm_exchange(tap, world.fabric("node3"))  # no observer at all
        assert exchange.path.dlid == exchange.responder.lid
        world.add_address("node2", "ib0", "10.9.9.9/16")
        event = await tap.wait_ip_event()
        assert event.added and str(event.address.address) == "10.9.9.9"
        await tap.aclose()


async def written_or_lost(control: CaptureControl, count: int) -> None:
    """Until the writer (in a thread) has dealt with ``count`` MADs."""
    with trio.fail_after(10):
        while control.status()["records"] + control.status()["lost"] < count:
            await trio.sleep(0.001)


@pytest.mark.trio
async def test_a_full_disk_costs_records_not_the_capture(
    autojump_clock: trio.abc.Clock, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    world = SimWorld(generate(3))
    with full_tmpfs(tmp_path / "full", room=4096) as full:
        path = full / "acm.pcap"
        async with running(world), capturing(world) as (tap, control):
            with pytest.raises(CaptureError, match=r"cannot write capture file .*No space left"):
                await control.start("/dev/full")  # not even the file header fits
            await control.start(str(path))
            for _ in range(6):  # 7 MADs of about 300 bytes each: more than 4 KiB
                await acm_exchange(tap, world.fabric("node3"))
            await written_or_lost(control, 6 * 7)
            status = control.status()
            # (status["error"] may be gone already: cutting a record back frees room that a
            # smaller record can use, and a write that works clears it.)
            assert status["active"] and status["lost"] > 0
            kept = status["records"]
            assert kept + status["lost"] == 6 * 7
            # What is in the file is whole records only (a cut one was taken back out).
            assert len(records(path)) == kept
            free(full)
            await acm_exchange(tap, world.fabric("node3"))
            final = await control.stop()
        assert final["records"] == kept + 7 and final["lost"] == status["lost"]
        assert final["error"] is None
        assert len(records(path)) == kept + 7
        assert final["bytes"] == path.stat().st_size
    err = capsys.readouterr().err
    reports = [line for line in err.splitlines() if line.startswith("ibacm: cannot write ")]
    assert len(reports) == 1 and "captured MAD(s) lost" in reports[0]
    assert "No space left on device" in reports[0]
    assert f"ibacm: writing {path} again" in err
    assert "Traceback" not in err


def test_sm_event_mads_are_named_in_logs_and_metrics() -> None:
    subscribe = build_inform_info_set(7, InformInfo(trap_num=Trap.GID_OUT_OF_SERVICE))
    assert describe_mad(subscribe) == MadKind("sa", "set", "inform_info")
    gone = Notice.gid_trap(Trap.GID_OUT_OF_SERVICE, bytes(16), issuer_lid=1, issuer_gid=bytes(16))
    report = build_report(8, gone)
    assert describe_mad(report) == MadKind("sa", "report", "notice")
    assert describe_mad(build_report_resp(SaMad.decode(report))).method == "report_resp"


@pytest.mark.trio
async def test_posted_and_served_mads_are_traced(autojump_clock: trio.abc.Clock) -> None:
    world = SimWorld(generate(3))
    async with running(world):
        tap = TapFabric(world.fabric("node2"))
        recorder = Recorder()
        tap_port = (await tap.open())[0].port(1)
        attrs = await tap_port.query()
        tapped = await tap_port.open_ud(0, recv_depth=8)
        peer_port = (await world.fabric("node3").open())[0].port(1)
        peer_attrs = await peer_port.query()
        peer = await peer_port.open_ud(0, recv_depth=8)
        tap.add_observer(recorder)

        def mad(method: int, tag: int) -> bytes:
            return bytes([1, 0x2C, 1, method]) + bytes(4) + tag.to_bytes(8, "big") + bytes(240)

        def answer(batch: list[ReceivedMad]) -> None:
            for got in batch:
                response = mad(0x81, int.from_bytes(got.mad[8:16], "big"))
                tapped.post(response, AddressVector(dlid=got.slid, dgid=got.sgid), got.src_qp)

        requests = [mad(1, tag) for tag in range(3)]
        responses = [mad(0x81, tag) for tag in range(3)]
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tapped.serve, answer)
            for request in requests:
                await peer.send(request, AddressVector(dlid=attrs.lid), tapped.qpn)
            assert [(await peer.receive()).mad for _ in requests] == responses
            nursery.cancel_scope.cancel()
        received = [t for t in recorder.traces if t.direction is Direction.RECEIVED]
        sent = [t for t in recorder.traces if t.direction is Direction.SENT]
        assert [t.mad for t in received] == requests
        assert [t.mad for t in sent] == responses
        for came, went in zip(received, sent, strict=True):
            # Traced before the handler saw it: the request precedes the answer it caused.
            assert recorder.traces.index(came) < recorder.traces.index(went)
        assert (received[0].slid, received[0].dlid) == (peer_attrs.lid, attrs.lid)
        assert (received[0].src_qp, received[0].dest_qp) == (peer.qpn, tapped.qpn)
        assert (sent[0].slid, sent[0].dlid, sent[0].sgid) == (
            attrs.lid,
            peer_attrs.lid,
            attrs.gids[0],
        )
        assert (sent[0].src_qp, sent[0].dest_qp, sent[0].pkey) == (tapped.qpn, peer.qpn, 0xFFFF)
        # A post the QP refuses is not on the wire: nothing is traced.
        with pytest.raises(FabricError, match="GID index"):
            tapped.post(mad(1, 9), AddressVector(dlid=peer_attrs.lid, sgid_index=4), peer.qpn)
        assert len(recorder.traces) == 6
        await tap.aclose()

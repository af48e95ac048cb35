"""Devices and ports of the hardware backend: verbs devices on a fake HCA, umad-only
devices on a fake libibumad, and what ``HwFabric.open()`` says when there is nothing."""

from __future__ import annotations

import os
from collections.abc import Callable
from types import SimpleNamespace
from typing import cast

import pytest
import trio

from ibacm.fabric.api import (
    FabricError,
    NoDevicesError,
    PortEvent,
    PortEventType,
    PortState,
    ReceivedMad,
    SaDestination,
    SaSendError,
)
from ibacm.fabric.hw.fabric import HwFabric, HwMode
from ibacm.fabric.hw.pyverbs_loader import Pyverbs, PyverbsUnavailable
from ibacm.fabric.hw.umad import UmadApi, UmadError
from ibacm.fabric.hw.umad_device import (
    NoDataPathQp,
    UmadOnlyDevice,
    port_changes,
    umad_port_attributes,
    width_speed,
)
from ibacm.fabric.hw.verbs_device import HwDevice
from ibacm.fabric.hw.verbs_handles import LibVerbs, VerbsHandles
from ibacm.wire.mad import SaMad, build_path_get, build_sa_response
from ibacm.wire.path_record import PathRecord
from tests.conftest import not_applicable_if
from tests.fabric.hw.fake_umad import FakeUmad, SentMad, port_info
from tests.fabric.hw.fake_verbs import FakeError, FakeHandles, FakeHca, FakeLibVerbs
from tests.fabric.hw.fake_verbs import PortState as FakePort


def verbs_device(hca: FakeHca, umad: FakeUmad | None = None) -> HwDevice:
    return HwDevice(
        hca.pyverbs(),
        cast(LibVerbs, FakeLibVerbs(hca)),
        cast(VerbsHandles, FakeHandles(hca)),
        hca.context("mlx5_0"),
        umad or FakeUmad(),
    )


def echo_sa(umad: FakeUmad, sent: SentMad) -> None:
    umad.deliver(build_sa_response(SaMad.decode(sent.mad), 0, bytes(64)))


# -- verbs devices ---------------------------------------------------------------------------


@pytest.mark.trio
async def test_verbs_port_query_reads_the_gid_and_pkey_tables() -> None:
    hca = FakeHca()
    hca.ports[0].gids.append("fe80:0000:0000:0000:0002:c903:0001:0099")
    device = verbs_device(hca)
    assert (device.name, device.phys_port_cnt) == ("mlx5_0", 1)
    assert device.node_guid == 0x0002C90300010000
    attrs = await device.port(1).query()
    # Two GIDs: the table ends at the first one without an interface ID.
    assert [gid.hex() for gid in attrs.gids] == [
        "fe800000000000000002c90300010003",
        "fe800000000000000002c90300010099",
    ]
    assert attrs.pkeys == (0xFFFF, 0x8001)  # read big-endian
    assert (attrs.state, attrs.lid, attrs.active_mtu, attrs.subnet_timeout) == (
        PortState.ACTIVE,
        3,
        5,
        18,
    )
    with pytest.raises(FabricError, match=r"has no port 2 \(ports: 1\)"):
        device.port(2)
    await device.aclose()


@pytest.mark.trio
async def test_async_events_arrive_with_their_port_number() -> None:
    hca = FakeHca()
    hca.ports.append(FakePort(lid=4))
    device = verbs_device(hca)
    hca.raise_async(1, 0x7F00_1234_0000)  # a CQ error: not a port event, skipped
    hca.raise_async(11, 2)  # LID change on port 2
    hca.raise_async(17, 1)  # client reregister on port 1
    with trio.fail_after(2):
        first = await device.wait_event()
        second = await device.wait_event()
    assert first == PortEvent(2, PortEventType.LID_CHANGE)
    assert second == PortEvent(1, PortEventType.CLIENT_REREGISTER)
    await device.aclose()


@pytest.mark.trio
async def test_close_wakes_an_event_waiter_and_closes_the_context() -> None:
    hca = FakeHca()
    device = verbs_device(hca)
    async with trio.open_nursery() as nursery:

        async def waiter() -> None:
            with pytest.raises(trio.ClosedResourceError):
                await device.wait_event()

        nursery.start_soon(waiter)
        await trio.sleep(0.01)
        await device.aclose()
    assert hca.closed[-2:] == ["PD", "Context"]


@pytest.mark.trio
async def test_verbs_port_sends_sa_mads_through_its_umad_agent() -> None:
    umad = FakeUmad(responder=echo_sa)
    device = verbs_device(FakeHca(), umad)
    reply = await device.port(1).sa_send(
        build_path_get(3, PathRecord(dlid=2)), SaDestination(1, 0, 0), timeout_ms=500, retries=1
    )
    assert SaMad.decode(reply).mad.tid & 0xFFFFFFFF == 3
    assert umad.opened == {1024: ("mlx5_0", 1)}
    await device.aclose()
    assert umad.closed == [1024]


@pytest.mark.trio
async def test_verbs_port_starts_sa_calls_that_end_as_their_reply_is_read() -> None:
    umad = FakeUmad(responder=echo_sa, pollable=True)
    device = verbs_device(FakeHca(), umad)
    port = device.port(1)
    call = port.sa_start(
        build_path_get(4, PathRecord(dlid=2)), SaDestination(1, 0, 0), timeout_ms=500, retries=1
    )
    assert call is not None and not call.ended  # sent, its reply not read yet
    assert (umad.sent[0].timeout_ms, umad.sent[0].retries) == (500, 1)  # the kernel retransmits
    replies: list[bytes] = []
    call.when_ended(lambda ended: replies.append(ended.result()))
    assert await call.wait() == replies[0]
    assert SaMad.decode(replies[0]).mad.tid & 0xFFFFFFFF == 4
    await device.aclose()
    umad.release()


@pytest.mark.trio
async def test_a_port_without_umad_has_no_sa_but_still_works() -> None:
    class NoUmad(FakeUmad):
        def open_port(self, ca_name: str, port_num: int) -> int:
            raise UmadError("umad_open_port(mlx5_0, 1) failed: ENODEV (19)")

    device = verbs_device(FakeHca(), NoUmad())
    assert (await device.port(1).query()).lid == 3
    with pytest.raises(SaSendError, match=r"no umad SA agent on mlx5_0 port 1: .*ENODEV"):
        await device.port(1).sa_send(
            build_path_get(3, PathRecord()), SaDestination(1, 0, 0), timeout_ms=10, retries=0
        )
    with pytest.raises(SaSendError, match=r"no umad SA agent on mlx5_0 port 1: .*ENODEV"):
        device.port(1).sa_start(
            build_path_get(3, PathRecord()), SaDestination(1, 0, 0), timeout_ms=10, retries=0
        )
    await device.aclose()


# -- umad-only devices -----------------------------------------------------------------------


def test_width_and_speed_follow_the_reported_rate() -> None:
    assert width_speed(10) == (2, 1)  # ibsim: 4x SDR
    assert width_speed(100) == (2, 32)
    assert width_speed(25) == (1, 32)
    assert width_speed(7) == (2, 1)


def test_umad_port_attributes() -> None:
    attrs = umad_port_attributes(port_info(lid=5, rate=10))
    assert (attrs.lid, attrs.sm_lid, attrs.active_mtu, attrs.active_width) == (5, 1, 4, 2)
    assert attrs.gids == (bytes.fromhex("fe800000000000000002c90300010005"),)
    assert attrs.sa_pkey_index() == 0


def test_port_changes_are_the_events_a_device_would_raise() -> None:
    up = umad_port_attributes(port_info())
    down = umad_port_attributes(port_info(state=PortState.DOWN))
    assert port_changes(up, down) == [PortEventType.PORT_ERR]
    assert port_changes(down, up) == [PortEventType.PORT_ACTIVE]
    assert port_changes(down, down) == []
    moved = umad_port_attributes(port_info(lid=9, sm_lid=7, pkeys=(0xFFFF,)))
    assert port_changes(up, moved) == [
        PortEventType.LID_CHANGE,
        PortEventType.GID_CHANGE,  # the port GUID of the fake follows the LID
        PortEventType.PKEY_CHANGE,
        PortEventType.SM_CHANGE,
    ]
    assert port_changes(up, up) == []


@pytest.mark.trio
async def test_umad_only_device_reports_port_changes_by_polling() -> None:
    umad = FakeUmad(ports={("ibsim0", 1): port_info("ibsim0")})
    device = UmadOnlyDevice(umad, umad.ca("ibsim0"), poll_interval=0.01)
    assert (device.name, device.phys_port_cnt) == ("ibsim0", 1)
    umad.ports[("ibsim0", 1)] = port_info("ibsim0", state=PortState.DOWN)
    with trio.fail_after(2):
        assert await device.wait_event() == PortEvent(1, PortEventType.PORT_ERR)
    umad.ports[("ibsim0", 1)] = port_info("ibsim0", sm_lid=1)
    with trio.fail_after(2):
        assert await device.wait_event() == PortEvent(1, PortEventType.PORT_ACTIVE)
    await device.aclose()


@pytest.mark.trio
async def test_umad_only_qp_has_no_data_path_but_keeps_group_membership() -> None:
    qp = (
        await UmadOnlyDevice(
            FakeUmad(ports={("ibsim0", 1): port_info("ibsim0")}),
            FakeUmad(ports={("ibsim0", 1): port_info("ibsim0")}).ca("ibsim0"),
        )
        .port(1)
        .open_ud(0, recv_depth=8)
    )
    assert isinstance(qp, NoDataPathQp)
    await qp.attach_mcast(bytes(16), 0xC001)
    assert qp.groups == {(bytes(16), 0xC001)}
    with pytest.raises(FabricError, match=r"umad-only .* no UD data path"):
        await qp.send(bytes(256), SimpleNamespace(), 0xFFFFFF)  # type: ignore[arg-type]
    with pytest.raises(FabricError, match=r"umad-only .* no UD data path"):
        qp.post(bytes(256), SimpleNamespace(), 0xFFFFFF)  # type: ignore[arg-type]
    served: list[list[ReceivedMad]] = []
    async with trio.open_nursery() as nursery:

        async def receiver() -> None:
            with pytest.raises(trio.ClosedResourceError):
                await qp.receive()

        nursery.start_soon(receiver)
        nursery.start_soon(qp.serve, served.append)  # returns once the QP is closed
        await trio.sleep(0.01)
        await qp.aclose()
    assert served == []


# -- HwFabric.open() -------------------------------------------------------------------------


def failing_loader() -> Pyverbs:
    raise PyverbsUnavailable("pyverbs is not importable (No module named 'pyverbs'): install ...")


def loader_with(entries: list[object], hca: FakeHca) -> Callable[[], Pyverbs]:
    def load() -> Pyverbs:
        pv = hca.pyverbs()
        pv.device.get_device_list = lambda: entries
        return pv

    return load


@pytest.mark.trio
async def test_open_without_pyverbs_is_one_no_devices_line() -> None:
    fabric = HwFabric(pyverbs_loader=failing_loader, umad_factory=lambda: FakeUmad())
    with pytest.raises(NoDevicesError) as raised:
        await fabric.open()
    assert "\n" not in str(raised.value) and "pyverbs" in str(raised.value)


@pytest.mark.trio
async def test_open_with_only_ethernet_devices_finds_no_infiniband() -> None:
    hca = FakeHca()
    hca.ports[0].link_layer = 2  # RoCE
    fabric = HwFabric(
        pyverbs_loader=loader_with([SimpleNamespace(name=b"mlx5_0")], hca),
        umad_factory=lambda: FakeUmad(),
    )
    with pytest.raises(NoDevicesError, match=r"1 RDMA device\(s\), none with an InfiniBand port"):
        await fabric.open()
    assert hca.closed == ["Context"]


@pytest.mark.trio
async def test_open_without_libibumad_is_one_no_devices_line() -> None:
    def no_umad() -> UmadApi:
        raise UmadError("cannot load libibumad.so.3 (not found): install libibumad3 (rdma-core)")

    with pytest.raises(NoDevicesError, match="no InfiniBand access: cannot load libibumad"):
        await HwFabric(umad_factory=no_umad).open()


@pytest.mark.trio
@not_applicable_if(os.path.exists("/sys/class/infiniband"), "this host has RDMA devices")
async def test_open_on_this_host_without_devices_says_so() -> None:
    """The real pyverbs and libibumad of a machine without InfiniBand."""
    with pytest.raises(NoDevicesError) as raised:
        await HwFabric().open()
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(("no InfiniBand device found", "pyverbs is not importable"))


@pytest.mark.trio
async def test_umad_only_fabric_lists_umad_cas() -> None:
    umad = FakeUmad(ports={("ibsim0", 1): port_info("ibsim0")}, responder=echo_sa)
    fabric = HwFabric(mode=HwMode.UMAD_ONLY, umad_factory=lambda: umad)
    devices = await fabric.open()
    assert [device.name for device in devices] == ["ibsim0"]
    port = devices[0].port(1)
    attrs = await port.query()
    reply = await port.sa_send(
        build_path_get(5, PathRecord(dlid=2)),
        SaDestination(attrs.sm_lid, attrs.sm_sl, attrs.sa_pkey_index()),
        timeout_ms=500,
        retries=0,
    )
    assert SaMad.decode(reply).mad.tid & 0xFFFFFFFF == 5
    call = port.sa_start(
        build_path_get(6, PathRecord(dlid=2)),
        SaDestination(attrs.sm_lid, attrs.sm_sl, attrs.sa_pkey_index()),
        timeout_ms=500,
        retries=0,
    )
    assert call is not None
    assert SaMad.decode(await call.wait()).mad.tid & 0xFFFFFFFF == 6
    assert fabric.hostname
    await fabric.aclose()
    empty = HwFabric(mode=HwMode.UMAD_ONLY, umad_factory=lambda: FakeUmad())
    with pytest.raises(NoDevicesError, match="through libibumad"):
        await empty.open()


def test_fake_error_is_what_pyverbs_raises() -> None:
    assert FakeHca().pyverbs().Error is FakeError

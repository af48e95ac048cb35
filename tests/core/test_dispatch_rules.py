"""Dispatcher rules of client-protocol.md §5-§8, request bytes in, reply bytes out, no sockets.

The core runs on the simulated fabric with the test provider; ``Dispatcher.handle`` gets the
framed request exactly as the connection code would hand it over.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
import trio

from ibacm.core.dispatch import CoreError, plan_address_form
from ibacm.core.model import AddressSlot, all_addresses
from ibacm.fabric.sim.topo_file import generate
from ibacm.provider.api import Counter
from ibacm.wire.client import (
    HDR_LEN,
    AcmHdr,
    AcmMessage,
    AcmOp,
    AcmStatus,
    AddrType,
    EpAddr,
    EpConfig,
    EpFlag,
    decode_ep_reply,
    decode_perf_reply,
    encode_ep_request,
    encode_perf_request,
)
from ibacm.wire.path_record import PathRecord
from tests.core.support import Core, sim_core

IP_DEST = EpAddr.from_ip("10.0.0.1", EpFlag.DEST)


def resolve_frame(entries: Sequence[EpAddr], tid: int = 0) -> bytes:
    return AcmMessage(AcmHdr(opcode=AcmOp.RESOLVE, tid=tid), list(entries)).encode()


def reply_of(data: bytes) -> AcmMessage:
    return AcmMessage.decode(data)


async def ask(core: Core, frame: bytes) -> bytes:
    return await core.dispatcher.handle(frame, "test")


def core_error(reply: bytes, status: AcmStatus) -> None:
    """A core-detected RESOLVE error: opcode 0x81, the status, bare 16-byte header."""
    hdr = AcmHdr.decode(reply)
    assert (hdr.opcode, hdr.status, hdr.length, len(reply)) == (0x81, status, 16, 16)


def path_entry(path: PathRecord, flags: int = 0) -> EpAddr:
    return EpAddr.from_path(path, flags)


# -- validation of the address form, without any fabric -------------------------------------


@pytest.mark.parametrize(
    ("entries", "status"),
    [
        ([], AcmStatus.EDESTTYPE),
        ([EpAddr.from_ip("10.0.0.1", EpFlag.SOURCE)], AcmStatus.EDESTTYPE),
        (
            [
                EpAddr.from_ip("10.0.0.1", EpFlag.SOURCE),
                EpAddr.from_ip("10.0.0.2", EpFlag.SOURCE),
                IP_DEST,
            ],
            AcmStatus.ESRCADDR,
        ),
        ([EpAddr(EpFlag.SOURCE, 0), IP_DEST], AcmStatus.ESRCTYPE),
        ([EpAddr(EpFlag.SOURCE, 6), IP_DEST], AcmStatus.ESRCTYPE),
        ([IP_DEST, EpAddr.from_ip("10.0.0.2", EpFlag.DEST)], AcmStatus.EDESTADDR),
        ([EpAddr(EpFlag.DEST, 0)], AcmStatus.EDESTTYPE),
        ([EpAddr(EpFlag.DEST, AddrType.PATH)], AcmStatus.EDESTTYPE),
        # The first offending entry decides; SOURCE is checked before DEST in an entry.
        ([EpAddr(EpFlag.DEST, 0), EpAddr(EpFlag.SOURCE, 0)], AcmStatus.EDESTTYPE),
        ([EpAddr(EpFlag.SOURCE | EpFlag.DEST, 0)], AcmStatus.ESRCTYPE),
        # No SOURCE: the daemon finds one for an IP address or a name, not for a LID.
        ([EpAddr.from_lid(5, EpFlag.DEST)], AcmStatus.EDESTTYPE),
        # 8 entries and no SOURCE: C wrote a 9th entry past its buffer.
        ([IP_DEST] + [EpAddr(0, AddrType.NAME)] * 7, AcmStatus.EINVAL),
    ],
)
def test_address_form_validation(entries: list[EpAddr], status: AcmStatus) -> None:
    message = AcmMessage(AcmHdr(opcode=AcmOp.RESOLVE), entries)
    with pytest.raises(CoreError) as caught:
        plan_address_form(message)
    assert caught.value.status == status


def test_entries_without_flags_are_ignored() -> None:
    message = AcmMessage(
        AcmHdr(opcode=AcmOp.RESOLVE),
        [EpAddr(0, 0), EpAddr.from_name("a", EpFlag.SOURCE), EpAddr(0, 99), IP_DEST],
    )
    plan = plan_address_form(message)
    assert (plan.src_index, plan.dst_index) == (1, 3)


# -- RESOLVE through the dispatcher -----------------------------------------------------------


@pytest.mark.trio
async def test_core_errors_are_0x81_and_counted(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        reply = await ask(core, resolve_frame([EpAddr(EpFlag.DEST, 0)], tid=0x1122))
        core_error(reply, AcmStatus.EDESTTYPE)
        assert AcmHdr.decode(reply).tid == 0x1122
        # A valid but unknown source.
        unknown = EpAddr.from_ip("10.9.9.9", EpFlag.SOURCE)
        core_error(await ask(core, resolve_frame([unknown, IP_DEST])), AcmStatus.ESRCADDR)
        # GID sources pass validation but can never be local.
        gid = EpAddr.from_gid("fe80::1", EpFlag.SOURCE)
        core_error(await ask(core, resolve_frame([gid, IP_DEST])), AcmStatus.ESRCADDR)
        counts = core.counters.snapshot()
        assert counts[Counter.RESOLVE] == 3
        assert counts[Counter.ERROR] == 3
        assert counts[Counter.NODATA] == 0


@pytest.mark.trio
async def test_length_16_request_has_no_destination(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        frame = AcmHdr(opcode=AcmOp.RESOLVE, length=HDR_LEN).encode()
        core_error(await ask(core, frame), AcmStatus.EDESTTYPE)


@pytest.mark.trio
async def test_resolve_with_source_supplied(tmp_path: Path) -> None:
    async with sim_core(tmp_path, addr_lines=["node1 mlx5_0 1 default"]) as core:
        source = EpAddr.from_name("NODE1", EpFlag.SOURCE)  # names match in any case
        dest = EpAddr.from_ip("10.0.0.1", EpFlag.DEST)
        reply = reply_of(await ask(core, resolve_frame([source, dest], tid=7)))
        # Provider replies keep opcode 0x01 (C quirk); one PATH entry, data[0..2] zero.
        hdr = reply.hdr
        assert (hdr.opcode, hdr.status, hdr.length, hdr.tid) == (0x01, 0, 88, 7)
        assert (hdr.data0, hdr.data1, hdr.data2) == (0, 0, 0)
        assert (reply.entries[0].flags, reply.entries[0].type) == (0x2B, AddrType.PATH)
        path = reply.entries[0].path()
        lid = core.world.node("node1").lids[0]
        assert (path.dlid, path.slid, path.pkey) == (lid, lid, 0xFFFF)


@pytest.mark.trio
async def test_server_chosen_source_is_appended(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        reply = reply_of(await ask(core, resolve_frame([EpAddr.from_ip("10.0.0.1", EpFlag.DEST)])))
        assert reply.hdr.length == 160
        assert reply.entries[1] == EpAddr.from_ip("10.0.0.1", EpFlag.SOURCE)
        reply = reply_of(await ask(core, resolve_frame([EpAddr.from_ip("fd00::1", EpFlag.DEST)])))
        assert reply.entries[1] == EpAddr.from_ip("fd00::1", EpFlag.SOURCE)


@pytest.mark.trio
async def test_source_selection_failures_are_acm_statuses(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        # No route and no on-link endpoint: EDESTADDR, not C's raw errno 101.
        far = EpAddr.from_ip("192.0.2.7", EpFlag.DEST)
        core_error(await ask(core, resolve_frame([far])), AcmStatus.EDESTADDR)
        # On-link for 10.0.0.1/16: the endpoint address is the source; the provider decides.
        near = EpAddr.from_ip("10.0.0.2", EpFlag.DEST | EpFlag.NODELAY)
        reply = AcmHdr.decode(await ask(core, resolve_frame([near])))
        assert (reply.opcode, reply.status) == (0x01, AcmStatus.ENODATA)
        assert core.counters.snapshot()[Counter.NODATA] == 1


@pytest.mark.trio
async def test_ipv6_link_local_destination_uses_the_link_local_endpoint(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        link_local = EpAddr.from_ip("fe80::2", EpFlag.DEST)
        core_error(await ask(core, resolve_frame([link_local])), AcmStatus.EDESTADDR)
        core.world.add_address("node1", "ib0", "fe80::1/64")
        with trio.fail_after(5):
            while not any("fe80::1" in a.core.display for a in _addresses(core)):
                await trio.sleep(0.01)
        message = resolve_frame([EpAddr.from_ip("fe80::1", EpFlag.DEST)])
        reply = reply_of(await ask(core, message))
        assert reply.hdr.status == 0
        assert reply.entries[1] == EpAddr.from_ip("fe80::1", EpFlag.SOURCE)


def _addresses(core: Core) -> list[AddressSlot]:
    return list(all_addresses(core.topology.devices))


# -- path form ---------------------------------------------------------------------------------


@pytest.mark.trio
async def test_path_form_rules(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        node1, node2 = core.world.node("node1"), core.world.node("node2")
        # Entry 0 is a PATH but the request is shorter than 88 bytes: EINVAL.
        short = AcmHdr(opcode=AcmOp.RESOLVE, length=80).encode()
        short += path_entry(PathRecord(dlid=node2.lids[0])).encode()[:64]
        core_error(await ask(core, short), AcmStatus.EINVAL)
        # Neither DLID nor DGID: EDESTADDR.
        core_error(await ask(core, resolve_frame([path_entry(PathRecord())])), AcmStatus.EDESTADDR)
        # An SGID that is not ours: no local endpoint.
        foreign = PathRecord(sgid=node2.gids[0], dlid=node2.lids[0])
        core_error(await ask(core, resolve_frame([path_entry(foreign)])), AcmStatus.ESRCADDR)
        # A partition the port does not have.
        other = PathRecord(dlid=node2.lids[0], pkey=0x8123)
        core_error(await ask(core, resolve_frame([path_entry(other)])), AcmStatus.ESRCADDR)
        # By LID: the SA of the simulated fabric answers through the core's SA path.
        by_lid = PathRecord(slid=node1.lids[0], dlid=node2.lids[0], reversible=True, numb_path=1)
        frame = bytearray(resolve_frame([path_entry(by_lid)]))
        frame[3:6] = b"\x01\x05\x07"  # data[0..2] must be ignored (C defect 8)
        reply = reply_of(await ask(core, bytes(frame)))
        assert (reply.hdr.opcode, reply.hdr.status, reply.hdr.length) == (0x01, 0, 88)
        assert (reply.hdr.data0, reply.hdr.data1, reply.hdr.data2) == (0, 0, 0)
        path = reply.entries[0].path()
        assert (path.dlid, path.slid, path.dgid) == (node2.lids[0], node1.lids[0], node2.gids[0])


@pytest.mark.trio
async def test_query_sa_echoes_and_skips_error_counters(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        node1, node2 = core.world.node("node1"), core.world.node("node2")
        record = PathRecord(sgid=node1.gids[0], dgid=node2.gids[0], reversible=True, numb_path=1)
        entry = path_entry(record, EpFlag.QUERY_SA)
        # Length must be exactly 88: the request comes back with its own length.
        long = resolve_frame([entry, EpAddr(0, 0)])
        reply = await ask(core, long)
        hdr = AcmHdr.decode(reply)
        assert (hdr.opcode, hdr.status, hdr.length, len(reply)) == (
            0x81,
            AcmStatus.EINVAL,
            160,
            160,
        )
        assert reply[HDR_LEN:] == long[HDR_LEN:]
        # A good one: SA status 0 and the SA's record in entry 0.
        reply = await ask(core, resolve_frame([entry], tid=99))
        answer = reply_of(reply)
        assert (answer.hdr.opcode, answer.hdr.status, answer.hdr.length, answer.hdr.tid) == (
            0x81,
            0,
            88,
            99,
        )
        assert answer.entries[0].flags == EpFlag.QUERY_SA
        assert answer.entries[0].path().dlid == node2.lids[0]
        # Unknown source GID: ESRCADDR, echoed.
        stray = path_entry(PathRecord(sgid=node2.gids[0], dlid=1), EpFlag.QUERY_SA)
        assert AcmHdr.decode(await ask(core, resolve_frame([stray]))).status == AcmStatus.ESRCADDR
        counts = core.counters.snapshot()
        assert counts[Counter.RESOLVE] == 3
        assert counts[Counter.ERROR] == counts[Counter.NODATA] == 0


@pytest.mark.trio
async def test_path_form_skips_an_endpoint_without_addresses(tmp_path: Path) -> None:
    """C gave up on the port when its first partition-matching endpoint had no address."""
    topology = generate(1, pkeys=(0xFFFF, 0x8001))
    lines = ["extra mlx5_0 1 0x8001"]
    async with sim_core(tmp_path, topology=topology, addr_lines=lines) as core:
        port = core.topology.devices[0].ports[0]
        assert [hex(ep.pkey) for ep in port.endpoints] == ["0x8001", "0xffff"]
        newest = port.endpoints[0]
        for slot in newest.addresses():
            newest.remove(slot)
        lid = core.world.node("node1").lids[0]
        reply = reply_of(await ask(core, resolve_frame([path_entry(PathRecord(dlid=lid))])))
        assert reply.hdr.status == 0
        assert reply.entries[0].path().pkey == 0xFFFF


# -- PERF_QUERY / EP_QUERY -------------------------------------------------------------------


@pytest.mark.trio
async def test_perf_query_forms(tmp_path: Path) -> None:
    async with sim_core(tmp_path, topology=generate(2, hcas_per_node=2, ports_per_hca=2)) as core:
        await ask(core, resolve_frame([EpAddr(EpFlag.DEST, 0)]))
        glob = decode_perf_reply(await ask(core, encode_perf_request(tid=5)))
        assert (glob.hdr.opcode, glob.hdr.status, glob.hdr.data0, glob.hdr.tid) == (0x82, 0, 7, 5)
        assert glob.counters == [1, 1, 0, 0, 0, 0, 0]
        # By index: the N-th endpoint overall (C counted only ports numbered N).
        for index in (1, 2, 3, 4):
            reply = decode_perf_reply(await ask(core, encode_perf_request(index)))
            assert (reply.hdr.status, reply.hdr.data1, len(reply.counters)) == (0, index, 7)
        missing = await ask(core, encode_perf_request(5))
        hdr = AcmHdr.decode(missing)
        assert (hdr.opcode, hdr.status, hdr.length, hdr.data0, hdr.data1) == (
            0x82,
            AcmStatus.ESRCADDR,
            16,
            0,
            5,
        )
        # By address, and the "entry without SOURCE means global" rule.
        mine = EpAddr.from_ip("10.1.0.1", EpFlag.SOURCE)
        assert decode_perf_reply(await ask(core, encode_perf_request(0, mine))).hdr.status == 0
        theirs = EpAddr.from_ip("10.1.0.2", EpFlag.SOURCE)
        refused = await ask(core, encode_perf_request(0, theirs))
        assert AcmHdr.decode(refused).status == AcmStatus.ESRCADDR
        not_source = EpAddr.from_ip("10.1.0.2", 0)
        counted = decode_perf_reply(await ask(core, encode_perf_request(3, not_source)))
        assert counted.counters == core.counters.snapshot()[:7]  # the C counters only


@pytest.mark.trio
async def test_a_perf_reply_carries_the_c_counters_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Debian's ib_acme -P dies of SIGSEGV on a reply with more than ACM_MAX_COUNTER counters:
    a provider that counts more (as one of ours may) still answers those seven."""
    async with sim_core(tmp_path) as core:
        monkeypatch.setattr(core.provider, "query_perf", lambda ctx: list(range(1, 10)))
        reply = decode_perf_reply(await ask(core, encode_perf_request(1)))
        assert (reply.hdr.status, reply.hdr.data0, reply.hdr.length) == (0, 7, 16 + 8 * 7)
        assert reply.counters == [1, 2, 3, 4, 5, 6, 7]


def _ep(core_reply: bytes) -> tuple[AcmHdr, EpConfig | None]:
    return decode_ep_reply(core_reply)


@pytest.mark.trio
async def test_ep_query_order_and_filter(tmp_path: Path) -> None:
    """Devices in reverse order, ports by number, endpoints newest first (behavior.md §3.6)."""
    topology = generate(2, hcas_per_node=2, ports_per_hca=2, pkeys=(0xFFFF, 0x8001))
    lines = [f"n{d}{p} mlx5_{d} {p} 0x8001" for d in (0, 1) for p in (1, 2)]
    async with sim_core(tmp_path, topology=topology, addr_lines=lines) as core:
        seen = []
        for index in range(1, 9):
            hdr, config = _ep(await ask(core, encode_ep_request(index)))
            assert hdr.status == 0 and config is not None
            assert (hdr.opcode, hdr.data0) == (0x83, index)
            seen.append((config.port_num, hex(config.pkey), config.addrs[0]))
        assert seen == [
            (1, "0x8001", "n11"),
            (1, "0xffff", "10.2.0.1/16"),
            (2, "0x8001", "n12"),
            (2, "0xffff", "10.3.0.1/16"),
            (1, "0x8001", "n01"),
            (1, "0xffff", "10.0.0.1/16"),
            (2, "0x8001", "n02"),
            (2, "0xffff", "10.1.0.1/16"),
        ]
        hdr, config = _ep(await ask(core, encode_ep_request(3, 2)))
        assert config is not None and (config.port_num, config.addrs) == (2, ["n02"])
        assert config.prov_name == "testprov" and config.phys_port_cnt == 2
        for index, port in ((9, 0), (0, 0), (5, 2), (1, 3)):
            hdr, config = _ep(await ask(core, encode_ep_request(index, port)))
            assert (hdr.status, hdr.length, config) == (AcmStatus.EINVAL, 16, None)


@pytest.mark.trio
async def test_ep_query_addresses_in_slot_order(tmp_path: Path) -> None:
    lines = ["node1 mlx5_0 1 default", "node1-1 mlx5_0 1 0xffff"]
    async with sim_core(tmp_path, addr_lines=lines) as core:
        _, config = _ep(await ask(core, encode_ep_request(1)))
        assert config is not None
        assert config.addrs == ["10.0.0.1/16", "fd00::1/64", "node1", "node1-1"]
        assert config.dev_guid == core.topology.devices[0].core.node_guid


@pytest.mark.trio
async def test_undersized_resolve_gets_einval(tmp_path: Path) -> None:
    async with sim_core(tmp_path) as core:
        head = bytes([1, 1, 0, 0, 0, 0, 8, 0])
        reply = core.dispatcher.undersized_resolve(head)
        assert reply is not None
        core_error(reply, AcmStatus.EINVAL)
        assert core.dispatcher.undersized_resolve(bytes([1, 2, 0, 0, 0, 0, 0, 8])) is None
        assert core.counters.snapshot()[Counter.RESOLVE] == 1

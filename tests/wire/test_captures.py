"""Real client requests (captures/client-requests): decoded, re-encoded byte for byte.

Each capture is checked three ways: our codec re-encodes it exactly; our decoding agrees with
the capture tool's own decoded line in the ``.hex`` file; and the meaning the capture README
states for the command holds (e.g. ``ib_acme -d 1.2.3.4`` -> one DEST IP 1.2.3.4 entry).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ibacm.wire.client import (
    AcmHdr,
    AcmMessage,
    AcmOp,
    AddrType,
    ClientFramer,
    EpAddr,
    EpFlag,
    PerfScope,
    decode_ep_request,
    decode_perf_request,
    encode_ep_request,
    encode_perf_request,
)
from ibacm.wire.path_record import gid_to_text
from tests.conftest import CAPTURES, require_file

CAPTURE_FILES = sorted(CAPTURES.glob("*.bin")) if CAPTURES.is_dir() else []


def capture(name: str) -> bytes:
    return require_file(CAPTURES / f"{name}.bin").read_bytes()


def reencode(data: bytes) -> bytes:
    op = data[1] & 0x0F
    if op == AcmOp.RESOLVE:
        return AcmMessage.decode(data).encode()
    if op == AcmOp.PERF_QUERY:
        request = decode_perf_request(data)
        return encode_perf_request(request.index, request.source, request.hdr.tid)
    request_ep = decode_ep_request(data)
    return encode_ep_request(request_ep.index, request_ep.port, request_ep.hdr.tid)


def hex_annotations(path: Path) -> tuple[dict[str, str], list[dict[str, str]]]:
    """The capture tool's decoded header fields and per-entry fields."""
    header: dict[str, str] = {}
    entries: list[dict[str, str]] = []
    for line in path.with_suffix(".hex").read_text().splitlines():
        if line.startswith("hdr:"):
            header = dict(re.findall(r"(\w+)=(\S+)", line))
        elif line.strip().startswith("ep["):
            entries.append(dict(re.findall(r"(\w+)=(\S+)", line)))
    return header, entries


def test_captures_are_present() -> None:
    require_file(CAPTURES / "README.md")
    assert len(CAPTURE_FILES) >= 50


@pytest.mark.parametrize("path", CAPTURE_FILES, ids=lambda p: p.stem)
def test_capture_roundtrips_and_matches_annotation(path: Path) -> None:
    data = path.read_bytes()
    assert reencode(data) == data

    framer = ClientFramer()
    framer.feed(data)
    assert framer.next_frame() == data
    assert framer.next_frame() is None and framer.buffered == 0

    header, entries = hex_annotations(path)
    hdr = AcmHdr.decode(data)
    assert hdr.version == int(header["version"])
    assert hdr.opcode == int(header["opcode"].split("(")[0], 16)
    assert hdr.status == int(header["status"])
    assert bytes((hdr.data0, hdr.data1, hdr.data2)).hex() == header["data"]
    assert hdr.tid == int(header["tid"], 16)
    wire_length = header["length_le"] if hdr.op == AcmOp.RESOLVE else header["length_be"]
    assert hdr.length == int(wire_length) == int(header["total_bytes"]) == len(data)

    decoded_entries: list[EpAddr] = []
    if hdr.op == AcmOp.RESOLVE:
        decoded_entries = AcmMessage.decode(data).entries
    elif hdr.op == AcmOp.PERF_QUERY:
        source = decode_perf_request(data).source
        decoded_entries = [] if source is None else [source]
    assert len(decoded_entries) == len(entries)
    for entry, expected in zip(decoded_entries, entries, strict=True):
        check_entry(entry, expected)


def check_entry(entry: EpAddr, expected: dict[str, str]) -> None:
    assert entry.flags == int(expected["flags"], 16)
    assert entry.type == int(expected["type"].split("(")[0], 16)
    if "addr" in expected:
        assert entry.address_text() == expected["addr"]
    if "name" in expected:
        assert entry.address_text() == expected["name"]
    if entry.type == AddrType.PATH:
        path = entry.path()
        assert path.service_id == int(expected["service_id"], 16)
        assert gid_to_text(path.dgid) == expected["dgid"]
        assert gid_to_text(path.sgid) == expected["sgid"]
        assert (path.dlid, path.slid) == (int(expected["dlid"]), int(expected["slid"]))
        assert path.flowlabel_hoplimit == int(expected["flowlabel_hoplimit"], 16)
        assert path.tclass == int(expected["tclass"])
        assert path.reversible_numpath == int(expected["reversible_numpath"], 16)
        assert path.pkey == int(expected["pkey"], 16)
        assert path.qosclass_sl == int(expected["qosclass_sl"], 16)
        assert path.mtu_byte == int(expected["mtu"], 16)
        assert path.rate_byte == int(expected["rate"], 16)
        assert path.packetlifetime_byte == int(expected["packetlifetime"], 16)
        assert path.preference == int(expected["preference"])


# -- what the README says each command sends ---------------------------------------------


def test_ib_acme_d_ip() -> None:
    message = AcmMessage.decode(capture("d_ip_001"))
    assert message.hdr.length == 88 and capture("d_ip_001")[6:8] == b"\x58\x00"
    (entry,) = message.entries
    assert (entry.flags, entry.type, entry.address_text()) == (
        EpFlag.DEST,
        AddrType.IP,
        "1.2.3.4",
    )
    assert entry.info == bytes((1, 2, 3, 4)) + bytes(60)
    assert capture("tcp_d_ip_001") == capture("d_ip_001") == capture("close_d_ip_001")


def test_ib_acme_d_ip_nodelay() -> None:
    (entry,) = AcmMessage.decode(capture("d_ip_c_001")).entries
    assert entry.flags == EpFlag.DEST | EpFlag.NODELAY == 0x40000002


def test_ib_acme_d_ip6() -> None:
    (entry,) = AcmMessage.decode(capture("d_ip6_001")).entries
    assert (entry.type, entry.address_text()) == (AddrType.IP6, "fe80::5")


def test_ib_acme_names() -> None:
    message = AcmMessage.decode(capture("d_name_001"))
    assert message.hdr.length == 160
    source, dest = message.entries
    assert (source.flags, source.type, source.address_text()) == (
        EpFlag.SOURCE,
        AddrType.NAME,
        "node1",
    )
    assert (dest.flags, dest.type, dest.address_text()) == (EpFlag.DEST, AddrType.NAME, "node5")
    assert EpAddr.from_name("node5", EpFlag.DEST) == dest


def test_ib_acme_source_dest_then_query_sa() -> None:
    first = AcmMessage.decode(capture("d_ip_src_v_001"))
    assert [e.address_text() for e in first.entries] == ["10.0.0.1", "1.2.3.4"]
    (verify,) = AcmMessage.decode(capture("d_ip_src_v_002")).entries
    assert verify.type == AddrType.PATH and verify.flags == EpFlag.QUERY_SA
    assert verify.path().dlid == 2


def test_ib_acme_path_by_lid_and_verify() -> None:
    (entry,) = AcmMessage.decode(capture("d_lid_v_001")).entries
    path = entry.path()
    assert (entry.flags, path.slid, path.dlid, path.reversible_numpath) == (0, 1, 5, 0x81)
    (verify,) = AcmMessage.decode(capture("d_lid_v_002")).entries
    assert verify.flags == EpFlag.QUERY_SA
    assert (verify.path().mtu_byte, verify.path().rate_byte) == (0x84, 0x83)


def test_ib_acme_path_by_gid() -> None:
    path = AcmMessage.decode(capture("d_gid_001")).entries[0].path()
    assert (gid_to_text(path.sgid), gid_to_text(path.dgid)) == ("fe80::1", "fe80::2")
    assert (path.slid, path.dlid) == (0, 0)


def test_perf_queries() -> None:
    for name in ("P_001", "close_P_001", "portfile_001", "portfile_002"):
        data = capture(name)
        assert data[6:8] == b"\x00\x10"  # big-endian length
        assert decode_perf_request(data).scope is PerfScope.GLOBAL
    assert [decode_perf_request(capture(n)).index for n in ("P_all_001", "P_all_002")] == [1, 2]
    assert decode_perf_request(capture("P_all_002")).scope is PerfScope.INDEX
    by_address = decode_perf_request(capture("P_s_001"))
    assert by_address.scope is PerfScope.ADDRESS
    assert by_address.source is not None
    assert by_address.source.address_text() == "192.168.100.1"


def test_ep_queries_walk_index_and_port() -> None:
    request = decode_ep_request(capture("e_010"))
    assert (request.index, request.port) == (2, 9)
    assert (
        decode_ep_request(capture("e_001")).index,
        decode_ep_request(capture("e_001")).port,
    ) == (
        1,
        1,
    )


def test_librdmacm_requests() -> None:
    for name in ("rdmacm_gai_001", "rdmacm_sysfs_001", "rdmacm_preload_default_path_001"):
        (entry,) = AcmMessage.decode(capture(name)).entries
        assert (entry.flags, entry.address_text()) == (EpFlag.DEST, "127.0.0.1")
    (numeric,) = AcmMessage.decode(capture("rdmacm_gai_002")).entries
    assert numeric.flags == EpFlag.DEST | EpFlag.NODELAY


def test_rdma_core_v59_is_byte_identical_to_v44() -> None:
    assert capture("v59_001") == capture("P_001")
    assert capture("v59_002") == capture("d_lid_v_001")
    assert capture("v59_003") == capture("d_lid_v_002")
    assert capture("v59_004") == capture("e_001")

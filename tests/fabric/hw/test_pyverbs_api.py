"""The backend's use of pyverbs, checked against the real library (no device needed).

Debian's python3-pyverbs is imported from the distribution directory; the attribute objects
the backend builds (address handles with a GRH, UD QP attributes, work requests) are built
for real and read back, and the C-layout assumptions behind ``verbs_handles`` are checked on
pyverbs objects that need no device.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from ibacm.fabric.api import ACM_QKEY, AddressVector, LinkLayer, PortEventType, PortState
from ibacm.fabric.hw import verbs_attrs as attrs
from ibacm.fabric.hw.pyverbs_loader import DISTRO_DIRS, Pyverbs, PyverbsUnavailable, load_pyverbs
from ibacm.fabric.hw.verbs_handles import VerbsHandleError, VerbsHandles, _peek
from tests.conftest import REPO, missing

GID = bytes.fromhex("fe800000000000000002c9030001e3f1")


@pytest.fixture(scope="module")
def pv() -> Pyverbs:
    try:
        return load_pyverbs()
    except PyverbsUnavailable as exc:
        missing(f"real pyverbs is not installed (python3-pyverbs): {exc}")


def test_pyverbs_comes_from_the_distribution_without_widening_sys_path(pv: Pyverbs) -> None:
    code = (
        "import json, sys\n"
        "before = list(sys.path)\n"
        "from ibacm.fabric.hw.pyverbs_loader import load_pyverbs\n"
        "pv = load_pyverbs()\n"
        "print(json.dumps([sys.path == before, pv.device.__file__,\n"
        "                  sorted(m for m in sys.modules if m.split('.')[0] == 'pyverbs')]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    unchanged, device_file, modules = json.loads(out)
    assert unchanged  # only the pyverbs package was imported from the distribution
    # From the distribution directory (or a site-packages where pyverbs is installed).
    assert device_file.startswith(tuple(map(str, DISTRO_DIRS))) or "site-packages" in device_file
    assert "pyverbs.qp" in modules and "pyverbs.addr" in modules
    # Without devices the real library refuses to list them (what HwFabric reports).
    if not os.path.exists("/sys/class/infiniband"):
        with pytest.raises(pv.Error, match="Failed to get devices list"):
            pv.device.get_device_list()


def test_missing_pyverbs_is_one_clear_line() -> None:
    code = (
        "from ibacm.fabric.hw.pyverbs_loader import load_pyverbs, PyverbsUnavailable\n"
        "try:\n    load_pyverbs(search=[])\n"
        "except PyverbsUnavailable as exc:\n    print(exc)\n"
    )
    # A fresh interpreter: in this one pyverbs may already be imported.
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert out.count("\n") == 1
    assert "pyverbs is not importable" in out
    assert "python3-pyverbs" in out


def test_address_handle_always_carries_the_grh(pv: Pyverbs) -> None:
    av = AddressVector(
        dlid=0xC002,
        dgid=bytes.fromhex("ff154001ffff00030400000000000000"),
        sl=2,
        src_path_bits=1,
        static_rate=7,
        sgid_index=1,
        flow_label=0x12345,
        hop_limit=64,
        traffic_class=3,
    )
    ah = attrs.ah_attr(pv, av, port_num=2)
    assert isinstance(ah, pv.addr.AHAttr)
    assert ah.is_global == 1
    assert (ah.dlid, ah.sl, ah.src_path_bits, ah.static_rate, ah.port_num) == (0xC002, 2, 1, 7, 2)
    assert ah.dgid == "ff15:4001:ffff:0003:0400:0000:0000:0000"
    assert (ah.sgid_index, ah.flow_label, ah.hop_limit, ah.traffic_class) == (1, 0x12345, 64, 3)


def test_ud_qp_attributes_use_the_acm_qkey(pv: Pyverbs) -> None:
    state = attrs.ud_qp_attr(pv, port_num=1, pkey_index=5)
    assert isinstance(state, pv.qp.QPAttr)
    assert (state.qkey, state.pkey_index, state.port_num, state.sq_psn) == (ACM_QKEY, 5, 1, 0)
    init = attrs.qp_init_attr(pv, None, send_depth=32, recv_depth=1024)
    assert init.qp_type == pv.enums.IBV_QPT_UD
    assert (init.max_send_wr, init.max_recv_wr, init.max_send_sge, init.max_recv_sge) == (
        32,
        1024,
        1,
        1,
    )
    assert init.sq_sig_all == 1


def test_work_requests_point_at_296_and_256_byte_buffers(pv: Pyverbs) -> None:
    handles = VerbsHandles(pv.base.PyverbsCM)
    recv = attrs.recv_wr(pv, wr_id=7, address=0x10000, lkey=0x55)
    send = attrs.send_wr(pv, wr_id=1 << 32, address=0x20000, lkey=0x66)
    assert (recv.wr_id, recv.num_sge) == (7, 1)
    assert (send.wr_id, send.num_sge, send.opcode) == (1 << 32, 1, pv.enums.IBV_WR_SEND)
    assert send.send_flags == pv.enums.IBV_SEND_SIGNALED
    # The first C field of a PyverbsCM subclass is where VerbsHandles reads it: here the
    # ibv_recv_wr / ibv_send_wr structs themselves (wr_id, next, sg_list, num_sge).
    for wr, address, length, lkey in ((recv, 0x10000, 296, 0x55), (send, 0x20000, 256, 0x66)):
        base = id(wr) + pv.base.PyverbsCM.__basicsize__
        wr_id, _next, sg_list = (ctypes.c_uint64.from_address(base + 8 * i).value for i in range(3))
        assert wr_id == wr.wr_id
        sge = _peek(sg_list, 16)
        assert int.from_bytes(sge[0:8], sys.byteorder) == address
        assert int.from_bytes(sge[8:12], sys.byteorder) == length
        assert int.from_bytes(sge[12:16], sys.byteorder) == lkey
    sge = pv.wr.SGE(0x30000, 296, 9)
    assert _peek(handles._first_field(sge), 16)[:8] == (0x30000).to_bytes(8, sys.byteorder)


def test_handle_validation_refuses_objects_that_are_not_what_they_claim(pv: Pyverbs) -> None:
    handles = VerbsHandles(pv.base.PyverbsCM)
    fake_context = SimpleNamespace(cmd_fd=3, num_comp_vectors=1)
    with pytest.raises(VerbsHandleError, match="no C handle"):
        handles.context(fake_context)
    with pytest.raises(VerbsHandleError, match="not readable"):
        _peek(0x10, 8)
    # An object whose first C field is an ibv_sge, posing as a Context: refused, no crash.

    class PosingContext(pv.wr.SGE):  # type: ignore[name-defined,misc]
        cmd_fd = 12345
        num_comp_vectors = 1

    with pytest.raises(VerbsHandleError):
        handles.context(PosingContext(0x30000, 296, 9))


def test_pkey_query_results_are_big_endian(pv: Pyverbs) -> None:
    raw = int.from_bytes((0x8001).to_bytes(2, "big"), sys.byteorder)
    assert attrs.pkey_from_verbs(raw) == 0x8001
    assert attrs.pkey_from_verbs(0xFFFF) == 0xFFFF


def test_gid_text_round_trips_through_the_pyverbs_gid_class(pv: Pyverbs) -> None:
    gid = pv.addr.GID(attrs.gid_text(GID))
    assert attrs.gid_from_pyverbs(gid) == GID


def test_port_attributes_from_a_port_attr() -> None:
    attr = SimpleNamespace(
        state=4,
        lid=3,
        lmc=1,
        sm_lid=1,
        sm_sl=2,
        subnet_timeout=18,
        active_mtu=5,
        active_width=2,
        active_speed=32,
        link_layer=1,
    )
    port = attrs.port_attributes(1, attr, [GID], [0xFFFF, 0x8001])
    assert port.state == PortState.ACTIVE and port.active
    assert (port.lid, port.lid_mask, port.sm_lid, port.sm_sl) == (3, 0xFFFE, 1, 2)
    assert port.port_guid == 0x0002C9030001E3F1 and port.link_layer == LinkLayer.INFINIBAND
    assert port.sa_pkey_index() == 0


def test_received_mad_takes_the_source_from_the_grh() -> None:
    grh = bytes(8) + GID + bytes.fromhex("ff154001ffff00030400000000000000")
    mad = bytes([1, 0x2C, 1, 1]) + bytes(252)
    received = attrs.received_mad(
        grh + mad,
        byte_len=296,
        grh_present=True,
        slid=5,
        src_qp=0x48,
        dlid_path_bits=1,
        pkey_index=2,
    )
    assert received is not None
    assert received.mad == mad and received.sgid == GID
    assert received.dgid.hex() == "ff154001ffff00030400000000000000"
    assert (received.slid, received.src_qp, received.dlid_path_bits, received.pkey_index) == (
        5,
        0x48,
        1,
        2,
    )
    no_grh = attrs.received_mad(
        grh + mad, byte_len=296, grh_present=False, slid=5, src_qp=1, dlid_path_bits=0, pkey_index=0
    )
    assert no_grh is not None and no_grh.sgid == bytes(16)
    assert (
        attrs.received_mad(
            grh, byte_len=40, grh_present=True, slid=1, src_qp=1, dlid_path_bits=0, pkey_index=0
        )
        is None
    )


def test_async_events_keep_their_port() -> None:
    assert attrs.port_events(10, 2, 2) == [(2, PortEventType.PORT_ERR)]
    assert attrs.port_events(17, 1, 2) == [(1, PortEventType.CLIENT_REREGISTER)]
    assert attrs.port_events(13, 1, 1) == [(1, PortEventType.SM_CHANGE)]
    assert attrs.port_events(8, 0, 2) == [(1, PortEventType.PORT_ERR), (2, PortEventType.PORT_ERR)]
    assert attrs.port_events(1, 0x7F00_0000_1000, 2) == []  # a CQ event: not a port event
    assert attrs.port_events(9, 3, 2) == []  # no such port

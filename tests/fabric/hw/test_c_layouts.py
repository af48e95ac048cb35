"""The C struct layouts the ctypes bindings assume, checked against the installed headers.

``umad_port_t``/``umad_ca_t`` (libibumad, read by ``umad.py``) and the ``ibv_context``,
``ibv_comp_channel``, ``ibv_qp`` and ``ibv_async_event`` fields ``verbs_handles.py`` reads.
Needs a C compiler and the rdma-core development headers (libibumad-dev, libibverbs-dev);
skipped without them, failed under CI (``require_peer``, ``require_file``).
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

import pytest

from ibacm.fabric.hw import verbs_handles as vh
from ibacm.fabric.hw.umad import _CaStruct, _PortStruct
from tests.conftest import require_file, require_peer

PROGRAM = r"""
#include <stdio.h>
#include <stddef.h>
#include <infiniband/umad.h>
#include <infiniband/verbs.h>
#define P(name, value) printf("%s %zu\n", name, (size_t)(value))
int main(void) {
    P("port.size", sizeof(umad_port_t));
    P("port.base_lid", offsetof(umad_port_t, base_lid));
    P("port.state", offsetof(umad_port_t, state));
    P("port.rate", offsetof(umad_port_t, rate));
    P("port.gid_prefix", offsetof(umad_port_t, gid_prefix));
    P("port.port_guid", offsetof(umad_port_t, port_guid));
    P("port.pkeys_size", offsetof(umad_port_t, pkeys_size));
    P("port.pkeys", offsetof(umad_port_t, pkeys));
    P("port.link_layer", offsetof(umad_port_t, link_layer));
    P("ca.size", sizeof(umad_ca_t));
    P("ca.numports", offsetof(umad_ca_t, numports));
    P("ca.node_guid", offsetof(umad_ca_t, node_guid));
    P("ca.ports", offsetof(umad_ca_t, ports));
    P("ctx.cmd_fd", offsetof(struct ibv_context, cmd_fd));
    P("ctx.async_fd", offsetof(struct ibv_context, async_fd));
    P("ctx.num_comp_vectors", offsetof(struct ibv_context, num_comp_vectors));
    P("channel.context", offsetof(struct ibv_comp_channel, context));
    P("channel.fd", offsetof(struct ibv_comp_channel, fd));
    P("qp.context", offsetof(struct ibv_qp, context));
    P("qp.qp_num", offsetof(struct ibv_qp, qp_num));
    P("qp.qp_type", offsetof(struct ibv_qp, qp_type));
    P("event.size", sizeof(struct ibv_async_event));
    P("event.event_type", offsetof(struct ibv_async_event, event_type));
    P("IBV_QPT_UD", IBV_QPT_UD);
    return 0;
}
"""


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int]:
    compiler = require_peer("cc")
    for header in ("umad.h", "verbs.h"):  # libibumad-dev, libibverbs-dev
        require_file(Path("/usr/include/infiniband") / header)
    work = tmp_path_factory.mktemp("layout")
    (work / "layout.c").write_text(PROGRAM)
    subprocess.run(
        [compiler, "-o", str(work / "layout"), str(work / "layout.c")],
        check=True,
        capture_output=True,
    )
    out = subprocess.run([str(work / "layout")], check=True, capture_output=True, text=True)
    return {name: int(value) for name, value in (line.split() for line in out.stdout.splitlines())}


def test_umad_structs_match_libibumad(layout: dict[str, int]) -> None:
    assert ctypes.sizeof(_PortStruct) == layout["port.size"]
    for field in ("base_lid", "state", "rate", "gid_prefix", "port_guid", "pkeys_size", "pkeys"):
        assert getattr(_PortStruct, field).offset == layout[f"port.{field}"], field
    assert _PortStruct.link_layer.offset == layout["port.link_layer"]
    assert ctypes.sizeof(_CaStruct) == layout["ca.size"]
    for field in ("numports", "node_guid", "ports"):
        assert getattr(_CaStruct, field).offset == layout[f"ca.{field}"], field


def test_verbs_offsets_match_libibverbs(layout: dict[str, int]) -> None:
    assert layout["ctx.cmd_fd"] == vh.CTX_CMD_FD
    assert layout["ctx.async_fd"] == vh.CTX_ASYNC_FD
    assert layout["ctx.num_comp_vectors"] == vh.CTX_NUM_COMP_VECTORS
    assert (layout["channel.context"], layout["channel.fd"]) == (vh.CHANNEL_CONTEXT, vh.CHANNEL_FD)
    assert (
        layout["qp.context"],
        layout["qp.qp_num"],
        layout["qp.qp_type"],
    ) == (vh.QP_CONTEXT, vh.QP_NUM, vh.QP_TYPE)
    assert layout["IBV_QPT_UD"] == vh.IBV_QPT_UD
    assert ctypes.sizeof(vh._AsyncEvent) == layout["event.size"]
    assert vh._AsyncEvent.event_type.offset == layout["event.event_type"]
